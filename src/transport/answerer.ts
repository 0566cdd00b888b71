/**
 * The WebRTC engine: answers offers with node-datachannel (the only file importing it). Every
 * connection shares one UDP port (ICE UDP mux); the answer carries every candidate (no trickle).
 */
import nodeDataChannel, { type DataChannel, type PeerConnection, type Track } from "node-datachannel";
import { type ChannelPort, type ChannelSink, CLOSE_QUIET_MS, LOW_WATER_BYTES } from "../protocol/channel.ts";
import { AUDIO_LEVEL_URI } from "../voice/rtp.ts";
import { guarded } from "./guard.ts";
import { MAX_ANSWER_BYTES, offerToApply, rewriteHostCandidates } from "./sdp.ts";

export interface AnswererOptions {
  /** The UDP port every connection shares. */
  udpPort: number;
  /** The address to bind; undefined means every interface. */
  bindAddress: string | undefined;
  /** Host candidates are rewritten to this address (the configured public address), when set. */
  publicAddress: string | undefined;
  /** How long gathering may take before the answer is given up. */
  gatherTimeoutMs: number;
}

export interface OfferToAnswer {
  sdp: string;
  audioMid: string;
  opusPayloadType: number;
  /** The audio-level header extension's id, when the device offered it: the answer accepts it. */
  audioLevelId?: number | undefined;
  /** The address the offer came from (its HTTP client): the server checks the offer's candidates there at once. */
  from?: string | undefined;
}

export type LinkState = "connected" | "failed" | "closed";

export interface AudioTrack {
  /** Sends one RTP packet; false when the track is not open. */
  send(rtp: Buffer): boolean;
  readonly payloadType: number;
  readonly ssrc: number;
  /** The audio-level header extension's id (RFC 6464), when negotiated: the device's packets may carry its level. */
  readonly audioLevelId?: number | undefined;
}

/** One answered peer connection, as the rest of the transport sees it. */
export interface PeerLink {
  readonly answer: string;
  readonly audio: AudioTrack;
  onState(cb: (state: LinkState) => void): void;
  /** Channels the device opens, labels included. */
  onChannel(cb: (port: ChannelPort) => void): void;
  /** Each RTP packet received on the audio track. */
  onRtp(cb: (packet: Buffer) => void): void;
  /** Opens a channel to the device; resolves once it is open. */
  openChannel(label: string, timeoutMs: number): Promise<ChannelPort>;
  bytes(): { rx: number; tx: number };
  /** Channels the link holds on to (open, or closing and not yet reported closed). */
  heldChannels(): number;
  /** `performance.now()` of the last thing received from the device: a channel message, RTP or RTCP, a new channel. */
  lastHeard(): number;
  /** `ip:port` of the selected remote candidate, when there is one. */
  remoteAddress(): string | undefined;
  /**
   * A callback of the library failed: `scope` "link" when it was the connection's own (its state,
   * a new channel, the audio track), which leaves it unusable; "channel" when it was one
   * channel's, which is closed.
   */
  onFault(cb: (err: unknown, scope: "link" | "channel") => void): void;
  close(): void;
}

export class AnswerError extends Error {}

/** The WebRTC stack refused the offer's SDP (the device's error, where AnswerError is this node's). */
export class InvalidOffer extends Error {}

/** The WebRTC stack could not gather this node's candidates. */
class GatherError extends AnswerError {}

/** Channel ids this side cycles through (fewer when the association has fewer streams). */
const MAX_CHANNEL_IDS = 1024;

export class Answerer {
  private readonly o: AnswererOptions;
  /** Names this answerer's peer connections (`perch-<n>`, in node-datachannel's logs): counted per answerer, one per node's transport. */
  private links = 0;
  /** An idle connection on the mux for the node's life: see `hold()`. */
  private keeper: PeerConnection | undefined;

  constructor(o: AnswererOptions) {
    this.o = o;
  }

  /**
   * Holds the UDP port for the node's life. libjuice's mux closes its socket when the last
   * connection on it goes and binds again for the next one, so between two devices the port is
   * free: a socket of this or another process (a WebRTC peer's ephemeral port) may take it, and
   * then every offer fails to gather. A child process started while the socket was open (a
   * recogniser, ffmpeg) holds a copy of it, since the library's socket is not close-on-exec: then
   * the port is never free again and every later offer fails. One idle connection that never
   * connects keeps the mux, and so the port, open: bound once, at start.
   */
  async hold(): Promise<void> {
    if (this.keeper) return;
    const pc = this.peerConnection("perch-keeper");
    this.keeper = pc;
    let timer: NodeJS.Timeout | undefined;
    try {
      const gathered = new Promise<void>((resolve, reject) => {
        timer = setTimeout(() => reject(new Error(`no candidate within ${this.o.gatherTimeoutMs} ms`)), this.o.gatherTimeoutMs);
        pc.onGatheringStateChange((state) => {
          if (state === "complete") resolve();
        });
      });
      gathered.catch(() => {});
      // A channel makes the library create its offer, and so gather on the mux (an offer with
      // nothing to negotiate aborts the process).
      pc.createDataChannel("perch-keeper");
      await gathered;
    } catch (err) {
      this.release();
      throw new Error(`cannot use UDP port ${this.o.udpPort} for WebRTC: ${(err as Error).message}`);
    } finally {
      clearTimeout(timer);
    }
    try {
      pc.onGatheringStateChange(noop);
    } catch {}
  }

