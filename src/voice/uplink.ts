import { JitterBuffer, type JitterStats } from "./jitter.ts";
import type { OpusCodec } from "./opus.ts";
import { FRAME_SAMPLES, OPUS_RATE } from "./opus.ts";
import type { Resampler } from "./resampler.ts";
import { parseRtp } from "./rtp.ts";

/** Missing packets are waited for this long before concealment. */
const JITTER_DEPTH_MS = 60;
/** A longer pause in the device's timestamps is not filled in. */
const MAX_GAP_MS = 2_000;

export interface UplinkOptions {
  codec: OpusCodec;
  /** 48 kHz → the engines' rate. */
  resampler: Resampler;
  /** The payload type the device offered for Opus; other payload types are ignored. */
  payloadType: number;
  /** The device's audio at the engines' rate, in order, with nothing missing. */
  pcm: (samples: Int16Array) => void;
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
  private ssrc: number | undefined;

  constructor(o: UplinkOptions) {
    this.o = o;
    this.jitter = new JitterBuffer({
      depthMs: JITTER_DEPTH_MS,
      frameSamples: FRAME_SAMPLES,
      clockRate: OPUS_RATE,
      maxGapMs: MAX_GAP_MS,
      ...(o.now ? { now: o.now } : {}),
      output: (out) => {
        let pcm: Int16Array | undefined;
        if (out.kind === "packet") {
          pcm = o.codec.decode(out.payload);
          if (!pcm) {
            this.rejected++;
            pcm = o.codec.conceal(FRAME_SAMPLES);
          }
        } else if (out.kind === "lost") pcm = o.codec.conceal(out.samples);
        else pcm = new Int16Array(out.samples);
        const resampled = o.resampler.process(pcm);
        if (resampled.length > 0) o.pcm(resampled);
      },
    });
  }

  get stats(): JitterStats & { rejected: number } {
    return { ...this.jitter.stats, rejected: this.rejected };
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
