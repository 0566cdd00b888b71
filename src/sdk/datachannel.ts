/**
 * The device SDK's WebRTC stack: node-datachannel (libdatachannel), the server's own. Its
 * DataChannels through the package's standard `RTCPeerConnection` (the polyfill, over a native peer
 * connection made here), its audio as a native track: the microphone's PCM encoded to 20 ms Opus
 * frames by the project's encoder and sent as RTP, the downlink's RTP decoded to PCM. libwebrtc
 * (`@roamhq/wrtc`) is no longer needed by a device: a data race in it crashed a device whose
 * connection the server ended abruptly (a block, a removal).
 */
import { randomInt } from "node:crypto";
import nodeDataChannel, { type DataChannel, type PeerConnection, type Track } from "node-datachannel";
import { LibOpus, OPUS_RATE } from "../audio/opus.ts";
import { parseRtp } from "../voice/rtp.ts";
import type { AudioSourceLike } from "./voice.ts";

/** The Opus payload type the device offers. */
export const DEVICE_OPUS_PT = 111;
const FRAME = OPUS_RATE / 50;
const BLOCK = OPUS_RATE / 100;

/** What a connection does with its audio, whichever the stack. */
export interface DeviceMedia {
  /** The microphone's input (10 ms blocks of 48 kHz PCM), made on first use. */
  source(): Promise<AudioSourceLike>;
  /** Calls `block` with each 10 ms of the downlink's decoded PCM. */
  listen(block: (samples: Int16Array, sampleRate: number) => void): void;
  /** RTP packets of the downlink received so far. */
  packetsReceived(): Promise<number>;
  close(): void;
}

/** A peer connection on node-datachannel with the device's sendrecv Opus track (mid 0), before any channel. */
export function datachannelPeer(): { pc: RTCPeerConnection; media: DeviceMedia } {
  const native = new nodeDataChannel.PeerConnection(`perch-device-${randomInt(1 << 30)}`, { iceServers: [] });
  try {
    const pc = new PeerAdapter(native) as unknown as RTCPeerConnection;
    const audio = new nodeDataChannel.Audio("0", "SendRecv");
    audio.addOpusCodec(DEVICE_OPUS_PT);
    const ssrc = randomInt(1, 0xffffffff);
    audio.addSSRC(ssrc, "perch-device", "perch-device", "perch-device-audio");
    // The microphone's level on every packet (RFC 6464), as libwebrtc's devices send it: the node
    // then skips decoding silence (voice.md §2's uplink).
    audio.parseSdpLine(`a=extmap:${AUDIO_LEVEL_ID} urn:ietf:params:rtp-hdrext:ssrc-audio-level`);
    const track = native.addTrack(audio);
    return { pc, media: new TrackMedia(track, ssrc) };
  } catch (err) {
    native.close();
    throw err;
  }
}

/**
 * The part of the standard `RTCPeerConnection` the SDK uses, over a native peer connection: its
 * channels as the package's standard `RTCDataChannel`s, its states and descriptions. Native
 * callbacks are guarded: nothing thrown in a listener escapes into the library.
 */
class PeerAdapter extends EventTarget {
  ondatachannel: ((e: { channel: RTCDataChannel }) => void) | null = null;
  private readonly native: PeerConnection;
  /** The channels, so that they live as long as the connection. */
  private readonly channels = new Set<NativeChannel>();

  constructor(native: PeerConnection) {
    super();
    this.native = native;
    const quietly = (fn: () => void) => {
      try {
        fn();
      } catch {}
    };
    native.onStateChange(() => quietly(() => this.dispatchEvent(new Event("connectionstatechange"))));
    native.onGatheringStateChange(() => quietly(() => this.dispatchEvent(new Event("icegatheringstatechange"))));
    native.onDataChannel((channel) =>
      quietly(() => {
        const dc = this.keep(new NativeChannel(channel));
        const e = Object.assign(new Event("datachannel"), { channel: dc });
        this.ondatachannel?.(e);
        this.dispatchEvent(e);
      }),
    );
  }

  get connectionState(): string {
    return this.native.state();
  }