  /** Lets the port go (the node is closing). */
  release(): void {
    const pc = this.keeper;
    this.keeper = undefined;
    try {
      pc?.onGatheringStateChange(noop);
      pc?.close();
    } catch {}
  }

  private peerConnection(name: string): PeerConnection {
    return new nodeDataChannel.PeerConnection(name, {
      iceServers: [],
      enableIceUdpMux: true,
      portRangeBegin: this.o.udpPort,
      portRangeEnd: this.o.udpPort,
      ...(this.o.bindAddress ? { bindAddress: this.o.bindAddress } : {}),
      maxMessageSize: 256 * 1024,
    });
  }

  /** Applies the offer and resolves with the complete answer; the link is closed on any failure. */
  async answer(offer: OfferToAnswer): Promise<PeerLink> {
    try {
      return await this.attempt(offer);
    } catch (err) {
      // Gathering on the held mux should not fail; if the library does once, it is tried again.
      if (err instanceof GatherError) return await this.attempt(offer);
      throw err;
    }
  }

  private async attempt(offer: OfferToAnswer): Promise<PeerLink> {
    const pc = this.peerConnection(`perch-${++this.links}`);
    let link: Link | undefined;
    let timer: NodeJS.Timeout | undefined;
    try {
      const ssrc = (Math.random() * 0xfffffffe + 1) >>> 0;
      // The sending track must exist before the remote description, or the device decodes nothing.
      const media = new nodeDataChannel.Audio(offer.audioMid, "SendRecv");
      media.addOpusCodec(offer.opusPayloadType);
      media.addSSRC(ssrc, "perch", "perch", "perch-audio");
      // The audio level only when the device offered it (its id as offered): its silent packets then need no decoding.
      if (offer.audioLevelId !== undefined) media.parseSdpLine(`a=extmap:${offer.audioLevelId} ${AUDIO_LEVEL_URI}`);
      const track = pc.addTrack(media);
      link = new Link(pc, track, ssrc, offer.opusPayloadType, offer.audioLevelId);
      const gathered = new Promise<void>((resolve, reject) => {
        timer = setTimeout(() => reject(new AnswerError("ICE gathering timed out")), this.o.gatherTimeoutMs);
        pc.onGatheringStateChange((state) => {
          if (state === "complete") {
            clearTimeout(timer);
            resolve();
          }
        });
      });
      gathered.catch(() => {});
      try {
        pc.setRemoteDescription(offerToApply(offer.sdp, offer.from), "offer");
      } catch (err) {
        const message = (err as Error).message;
        // Gathering this node's candidates (its UDP mux) failing is not the offer's fault.
        if (/gather|local/i.test(message)) throw new GatherError(message);
        throw new InvalidOffer(`the WebRTC stack refused the offer: ${message}`.slice(0, 300));
      }
      await gathered;
      pc.onGatheringStateChange(noop);
      const local = pc.localDescription();
      if (local?.type !== "answer") throw new AnswerError("no local answer");
      link.answer = rewriteHostCandidates(local.sdp, this.o.publicAddress);
      if (Buffer.byteLength(link.answer) > MAX_ANSWER_BYTES) throw new InvalidOffer(`the answer to this offer would be over ${MAX_ANSWER_BYTES} bytes`);
      link.setDtlsRole(/^a=setup:passive/m.test(local.sdp) ? "server" : "client");
      return link;
    } catch (err) {
      clearTimeout(timer);
      try {
        pc.onGatheringStateChange(noop);
      } catch {}
      if (link) link.close();
      else pc.close();
      throw err instanceof AnswerError || err instanceof InvalidOffer ? err : new AnswerError((err as Error).message);
    }
  }
}

