/**
 * Voice activity detection: turns Silero's per-frame speech probabilities (32 ms frames at 16 kHz)
 * into speech that starts and ends.
 *
 * Live audio (the turn detector of voice conversations):
 *
 *   const vad = engine.createVad({ minSilenceMs: 500 });
 *   for (const e of await vad.push(pcm)) {   // 16 kHz mono, Float32 (-1..1) or Int16, any length
 *     if (e.type === "start") …               // e.at: seconds from the first sample pushed
 *     if (e.type === "end") …                 // e.start, e.at: the speech's bounds
 *   }
 *   vad.flush();                              // the end of speech still open when the audio stops, if any
 *
 * Calls to `push` must not overlap (await each one). Frames are scored in the engine's VAD worker,
 * so pushing costs the event loop only the copy.
 *
 * Files: `new FileSpeech(probabilities, duration).pieces` are the stretches to recognise, one job
 * each (see MoonshineEngine).
 */
import { VAD_FRAME } from "./silero.ts";

export const VAD_SAMPLE_RATE = 16_000;
export const FRAME_SECONDS = VAD_FRAME / VAD_SAMPLE_RATE;

export interface VadOptions {
  /** A frame at or above this probability is speech. Default 0.5 (Silero's). */
  threshold?: number;
  /** Silence this long ends speech. Default 300 ms. */
  minSilenceMs?: number;
  /** Speech shorter than this (a click, a cough) is ignored. Default 150 ms. */
  minSpeechMs?: number;
  /** Also report `onset` at the first frame of possible speech and `noise` when it ends before it is speech. */
  onsets?: boolean;
}

export type VadEvent =
  | { type: "start"; at: number }
  | { type: "end"; start: number; at: number }
  | { type: "onset"; at: number }
  | { type: "noise"; at: number };

/** Silero's hysteresis: speech goes on until the probability falls this far below the threshold. */
const HYSTERESIS = 0.15;

/**
 * The state machine over frame probabilities. `start` is reported once speech has lasted
 * `minSpeechMs` (with the time it began); `end` once silence has lasted `minSilenceMs` (with the
 * time the silence began).
 */
export class SpeechTracker {
  private readonly threshold: number;
  private readonly minSilenceFrames: number;
  private readonly minSpeechFrames: number;
  private readonly onsets: boolean;
  private frame = 0;
  /** Frame where candidate or confirmed speech began. */
  private speechStart: number | undefined;
  private confirmed = false;
  /** First frame of the silence that may end the speech. */
  private silenceStart: number | undefined;

  constructor(o: VadOptions = {}) {
    this.threshold = o.threshold ?? 0.5;
    this.minSilenceFrames = Math.max(1, Math.round((o.minSilenceMs ?? 300) / 1000 / FRAME_SECONDS));
    this.minSpeechFrames = Math.max(1, Math.round((o.minSpeechMs ?? 150) / 1000 / FRAME_SECONDS));
    this.onsets = o.onsets ?? false;
  }

  /** Whether speech is going on (confirmed and not yet ended). */
  get speaking(): boolean {
    return this.confirmed;
  }

  push(probabilities: ArrayLike<number>): VadEvent[] {
    const events: VadEvent[] = [];
    for (let i = 0; i < probabilities.length; i++, this.frame++) {
      const p = probabilities[i]!;
      if (this.speechStart === undefined) {
        if (p >= this.threshold) {
          this.speechStart = this.frame;
          if (this.onsets) events.push({ type: "onset", at: this.frame * FRAME_SECONDS });
        }
        continue;
      }
      if (p >= this.threshold) this.silenceStart = undefined;
      else if (p < this.threshold - HYSTERESIS) this.silenceStart ??= this.frame;
      if (!this.confirmed && this.silenceStart === undefined && this.frame + 1 - this.speechStart >= this.minSpeechFrames) {
        this.confirmed = true;
        events.push({ type: "start", at: this.speechStart * FRAME_SECONDS });
      }
      if (this.silenceStart !== undefined && (this.frame + 1 - this.silenceStart >= this.minSilenceFrames || !this.confirmed)) {
        // Candidate speech that fell silent before it lasted is dropped at once.
        if (this.confirmed) events.push({ type: "end", start: this.speechStart * FRAME_SECONDS, at: this.silenceStart * FRAME_SECONDS });
        else if (this.onsets) events.push({ type: "noise", at: this.silenceStart * FRAME_SECONDS });
        this.speechStart = undefined;
        this.silenceStart = undefined;
        this.confirmed = false;
      }
    }
    return events;
  }

  /** Ends speech still going on at the last frame. */
  flush(): VadEvent[] {
    const events: VadEvent[] = [];
    if (this.confirmed && this.speechStart !== undefined)
      events.push({ type: "end", start: this.speechStart * FRAME_SECONDS, at: (this.silenceStart ?? this.frame) * FRAME_SECONDS });
    else if (this.onsets && this.speechStart !== undefined) events.push({ type: "noise", at: this.frame * FRAME_SECONDS });
    this.speechStart = undefined;
    this.silenceStart = undefined;
    this.confirmed = false;
    return events;
  }
}

