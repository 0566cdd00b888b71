import { JitterBuffer, type JitterOutput, type JitterStats, opusPacketSamples } from "./jitter.ts";
import type { OpusCodec } from "./opus.ts";
import { FRAME_SAMPLES, OPUS_RATE } from "./opus.ts";
import { parseRtp } from "./rtp.ts";

/** Missing packets are waited for this long before concealment. */
const JITTER_DEPTH_MS = 60;
/** A longer pause in the device's timestamps is not filled in. */
const MAX_GAP_MS = 2_000;
/**
 * Audio the device may be ahead of real time (a pause filled in, a burst after its own stall).
 * What it claims beyond that (sequence or timestamp jumps that conceal seconds per packet, a flood
 * of 120 ms packets) is dropped undecoded: decoding it would hold the event loop every device shares.
 */
const AHEAD_MS = 3_000;
/**
 * A packet whose audio level (RFC 6464) is this far below full scale or further is silence, not
 * decoded: the recognition's floor of quiet (an RMS of 100 of 32767 is −50 dBov), under which it
 * spares its detector too. Louder packets, the soft start of a word among them, are decoded.
 */
export const QUIET_DBOV = 50;
/**
 * An Opus packet this short carries no audio to decode: a discontinuous transmission's (DTX)
 * table of contents alone, which libopus would turn into comfort noise.
 */
const DTX_BYTES = 2;

export interface UplinkOptions {
  /** Its decoder's rate is the rate the samples come out at. */
  codec: OpusCodec;
  /** The payload type the device offered for Opus; other payload types are ignored. */
  payloadType: number;
  /** The extension id of the audio level (RFC 6464), when the device negotiated it. */
  audioLevelId?: number | undefined;
  /** The device's audio at the codec's rate, in order, with nothing missing. */
  pcm: (samples: Int16Array) => void;
  /** Silence of `samples` at the codec's rate, in its place among `pcm`'s (default: zeros given to `pcm`). */
  silence?: (samples: number) => void;
  /** Samples (48 kHz) dropped for running ahead of real time, as they are dropped. */
  overrun?: (samples: number) => void;
  now?: () => number;
}

/**
 * The device's microphone as the engines hear it: RTP packets → jitter buffer (on the RTP clock,
 * 48 kHz) → Opus decoding straight to the codec's rate (concealment for lost packets, silence for
 * the sender's pauses). Silence costs no decoding: DTX packets and packets whose audio level says
 * silence come out as zeros of their length, so the timeline is kept.
 */
export class Uplink {
  readonly jitter: JitterBuffer;
  /** Packets that were not Opus RTP of the offered payload type, or that libopus refused. */
  rejected = 0;
  /** Samples (48 kHz) dropped for running ahead of real time. */
  dropped = 0;
  /** Packets not decoded because they were silence (DTX, or an audio level under QUIET_DBOV). */
  silent = 0;
  /** Packets decoded. */
  decoded = 0;
  private readonly o: UplinkOptions;
  private ssrc: number | undefined;
  private readonly now: () => number;
  /** Samples the device may still send ahead of real time (refilled at real time, up to AHEAD_MS). */
  private allowance = (AHEAD_MS * OPUS_RATE) / 1000;
  private allowanceAt: number;
  /** 48 kHz samples per output sample. */
  private readonly factor: number;
  /** RTP-clock samples not yet given out (a gap that is not a whole number of output samples). */
  private carry = 0;
  /** The last packet was silence: a loss right after it is silence too, not the concealment of older speech. */
  private quiet = false;
  /** The last silent packet that had audio, decoded before the next loud one so that the decoder's state runs on. */
  private warm: Buffer | undefined;

  constructor(o: UplinkOptions) {
    this.o = o;
    this.now = o.now ?? (() => performance.now());
    this.allowanceAt = this.now();
    this.factor = OPUS_RATE / o.codec.rate;
    this.jitter = new JitterBuffer({
      depthMs: JITTER_DEPTH_MS,
      frameSamples: FRAME_SAMPLES,
      clockRate: OPUS_RATE,
      maxGapMs: MAX_GAP_MS,
      ...(o.now ? { now: o.now } : {}),
      output: (out) => this.output(out),
    });
  }

  get stats(): JitterStats & { rejected: number; dropped: number; silent: number; decoded: number } {
    return { ...this.jitter.stats, rejected: this.rejected, dropped: this.dropped, silent: this.silent, decoded: this.decoded };
  }

  /** One packet from the track (RTP or RTCP); never throws for what the device sends. */
  packet(bytes: Buffer): void {
    const rtp = parseRtp(bytes, this.o.audioLevelId);
    if (!rtp || rtp.payloadType !== this.o.payloadType) {
      if (rtp) this.rejected++;
      return;
    }
    // A new source (the device restarted its sender) starts a new timeline.
    if (this.ssrc !== undefined && rtp.ssrc !== this.ssrc) this.jitter.restart();
    this.ssrc = rtp.ssrc;
    this.jitter.push(rtp);
  }

  /** Releases what waited too long; call every 20 ms or so. */
  tick(): void {
    this.jitter.tick();
  }

  private output(out: JitterOutput): void {
    const { codec } = this.o;
    const samples = out.kind === "packet" ? (opusPacketSamples(out.payload) ?? FRAME_SAMPLES) : out.samples;
    if (!this.allow(samples)) return;
    const n = this.length(samples);
    let pcm: Int16Array | undefined;
    if (out.kind === "packet") {
      if (out.payload.length <= DTX_BYTES || (out.level !== undefined && out.level >= QUIET_DBOV)) {
        this.silent++;
        this.quiet = true;
        this.warm = out.payload.length > DTX_BYTES ? out.payload : undefined;
        this.silence(n);
        return;
      } else {
        if (this.warm) codec.decode(this.warm);
        this.warm = undefined;
        this.quiet = false;
        this.decoded++;
        pcm = codec.decode(out.payload);
        if (!pcm) {
          // Concealed for as long as the packet says (the timeline the jitter buffer keeps), not a
          // whole frame: refused 2.5 ms packets would otherwise claim eight times what they cost.
          this.rejected++;
          pcm = codec.conceal(n);
        }
      }
    } else if (out.kind === "lost" && !this.quiet) pcm = codec.conceal(n);
    else {
      this.silence(n);
      return;
    }
    if (pcm.length > 0) this.o.pcm(pcm);
  }

  private silence(samples: number): void {
    if (samples <= 0) return;
    if (this.o.silence) this.o.silence(samples);
    else this.o.pcm(new Int16Array(samples));
  }

  /** Output samples for `samples` of the RTP clock, carrying what does not divide evenly. */
  private length(samples: number): number {
    const total = this.carry + samples;
    const n = Math.floor(total / this.factor);
    this.carry = total - n * this.factor;
    return n;
  }

  /** Takes `samples` from the allowance; false (and counted dropped) when the device is too far ahead of real time. */
  private allow(samples: number): boolean {
    const now = this.now();
    const max = (AHEAD_MS * OPUS_RATE) / 1000;
    this.allowance = Math.min(max, this.allowance + ((now - this.allowanceAt) * OPUS_RATE) / 1000);
    this.allowanceAt = now;
    if (samples <= this.allowance) {
      this.allowance -= samples;
      return true;
    }
    this.dropped += samples;
    this.o.overrun?.(samples);
    return false;
  }
}