class Link implements PeerLink {
  answer = "";
  readonly audio: AudioTrack;
  // Dropped at close: the library's callbacks keep this object alive, and only once the peer
  // connection object is collectable can the library release what keeps the event loop running.
  private pc: PeerConnection | undefined;
  private track: Track | undefined;
  private stateCb: ((s: LinkState) => void) | undefined;
  private channelCb: ((p: ChannelPort) => void) | undefined;
  private rtpCb: ((packet: Buffer) => void) | undefined;
  private readonly early: DataChannel[] = [];
  private readonly channels = new Set<DataChannel>();
  private closed = false;
  /** 0 when this side is the DTLS client (`a=setup:active` in its answer), 1 when the server (`passive`). */
  private parity = 0;
  private lastChannelId = -2;

  constructor(pc: PeerConnection, track: Track, ssrc: number, payloadType: number, audioLevelId: number | undefined) {
    this.pc = pc;
    this.track = track;
    this.audio = {
      send: (rtp) => {
        try {
          return this.track?.isOpen() === true && this.track.sendMessageBinary(rtp);
        } catch {
          return false; // the track closed under the send
        }
      },
      payloadType,
      ssrc,
      audioLevelId,
    };
    const linkFault = (err: unknown) => this.faulted(err, "link");
    pc.onStateChange(
      guarded(linkFault, (state: string) => {
        if (state === "connected") this.stateCb?.("connected");
        else if (state === "failed" || state === "closed") this.stateCb?.(state);
      }),
    );
    pc.onDataChannel(
      guarded(
        (err) => this.faulted(err, "channel"),
        (dc: DataChannel) => {
          this.heardAt = performance.now();
          this.channels.add(dc);
          if (!this.channelCb) return void this.early.push(dc);
          try {
            this.channelCb(this.portOf(dc));
          } catch (err) {
            closeQuietly(dc);
            throw err;
          }
        },
      ),
    );
    track.onMessage(
      guarded(linkFault, (msg: Buffer) => {
        this.heardAt = performance.now();
        // RTCP (payload types 200–204 in the second byte) shares the track; count only RTP.
        const pt = msg[1] ?? 0;
        if (pt < 200 || pt > 204) this.rtpCb?.(msg);
      }),
    );
  }

  private faultCb: ((err: unknown, scope: "link" | "channel") => void) | undefined;

  onFault(cb: (err: unknown, scope: "link" | "channel") => void): void {
    this.faultCb = cb;
  }

  private faulted(err: unknown, scope: "link" | "channel"): void {
    if (this.closed) return;
    this.faultCb?.(err, scope);
  }

  onState(cb: (state: LinkState) => void): void {
    this.stateCb = cb;
  }

  onChannel(cb: (port: ChannelPort) => void): void {
    this.channelCb = cb;
    for (const dc of this.early.splice(0)) {
      try {
        cb(this.portOf(dc));
      } catch (err) {
        this.faulted(err, "channel");
        closeQuietly(dc);
      }
    }
  }

  onRtp(cb: (packet: Buffer) => void): void {
    this.rtpCb = cb;
  }

  openChannel(label: string, timeoutMs: number): Promise<ChannelPort> {
    if (this.closed) return Promise.reject(new Error("the connection is closed"));
    const dc = this.pc!.createDataChannel(label, { id: this.nextChannelId() });
    this.channels.add(dc);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        dc.close();
        reject(new Error(`channel ${label} did not open in time`));
      }, timeoutMs);
      const failed = (err: unknown) => {
        clearTimeout(timer);
        closeQuietly(dc);
        reject(err);
      };
      dc.onOpen(
        guarded(failed, () => {
          clearTimeout(timer);
          resolve(this.portOf(dc));
        }),
      );
      dc.onClosed(
        guarded(failed, () => {
          clearTimeout(timer);
          reject(new Error(`channel ${label} closed`));
        }),
      );
    });
  }

  setDtlsRole(role: "client" | "server"): void {
    this.parity = role === "client" ? 0 : 1;
    this.lastChannelId = this.parity - 2;
  }

  /**
   * The id for a channel this side opens. libdatachannel would take the lowest free id, the one
   * just closed, while the device may still be resetting that stream: it then ignores the new
   * channel's open. Ids therefore go round all of this side's ids (RFC 8832: even for the DTLS
   * client, odd for the DTLS server; the answer's `a=setup` says which this side is), skipping
   * those in use.
   */
  private nextChannelId(): number {
    const inUse = new Set<number>();
    for (const dc of this.channels) {
      try {
        inUse.add(dc.getId());
      } catch {}
    }
    // The association's stream count (what the device offered, at most 65,535).
    const ids = Math.max(2, Math.min(MAX_CHANNEL_IDS, this.pc!.maxDataChannelId() + 1));
    for (let tries = 0; tries < ids / 2; tries++) {
      this.lastChannelId = (this.lastChannelId + 2) % ids;
      if (this.lastChannelId % 2 !== this.parity) this.lastChannelId = this.parity;
      if (!inUse.has(this.lastChannelId)) break;
    }
    return this.lastChannelId;
  }

  heldChannels(): number {
    return this.channels.size;
  }

  private heardAt = performance.now();

  lastHeard(): number {
    return this.heardAt;
  }

  bytes(): { rx: number; tx: number } {
    if (!this.pc) return { rx: 0, tx: 0 };
    return { rx: this.pc.bytesReceived(), tx: this.pc.bytesSent() };
  }

  remoteAddress(): string | undefined {
    if (!this.pc) return undefined;
    const pair = this.pc.getSelectedCandidatePair();
    if (!pair) return undefined;
    const { address, port } = pair.remote;
    return address.includes(":") ? `[${address}]:${port}` : `${address}:${port}`;
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.stateCb = undefined;
    this.channelCb = undefined;
    this.rtpCb = undefined;
    // The library's callbacks hold their functions until it reports a close, which it does not do
    // for every object closed from here: replacing them lets go of the closures (and this object).
    try {
      this.pc?.onStateChange(noop);
      this.pc?.onDataChannel(noop);
      this.track?.onMessage(noop);
      for (const dc of this.channels) {
        dc.onMessage(noop);
        dc.onClosed(noop);
        dc.onOpen(noop);
        dc.onBufferedAmountLow(noop);
      }
    } catch {}
    this.channels.clear();
    this.early.length = 0;
    try {
      this.track?.close();
    } catch {}
    // Always, even after the connection reported closed: the library leaks otherwise.
    this.pc?.close();
    this.pc = undefined;
    this.track = undefined;
  }

  private portOf(dc: DataChannel): ChannelPort {
    return portOf(
      dc,
      () => this.channels.delete(dc),
      (err) => this.faulted(err, "channel"),
      () => {
        this.heardAt = performance.now();
      },
    );
  }
}