  get iceGatheringState(): string {
    return this.native.gatheringState();
  }

  get localDescription(): { type: string; sdp: string } | null {
    const d = this.native.localDescription();
    return d ? { type: d.type, sdp: d.sdp } : null;
  }

  createDataChannel(label: string, init: { ordered?: boolean; maxRetransmits?: number } = {}): RTCDataChannel {
    const channel =
      init.ordered === false || init.maxRetransmits !== undefined
        ? this.native.createDataChannel(label, {
            unordered: init.ordered === false,
            ...(init.maxRetransmits !== undefined ? { maxRetransmits: init.maxRetransmits } : {}),
          })
        : this.native.createDataChannel(label);
    return this.keep(new NativeChannel(channel));
  }

  async setRemoteDescription(d: { type: string; sdp?: string }): Promise<void> {
    this.native.setRemoteDescription(d.sdp ?? "", d.type as "answer");
  }

  close(): void {
    try {
      this.native.close();
    } catch {}
  }

  private keep(dc: NativeChannel): RTCDataChannel {
    this.channels.add(dc);
    dc.addEventListener("close", () => this.channels.delete(dc));
    return dc as unknown as RTCDataChannel;
  }
}

/**
 * A native channel as the part of the standard `RTCDataChannel` the SDK uses. Not the package's
 * polyfill: that one loses the last messages of a channel the server closes right after writing
 * (an HTTP stream's answer) when its close is delivered first; here every message the library
 * delivers is passed on, before or after the close, and its messages are set to come first.
 */
export class NativeChannel extends EventTarget {
  onmessage: ((e: { data: ArrayBuffer | string }) => void) | null = null;
  onopen: ((e: Event) => void) | null = null;
  onclose: ((e: Event) => void) | null = null;
  onbufferedamountlow: ((e: Event) => void) | null = null;
  binaryType = "arraybuffer";
  readonly label: string;
  readonly id: number;
  private state: "connecting" | "open" | "closing" | "closed";
  private threshold = 0;
  private readonly native: DataChannel;

  constructor(native: DataChannel) {
    super();
    this.native = native;
    this.label = native.getLabel();
    this.id = native.getId();
    this.state = native.isOpen() ? "open" : "connecting";
    const quietly = (fn: () => void) => {
      try {
        fn();
      } catch {}
    };
    native.onOpen(() =>
      quietly(() => {
        this.state = "open";
        const e = new Event("open");
        this.onopen?.(e);
        this.dispatchEvent(e);
      }),
    );
    // Messages before the close: the library runs these callbacks' queues in the order they were
    // set, and after the close's callback it discards the messages not yet delivered (both waiting
    // in one turn of a busy event loop, the close set first lost the last answer before it).
    native.onMessage((message) =>
      quietly(() => {
        const data = typeof message === "string" ? message : new Uint8Array(message as Buffer).slice().buffer;
        this.onmessage?.({ data });
      }),
    );
    native.onClosed(() =>
      quietly(() => {
        if (this.state === "closed") return;
        this.state = "closed";
        const e = new Event("close");
        this.onclose?.(e);
        this.dispatchEvent(e);
      }),
    );
    native.onBufferedAmountLow(() =>
      quietly(() => {
        const e = new Event("bufferedamountlow");
        this.onbufferedamountlow?.(e);
        this.dispatchEvent(e);
      }),
    );
  }

  get readyState(): string {
    return this.state;
  }

  get bufferedAmount(): number {
    try {
      return this.native.bufferedAmount();
    } catch {
      return 0;
    }
  }

  get bufferedAmountLowThreshold(): number {
    return this.threshold;
  }

  set bufferedAmountLowThreshold(n: number) {
    this.threshold = n;
    try {
      this.native.setBufferedAmountLowThreshold(n);
    } catch {}
  }

  send(data: string | Uint8Array): void {
    if (this.state !== "open") throw new Error(`the channel ${this.label} is not open`);
    if (typeof data === "string") this.native.sendMessage(data);
    else this.native.sendMessageBinary(data);
  }

