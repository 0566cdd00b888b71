/**
 * A light simulated device for the WebRTC crowd: node-datachannel's native API instead of
 * `@roamhq/wrtc` (whose connections each cost a libwebrtc stack and half a second of gathering).
 * node-datachannel's standard polyfill cannot stand in for wrtc under the device SDK: its
 * `addTransceiver` throws "Not implemented", and the contract's offer needs the audio section.
 *
 * It does what a device must and little more: a sendrecv Opus audio section (`audio`: raw RTP
 * packets sent and received on it by whoever uses it; the WebRTC crowd sends nothing),
 * the packet channel, the event stream, a sealed offer, Peer RPC answers for the server's calls
 * (`all.*`; −32601 for `client.*`) and telemetry packets.
 */
import nodeDataChannel, { type DataChannel, type PeerConnection, type Track } from "node-datachannel";
import { decodeKey, encodeKey, type KeyPair, privateKeyObject, sharedSecret } from "../src/crypto/keys.ts";
import { SealedExchange, SIGNALING_PATH } from "../src/crypto/sealed-offer.ts";
import { type ChannelPort, ChannelStream, LOW_WATER_BYTES, PACKET_LABEL, SERVICE, SERVICE_PREFIX, serviceId } from "../src/protocol/channel.ts";
import { RpcMethod } from "../src/protocol/gen/rpc_pb.ts";
import { callRpc, commonHandlers, rpcPayload, serveRpc } from "../src/protocol/rpc.ts";
import { EventReader } from "../src/sdk/voice.ts";
import { OfferError } from "../src/sdk/webrtc.ts";

const OPUS_PAYLOAD_TYPE = 111;
let counter = 0;

export interface CrowdConnectOptions {
  baseUrl: string;
  /** The server's public key, base58 (from `/server-info`). */
  serverPublicKey: string;
  keyPair: KeyPair;
  /** Local address to gather on (the server's, on loopback): fewer candidates, no other interfaces. */
  bindAddress?: string;
  timeoutMs?: number;
  /** Offer the RTP audio-level header extension (RFC 6464) as libwebrtc does, under id 1 (AUDIO_LEVEL_ID). */
  audioLevel?: boolean;
}

/** The id a crowd device offers the audio-level extension under (libwebrtc's). */
export const AUDIO_LEVEL_ID = 1;

function portOf(dc: DataChannel): ChannelPort {
  return {
    label: dc.getLabel(),
    send: (data) => void dc.sendMessageBinary(data),
    bufferedAmount: () => {
      try {
        return dc.bufferedAmount();
      } catch {
        return 0;
      }
    },
    close: () => {
      try {
        dc.close();
      } catch {}
    },
    attach(sink) {
      dc.setBufferedAmountLowThreshold(LOW_WATER_BYTES);
      dc.onMessage((msg) => sink.message(typeof msg === "string" ? Buffer.from(msg) : Buffer.from(msg as ArrayBuffer)));
      // Messages and the close arrive through separate queues: let the last messages go first.
      dc.onClosed(() => void setTimeout(() => sink.closed(), 20));
      dc.onBufferedAmountLow(() => sink.drained());
    },
  };
}

