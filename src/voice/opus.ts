import { LibOpus, MAX_PACKET_BYTES, OPUS_RATE, type OpusRate } from "../audio/opus.ts";

export { OPUS_RATE };

/**
 * Encodes the replies' 20 ms frames (48 kHz), in order: here at once (OpusCodec), or on the
 * conversation's audio thread, later (src/voice/audio-threads.ts). A frame whose encoder is gone
 * (its thread ended) never gets its packet.
 */
export interface FrameEncoder {
  /** `urgent`: a reply's first frame (or its first after a pause), whose time is heard: not held for batching. */
  frame(pcm: Int16Array, encoded: (opus: Buffer) => void, urgent?: boolean): void;
}
/** 20 ms at 48 kHz. */
export const FRAME_SAMPLES = 960;
export const FRAME_MS = 20;

/**
 * One conversation's Opus codec (libopus in WebAssembly): the decoder of the device's uplink, at
 * the rate its listener needs (libopus decodes any stream at 8–48 kHz itself: no resampler), and
 * the encoder of the replies at 48 kHz; each is made when first used.
 */
export class OpusCodec implements FrameEncoder {
  /** The rate the uplink decodes at. */
  readonly rate: OpusRate;
  private decoder: LibOpus | undefined;
  private encoder: LibOpus | undefined;
  private closed = false;
  /** The last good packet's table-of-contents byte, for concealment in the same mode. */
  private lastToc: number | undefined;

  constructor(rate: OpusRate = OPUS_RATE) {
    this.rate = rate;
  }

  /** Decodes one packet to samples at `rate`; undefined for a packet libopus refuses (the device's bytes). */
  decode(payload: Buffer): Int16Array | undefined {
    const codec = this.open();
    if (payload.length < 1 || payload.length > MAX_PACKET_BYTES) return undefined;
    try {
      const pcm = codec.decode(payload);
      this.lastToc = payload[0]!;
      return pcm;
    } catch {
      return undefined;
    }
  }

  /**
   * Opus's packet-loss concealment for `samples` missing samples (at `rate`): a packet of its table
   * of contents alone decodes as that packet's duration of concealment (RFC 6716 §4.4 and the
   * reference decoder); what a whole packet cannot cover is silence.
   */
  conceal(samples: number): Int16Array {
    const out = new Int16Array(samples);
    if (this.lastToc === undefined) return out;
    const codec = this.open();
    const empty = Buffer.from([this.lastToc & 0xfc]);
    let at = 0;
    while (at < samples) {
      let pcm: Int16Array;
      try {
        pcm = codec.decode(empty);
      } catch {
        break;
      }
      if (pcm.length === 0 || at + pcm.length > samples) break;
      out.set(pcm, at);
      at += pcm.length;
    }
    return out;
  }

  /** Encodes exactly one 20 ms frame of 48 kHz samples. */
  encode(frame: Int16Array): Buffer {
    if (frame.length !== FRAME_SAMPLES) throw new RangeError(`a frame has ${FRAME_SAMPLES} samples, not ${frame.length}`);
    return this.prepare().encode(frame);
  }

  /** Makes the encoder now (an audio thread does at a conversation's start, so that the first reply's first frame does not wait for it). */
  prepare(): LibOpus {
    if (this.closed) throw new Error("the codec is closed");
    if (!this.encoder) {
      const encoder = new LibOpus("voip", OPUS_RATE);
      try {
        encoder.setBitrate(32_000);
      } catch (err) {
        encoder.close();
        throw err;
      }
      this.encoder = encoder;
    }
    return this.encoder;
  }

  frame(pcm: Int16Array, encoded: (opus: Buffer) => void): void {
    encoded(this.encode(pcm));
  }

  close(): void {
    this.closed = true;
    this.decoder?.close();
    this.encoder?.close();
    this.decoder = undefined;
    this.encoder = undefined;
  }

  /** The decoder, made at the first packet (a conversation whose uplink is decoded on an audio thread makes none here). */
  private open(): LibOpus {
    if (this.closed) throw new Error("the codec is closed");
    this.decoder ??= new LibOpus("voip", this.rate);
    return this.decoder;
  }
}