/** Seconds. */
export interface Region {
  start: number;
  end: number;
}

/** Silence left around speech, so that the recogniser hears each word's onset and decay. */
const REGION_PAD = 0.2;
/** Moonshine is trained on utterances up to ~30 s and is best on shorter ones. */
const MAX_REGION = 20;
/** Speech longer than MAX_REGION is cut at its least speech-like frame past this length. */
const LONG_MIN_CUT = 8;
/**
 * Neighbours are recognised together up to this span: the model does better with context.
 * Measured on the bench's espeak-ng sentences (two voices; clean, white noise at 20 dB and 10 dB
 * SNR): one sentence at a time, WER 0.06 / 0.31 / 0.48 and 0.08 / 0.29 / 0.40; merged up to 5 s,
 * 0.13 / 0.31 and 0.06 / 0.29; up to 8 s, 0.24 / 0.26 and 0.05 / 0.26; up to 12 s,
 * 0.00 / 0.18 / 0.35 and 0.06 / 0.26 / 0.50. Pieces of about 5 s cut at pauses (issue 24's jobs
 * while a conversation went on) gave 0.120 where these gave 0.084 (issue 40).
 */
const MERGE_SPAN = 12;
/** …when the pause between them is at most this long (a longer one ends what is said). */
const MERGE_GAP = 1;

/** A stretch to recognise as one job; `cutBefore`/`cutAfter`: an edge where speech was cut (not a pause the tracker ended). */
export interface Piece extends Region {
  cutBefore: boolean;
  cutAfter: boolean;
}

/**
 * The speech of a file as the jobs that recognise it: speech as the tracker finds it (with
 * `minSilenceMs` 200 ms: a pause between sentences), padded; stretches of up to MAX_REGION, joined
 * with neighbours up to MERGE_SPAN. The pieces depend on the audio alone, never on the load, so
 * that a file gives the same words whatever runs beside it (jobs may then run side by side).
 */
export class FileSpeech {
  /** The jobs, in order. */
  readonly pieces: readonly Piece[];
  private readonly probabilities: Float32Array;

  constructor(probabilities: Float32Array, duration: number, o: VadOptions = {}) {
    this.probabilities = probabilities;
    const tracker = new SpeechTracker({ minSilenceMs: 200, ...o });
    const found: Region[] = [];
    for (const e of [...tracker.push(probabilities), ...tracker.flush()]) if (e.type === "end") found.push({ start: e.start, end: e.at });
    const spans: Region[] = [];
    for (const [i, s] of found.entries()) {
      // Padding never reaches past half the gap to a neighbour.
      const before = i > 0 ? Math.min(REGION_PAD, (s.start - found[i - 1]!.end) / 2) : REGION_PAD;
      const after = i < found.length - 1 ? Math.min(REGION_PAD, (found[i + 1]!.start - s.end) / 2) : REGION_PAD;
      spans.push({ start: Math.max(0, s.start - before), end: Math.min(duration, s.end + after) });
    }
    // Long spans cut into regions; a cut edge is marked on both sides.
    const regions: Piece[] = [];
    for (const s of spans) {
      for (let start = s.start; start < s.end; ) {
        const end = this.cut(start, s.end);
        regions.push({ start, end, cutBefore: start > s.start, cutAfter: end < s.end });
        start = end;
      }
    }
    // Neighbours go in one job while they fit: the model hears more context.
    const pieces: Piece[] = [];
    for (const r of regions) {
      const last = pieces.at(-1);
      if (last && !last.cutAfter && !r.cutBefore && r.start - last.end <= MERGE_GAP && r.end - last.start <= MERGE_SPAN) {
        last.end = r.end;
        last.cutAfter = r.cutAfter;
      } else pieces.push({ ...r });
    }
    this.pieces = pieces;
  }

  /** Where speech from `start` to `end` is cut (`end`: not at all). */
  private cut(start: number, end: number): number {
    if (end - start <= MAX_REGION) return end;
    const from = Math.ceil((start + LONG_MIN_CUT) / FRAME_SECONDS);
    const to = Math.floor((start + MAX_REGION) / FRAME_SECONDS);
    let cut = to;
    for (let f = from; f < to; f++) if (this.probabilities[f]! < this.probabilities[cut]!) cut = f;
    return cut * FRAME_SECONDS;
  }
}

/** 16-bit samples to -1..1 floats. */
export function toFloat32(pcm: Float32Array | Int16Array): Float32Array {
  if (pcm instanceof Float32Array) return pcm;
  const out = new Float32Array(pcm.length);
  for (let i = 0; i < pcm.length; i++) out[i] = pcm[i]! / 32768;
  return out;
}
