import { LibOpus, MAX_PACKET_BYTES, OPUS_RATE } from "../audio/opus.ts";

export { OPUS_RATE };
/** 20 ms at 48 kHz. */
export const FRAME_SAMPLES = 960;
export const FRAME_MS = 20;

/**
 * One conversation's Opus codec (libopus in WebAssembly): the decoder of the device's uplink and
 * the encoder of the replies, created together and freed together.
 */
export class OpusCodec {
  private codec: LibOpus | undefined;
  /** The last good packet's table-of-contents byte, for concealment in the same mode. */
  private lastToc: number | undefined;

  constructor() {
    this.codec = new LibOpus("voip");
    this.codec.setBitrate(32_000);
  }

  /** Decodes one packet to 48 kHz samples; undefined for a packet libopus refuses (the device's bytes). */
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
   * Opus's packet-loss concealment for `samples` missing samples: a packet of its table of contents
   * alone decodes as that packet's duration of concealment (RFC 6716 §4.4 and the reference
   * decoder); what a whole packet cannot cover is silence.
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
    return this.open().encode(frame);
  }

  close(): void {
    this.codec?.close();
    this.codec = undefined;
  }

  private open(): LibOpus {
    if (!this.codec) throw new Error("the codec is closed");
    return this.codec;
  }
}