function opened(dc: DataChannel, timeoutMs: number): Promise<void> {
  if (dc.isOpen()) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${dc.getLabel()} did not open within ${timeoutMs} ms`)), timeoutMs);
    dc.onOpen(() => {
      clearTimeout(timer);
      resolve();
    });
    dc.onClosed(() => {
      clearTimeout(timer);
      reject(new Error(`${dc.getLabel()} closed`));
    });
  });
}

/** A connected crowd device. */
export class CrowdDevice {
  readonly publicKey: string;
  /** Client-measured milliseconds: offer answered, and event stream and packet channel open. */
  readonly timings: { offer: number; ready: number; serverTiming: string };
  /** The audio section's track: RTP in and out, SSRC `ssrc`, payload type 111 (bench/capacity-worker.ts). */
  readonly audio: Track;
  readonly ssrc: number;
  private pc: PeerConnection | undefined;
  private readonly packets: DataChannel;
  private closedCb: (() => void) | undefined;
  private ended = false;
  /** The server's events on service 32 (voice events, `node.reconnect`). */
  readonly eventStream = new EventReader();
  private readonly closedPromise: Promise<void>;
  private markClosed: () => void = () => {};

  constructor(
    pc: PeerConnection,
    publicKey: string,
    packets: DataChannel,
    events: DataChannel,
    timings: CrowdDevice["timings"],
    audio: { track: Track; ssrc: number },
  ) {
    this.pc = pc;
    this.audio = audio.track;
    this.ssrc = audio.ssrc;
    this.publicKey = publicKey;
    this.packets = packets;
    this.timings = timings;
    this.closedPromise = new Promise((resolve) => (this.markClosed = resolve));
    const end = () => {
      if (this.ended) return;
      this.ended = true;
      this.closedCb?.();
      this.close();
    };
    // The server closing the event stream ends the connection.
    events.onClosed(end);
    events.onMessage((msg) => {
      if (typeof msg !== "string") this.eventStream.push(new Uint8Array(msg as ArrayBuffer));
    });
    pc.onStateChange((state) => {
      if (state === "failed" || state === "closed" || state === "disconnected") end();
    });
    pc.onDataChannel((dc) => this.incoming(dc));
  }

  /** Streams the server opens: its RPC calls (`client.info.get`, `client.identifiers.get`). */
  private incoming(dc: DataChannel): void {
    if (serviceId(dc.getLabel()) !== SERVICE.RPC) {
      dc.close();
      return;
    }
    void serveRpc(new ChannelStream(portOf(dc)), commonHandlers());
  }

  get open(): boolean {
    return !this.ended && this.packets.isOpen();
  }

  /** Sends one packet on the unreliable packet channel; false when it could not be queued. */
  send(packet: Buffer): boolean {
    if (this.ended) return false;
    try {
      return this.packets.sendMessageBinary(packet);
    } catch {
      return false;
    }
  }

  onClosed(cb: () => void): void {
    this.closedCb = cb;
  }

  /** `all.ping` over a new stream 0 (the reconnect layer's liveness probe). */
  async ping(): Promise<void> {
    const pc = this.pc;
    if (!pc || this.ended) throw new Error("closed");
    const dc = pc.createDataChannel(`${SERVICE_PREFIX}${SERVICE.RPC}`);
    await opened(dc, 5_000);
    await callRpc(new ChannelStream(portOf(dc)), RpcMethod.ALL_PING, rpcPayload.ping(), { timeoutMs: 5_000 });
  }

  /** Resolves once the connection ended (either side). */
  closed(): Promise<void> {
    return this.closedPromise;
  }

  close(): void {
    this.ended = true;
    this.markClosed();
    const pc = this.pc;
    this.pc = undefined;
    if (!pc) return;
    try {
      pc.onStateChange(() => {});
      pc.onDataChannel(() => {});
      pc.close();
    } catch {}
  }

  /** Offers, posts the sealed offer, applies the answer and waits for the event stream and packet channel. */
  static async connect(o: CrowdConnectOptions): Promise<CrowdDevice> {
    const started = performance.now();
    const timeoutMs = o.timeoutMs ?? 15_000;
    const publicKey = encodeKey(o.keyPair.publicKey);
    const pc = new nodeDataChannel.PeerConnection(`crowd-${process.pid}-${++counter}`, {
      iceServers: [],
      disableAutoNegotiation: true,
      ...(o.bindAddress ? { bindAddress: o.bindAddress } : {}),
    });
    const states: string[] = [];
    pc.onStateChange((state) => states.push(`${state}@${Math.round(performance.now() - started)}`));
    pc.onIceStateChange((state) => states.push(`ice-${state}@${Math.round(performance.now() - started)}`));
    try {
      const audio = new nodeDataChannel.Audio("0", "SendRecv");
      audio.addOpusCodec(OPUS_PAYLOAD_TYPE);
      const ssrc = (Math.random() * 0xfffffffe + 1) >>> 0;
      audio.addSSRC(ssrc, "crowd", "crowd", "crowd-audio");
      if (o.audioLevel) audio.parseSdpLine(`a=extmap:${AUDIO_LEVEL_ID} urn:ietf:params:rtp-hdrext:ssrc-audio-level`);
      const track = pc.addTrack(audio);
      const packets = pc.createDataChannel(PACKET_LABEL, { unordered: true, maxRetransmits: 0 });
      const events = pc.createDataChannel(`${SERVICE_PREFIX}${SERVICE.EVENTS}`);
      const eventsOpen = opened(events, timeoutMs);
      const packetsOpen = opened(packets, timeoutMs);
      eventsOpen.catch(() => {});
      packetsOpen.catch(() => {});
      const gathered = new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error("gathering timed out")), timeoutMs);
        pc.onGatheringStateChange((state) => {
          if (state === "complete") {
            clearTimeout(timer);
            resolve();
          }
        });
      });
      pc.setLocalDescription("offer");
      await gathered;
      const offer = pc.localDescription();
      if (!offer) throw new Error("no local offer");
      const shared = sharedSecret(privateKeyObject(o.keyPair.privateKey), decodeKey(o.serverPublicKey));
      const exchange = SealedExchange.create(shared, publicKey, Math.floor(Date.now() / 1000));
      const res = await fetch(`${o.baseUrl}${SIGNALING_PATH}`, {
        method: "POST",
        headers: { "content-type": "application/octet-stream", ...exchange.headers() },
        body: new Uint8Array(exchange.sealRequest(offer.sdp)),
        signal: AbortSignal.timeout(timeoutMs),
      });
      const body = new Uint8Array(await res.arrayBuffer());
      if (res.status !== 200) {
        let code = "UNKNOWN";
        try {
          code = (JSON.parse(Buffer.from(body).toString()) as { error: { code: string } }).error.code;
        } catch {}
        throw new OfferError(res.status, code, `offer refused: ${res.status} ${Buffer.from(body).toString().slice(0, 200)}`, res.headers);
      }
      const offerMs = performance.now() - started;
      pc.setRemoteDescription(exchange.openResponse(body), "answer");
      await Promise.all([eventsOpen, packetsOpen]);
      return new CrowdDevice(
        pc,
        publicKey,
        packets,
        events,
        {
          offer: offerMs,
          ready: performance.now() - started,
          serverTiming: res.headers.get("server-timing") ?? "",
        },
        { track, ssrc },
      );
    } catch (err) {
      try {
        pc.close();
      } catch {}
      if (err instanceof OfferError) throw err;
      throw new Error(`${(err as Error).message} (states: ${states.join(" ")})`);
    }
  }
}