  close(): void {
    if (this.state === "closed" || this.state === "closing") return;
    this.state = "closing";
    try {
      this.native.close();
    } catch {}
  }
}

/** The id the device offers the audio-level extension under (libwebrtc's). */
const AUDIO_LEVEL_ID = 1;

/** A frame's level as RFC 6464 writes it: −dBov of its RMS, 0 (loudest) to 127 (silence). */
function audioLevel(frame: Int16Array): number {
  let sum = 0;
  for (let i = 0; i < frame.length; i++) sum += frame[i]! * frame[i]!;
  const rms = Math.sqrt(sum / frame.length) / 32_768;
  return rms <= 0 ? 127 : Math.min(127, Math.max(0, Math.round(-20 * Math.log10(rms))));
}

/** The device's audio on a native track: RTP out (Opus it encodes), RTP in (Opus it decodes). */
class TrackMedia implements DeviceMedia {
  private readonly track: Track;
  private readonly ssrc: number;
  private received = 0;
  private encoder: LibOpus | undefined;
  private decoder: LibOpus | undefined;
  private closed = false;

  constructor(track: Track, ssrc: number) {
    this.track = track;
    this.ssrc = ssrc;
  }

  async source(): Promise<AudioSourceLike> {
    if (this.closed) throw new Error("the connection is closed");
    const encoder = new LibOpus("voip", OPUS_RATE);
    encoder.setBitrate(32_000);
    this.encoder = encoder;
    let sequence = randomInt(0, 0x10000);
    let timestamp = randomInt(0, 0x100000000);
    let first = true;
    const pending = new Int16Array(FRAME);
    let filled = 0;
    const sendFrame = () => {
      if (this.closed || !this.track.isOpen()) return;
      const opus = encoder.encode(pending);
      const packet = Buffer.alloc(20 + opus.length);
      packet[0] = 0x90; // version 2, with a header extension
      packet[1] = (first ? 0x80 : 0) | DEVICE_OPUS_PT;
      packet.writeUInt16BE(sequence, 2);
      packet.writeUInt32BE(timestamp >>> 0, 4);
      packet.writeUInt32BE(this.ssrc, 8);
      // One-byte header extension (RFC 8285): the level element (id, length 1), then padding.
      packet.writeUInt32BE(0xbede0001, 12);
      packet.writeUInt32BE(((AUDIO_LEVEL_ID << 4) << 24) | (audioLevel(pending) << 16), 16);
      opus.copy(packet, 20);
      first = false;
      try {
        this.track.sendMessageBinary(packet);
      } catch {
        // The track closed under the send: the connection is ending.
      }
    };
    return {
      onData: ({ samples }) => {
        if (this.closed) return;
        let at = 0;
        while (at < samples.length) {
          const n = Math.min(FRAME - filled, samples.length - at);
          pending.set(samples.subarray(at, at + n), filled);
          filled += n;
          at += n;
          if (filled === FRAME) {
            sendFrame();
            sequence = (sequence + 1) & 0xffff;
            timestamp = (timestamp + FRAME) >>> 0;
            filled = 0;
          }
        }
      },
    };
  }

  listen(block: (samples: Int16Array, sampleRate: number) => void): void {
    this.track.onMessage((message: Buffer) => {
      // A native callback: nothing may throw out of it.
      try {
        const rtp = parseRtp(Buffer.isBuffer(message) ? message : Buffer.from(message));
        if (!rtp || rtp.payloadType !== DEVICE_OPUS_PT || this.closed) return;
        this.received++;
        this.decoder ??= new LibOpus("voip", OPUS_RATE);
        let pcm: Int16Array;
        try {
          pcm = this.decoder.decode(rtp.payload);
        } catch {
          return;
        }
        for (let at = 0; at + BLOCK <= pcm.length; at += BLOCK) block(pcm.subarray(at, at + BLOCK), OPUS_RATE);
      } catch {}
    });
  }

  async packetsReceived(): Promise<number> {
    return this.received;
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    try {
      this.track.onMessage(() => {});
    } catch {}
    this.encoder?.close();
    this.decoder?.close();
    this.encoder = undefined;
    this.decoder = undefined;
  }
}
