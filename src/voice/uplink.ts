import type { Resampler } from "../audio/resampler.ts";
import { JitterBuffer, type JitterStats, opusPacketSamples } from "./jitter.ts";
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

export interface UplinkOptions {
  codec: OpusCodec;
  /** 48 kHz → the engines' rate. */
  resampler: Resampler;
  /** The payload type the device offered for Opus; other payload types are ignored. */
  payloadType: number;
  /** The device's audio at the engines' rate, in order, with nothing missing. */
  pcm: (samples: Int16Array) => void;
  /** Samples (48 kHz) dropped for running ahead of real time, as they are dropped. */
  overrun?: (samples: number) => void;
  now?: () => number;
}

/**
 * The device's microphone as the engines hear it: RTP packets → jitter buffer → Opus decoding
 * (concealment for lost packets, silence for the sender's pauses) → the engines' sample rate.
 */
export class Uplink {
  readonly jitter: JitterBuffer;
  /** Packets that were not Opus RTP of the offered payload type, or that libopus refused. */
  rejected = 0;
  private readonly o: UplinkOptions;
  /** Samples (48 kHz) dropped for running ahead of real time. */
  dropped = 0;
  private ssrc: number | undefined;
  private readonly now: () => number;
  /** Samples the device may still send ahead of real time (refilled at real time, up to AHEAD_MS). */
  private allowance = (AHEAD_MS * OPUS_RATE) / 1000;
  private allowanceAt: number;

  constructor(o: UplinkOptions) {
    this.o = o;
    this.now = o.now ?? (() => performance.now());
    this.allowanceAt = this.now();
    this.jitter = new JitterBuffer({
      depthMs: JITTER_DEPTH_MS,
      frameSamples: FRAME_SAMPLES,
      clockRate: OPUS_RATE,
      maxGapMs: MAX_GAP_MS,
      ...(o.now ? { now: o.now } : {}),
      output: (out) => {
        const samples = out.kind === "packet" ? (opusPacketSamples(out.payload) ?? FRAME_SAMPLES) : out.samples;
        if (!this.allow(samples)) return;
        let pcm: Int16Array | undefined;
        if (out.kind === "packet") {
          pcm = o.codec.decode(out.payload);
          if (!pcm) {
            // Concealed for as long as the packet says (the timeline the jitter buffer keeps), not a
            // whole frame: refused 2.5 ms packets would otherwise claim eight times what they cost.
            this.rejected++;
            pcm = o.codec.conceal(samples);
          }
        } else if (out.kind === "lost") pcm = o.codec.conceal(out.samples);
        else pcm = new Int16Array(out.samples);
        const resampled = o.resampler.process(pcm);
        if (resampled.length > 0) o.pcm(resampled);
      },
    });
  }

  get stats(): JitterStats & { rejected: number; dropped: number } {
    return { ...this.jitter.stats, rejected: this.rejected, dropped: this.dropped };
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

  /** One packet from the track (RTP or RTCP); never throws for what the device sends. */
  packet(bytes: Buffer): void {
    const rtp = parseRtp(bytes);
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
}