const noop = () => {};

function isOpen(dc: DataChannel): boolean {
  try {
    return dc.isOpen();
  } catch {
    return false;
  }
}

function closeQuietly(dc: DataChannel): void {
  try {
    dc.close();
  } catch {}
}

/**
 * A channel as a port. A failure in what a message, the close or a drain calls (the stream and
 * whatever reads it) closes this channel only: the sink is told it failed, and `fault` reports it.
 */
function portOf(dc: DataChannel, forget: () => void, fault: (err: unknown) => void, heard: () => void): ChannelPort {
  let attached = false;
  return {
    label: dc.getLabel(),
    send: (data) => {
      dc.sendMessageBinary(data);
    },
    bufferedAmount: () => {
      try {
        return dc.bufferedAmount();
      } catch {
        return 0;
      }
    },
    close: () => {
      closeQuietly(dc);
      // A channel refused before it was attached reports its close to nobody: it is let go now.
      if (!attached) forget();
    },
    attach(sink: ChannelSink) {
      attached = true;
      dc.setBufferedAmountLowThreshold(LOW_WATER_BYTES);
      let lastMessage = 0;
      let failed = false;
      const fail = (err: unknown) => {
        if (failed) return;
        failed = true;
        fault(err);
        closeQuietly(dc);
        try {
          sink.failed(err instanceof Error ? err : new Error(String(err)));
        } catch {}
      };
      dc.onMessage(
        guarded(fail, (msg: string | Buffer | ArrayBuffer) => {
          if (failed) return;
          lastMessage = performance.now();
          heard();
          // The library hands each binary message over as a Buffer of its own: passed on, not copied again.
          sink.message(typeof msg === "string" ? Buffer.from(msg) : Buffer.isBuffer(msg) ? msg : Buffer.from(msg));
        }),
      );
      // The library delivers messages and the close through separate queues, so the close can
      // overtake the last messages: it is passed on once no message has arrived for a moment and
      // a turn of the event loop (whose poll phase delivers queued messages) brought none. The
      // turn matters under load, when timers run before messages that have long been waiting.
      const closeWhenQuiet: () => void = guarded(fail, () => {
        if (performance.now() - lastMessage < CLOSE_QUIET_MS) return void setTimeout(closeWhenQuiet, CLOSE_QUIET_MS);
        const seen = lastMessage;
        setImmediate(guarded(fail, () => (lastMessage === seen ? sink.closed() : closeWhenQuiet())));
      });
      let closing = false;
      const closed = guarded(fail, () => {
        if (closing) return;
        closing = true;
        forget();
        setTimeout(closeWhenQuiet, CLOSE_QUIET_MS);
      });
      dc.onClosed(closed);
      dc.onBufferedAmountLow(guarded(fail, () => sink.drained()));
      // A channel the device closed before it was attached reports no close of its own.
      if (!isOpen(dc)) closed();
    },
  };
}
