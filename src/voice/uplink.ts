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
 * A packet whose audio level (RFC 6464) is this far below full scale or further is quiet: the
 * recognition's floor of quiet (an RMS of 100 of 32767 is −50 dBov). Quiet packets are not decoded
 * while nothing louder was heard for HANGOVER_MS; the soft parts of speech are quiet too (a "th",
 * an "f" or an "h" that starts a word, a stop inside one: −50 to −60 dBov in speech at −26 dBov),
 * and are decoded by the hangover and the look-back.
 */
export const QUIET_DBOV = 50;
/** After a louder packet, every packet is decoded for this long: the soft stretches inside and between words. */
const HANGOVER_MS = 300;
/**
 * While quiet packets are not decoded, the last this long of them are held before they go on as
 * zeros; a louder packet decodes them first, so that a word's soft start is heard (the recognition
 * hands the recogniser 200 ms from before the onset). Silence reaches the listener this much later
 * then, never speech.
 */
export const LOOKBACK_MS = 200;
/** The uplink decodes everything this much longer than the longest silence that ends a turn (the detector's own lag). */
const HANGOVER_SLACK_MS = 300;

/**
 * The hangover of a listener whose turns end on a silence (a conversation's detector, a realtime
 * model's): its longest turn-ending silence and more, so that silence never waits in the look-back.
 */
export function turnHangoverMs(turn: { unfinished_silence_ms: number }): number {
  return turn.unfinished_silence_ms + HANGOVER_SLACK_MS;
}
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
  /**
   * How long after a louder packet every packet is decoded and handed on at once (default
   * HANGOVER_MS). The look-back holds quiet packets back by LOOKBACK_MS only after it: a listener
   * whose turn ends on a silence must have that silence undelayed (a conversation passes its
   * longest turn-ending silence and more).
   */
  hangoverMs?: number;
  now?: () => number;
}

/**
 * The device's microphone as the engines hear it: RTP packets → jitter buffer (on the RTP clock,
 * 48 kHz) → Opus decoding straight to the codec's rate (concealment for lost packets, silence for
 * the sender's pauses). Silence costs no decoding: DTX packets, and packets whose audio level says
 * quiet when nothing louder came for HANGOVER_MS, come out as zeros of their length (the timeline
 * is kept), the last LOOKBACK_MS of them held back in case speech follows.
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
  /**
   * RTP-clock samples still decoded whatever their level (HANGOVER_MS after a louder packet; none
   * after a DTX packet). While none are left, a loss is silence, not the concealment of older speech.
   */
  private hangover = 0;
  /** What was not decoded, not yet given out: the look-back (output samples in `heldSamples`). */
  private readonly held: Held[] = [];
  private heldSamples = 0;
  /** When the last item was held. */
  private heldAt = 0;
  private readonly lookback: number;

  constructor(o: UplinkOptions) {
    this.o = o;
    this.now = o.now ?? (() => performance.now());
    this.allowanceAt = this.now();
    this.factor = OPUS_RATE / o.codec.rate;
    this.lookback = (LOOKBACK_MS * o.codec.rate) / 1000;
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
    // The device stopped sending (a pause in its DTX, a muted microphone): what is held is silence.
    if (this.held.length > 0 && this.now() - this.heldAt >= LOOKBACK_MS) this.release(this.held.length, false);
  }

  /** Hands on everything waiting (the jitter buffer's, and the look-back as the silence it was). */
  flush(): void {
    this.jitter.flush();
    this.release(this.held.length, false);
  }

  private output(out: JitterOutput): void {
    const samples = out.kind === "packet" ? (opusPacketSamples(out.payload) ?? FRAME_SAMPLES) : out.samples;
    if (!this.allow(samples)) return;
    const n = this.length(samples);
    const dtx = out.kind === "packet" && out.payload.length <= DTX_BYTES;
    const loud = out.kind === "packet" && !dtx && (out.level === undefined || out.level < QUIET_DBOV);
    if (loud) {
      this.hangover = ((this.o.hangoverMs ?? HANGOVER_MS) * OPUS_RATE) / 1000;
      // The soft start of what is said now: decoded before it, in order (the decoder's state runs on).
      this.release(this.held.length, true);
    } else if (dtx) this.hangover = 0;
    if (this.hangover <= 0) {
      this.hold({ payload: out.kind === "packet" && !dtx ? out.payload : undefined, packet: out.kind === "packet", n });
      return;
    }
    this.hangover -= samples;
    if (out.kind === "packet") this.emit({ payload: dtx ? undefined : out.payload, packet: true, n }, true);
    else if (out.kind === "lost") this.o.pcm(this.o.codec.conceal(n));
    else this.silence(n);
  }

  /** Holds what is not decoded now; what is older than the look-back goes on as silence. */
  private hold(item: Held): void {
    this.held.push(item);
    this.heldAt = this.now();
    this.heldSamples += item.n;
    let excess = this.heldSamples - this.lookback;
    while (excess > 0) {
      const first = this.held[0]!;
      if (first.payload === undefined && !first.packet && first.n > excess) {
        // A long gap: its older part goes on now, its last part stays in the look-back.
        first.n -= excess;
        this.heldSamples -= excess;
        this.silence(excess);
        return;
      }
      this.release(1, false);
      excess = this.heldSamples - this.lookback;
    }
  }

  /** Gives out the first `count` held items, decoded or as silence. */
  private release(count: number, decode: boolean): void {
    for (const item of this.held.splice(0, count)) {
      this.heldSamples -= item.n;
      this.emit(item, decode);
    }
  }

  /** One item out: a packet decoded (when `decode` and it has audio), else silence of its length. */
  private emit(item: Held, decode: boolean): void {
    if (!decode || !item.payload) {
      if (item.packet) this.silent++;
      this.silence(item.n);
      return;
    }
    this.decoded++;
    let pcm = this.o.codec.decode(item.payload);
    if (!pcm) {
      // Concealed for as long as the packet says (the timeline the jitter buffer keeps), not a
      // whole frame: refused 2.5 ms packets would otherwise claim eight times what they cost.
      this.rejected++;
      pcm = this.o.codec.conceal(item.n);
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

/** An item of the uplink's timeline: a packet's audio (undefined: none to decode) or a gap, `n` output samples long. */
interface Held {
  payload: Buffer | undefined;
  /** It was a packet (counted decoded or silent), not a loss or a gap. */
  packet: boolean;
  n: number;
}
