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
 * Files: `new FileSpeech(probabilities, duration).next(short)` gives the stretches to recognise,
 * one job at a time (see MoonshineEngine).
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
}

export type VadEvent = { type: "start"; at: number } | { type: "end"; start: number; at: number };

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
        if (p >= this.threshold) this.speechStart = this.frame;
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
 * While a conversation goes on, a file's speech is recognised in pieces of about this length: a
 * turn's transcript then waits for one such job. Speech is cut only at a pause (frames the tracker
 * counts as silence, MIN_PAUSE_FRAMES or more) between MIN_CUT and MAX_PIECE, else up to
 * PAUSE_SEARCH; speech without a pause is cut only past MAX_REGION, as when no conversation goes
 * on. A cut in a word costs words.
 */
const MAX_PIECE = 5;
const MIN_CUT = 2;
const PAUSE_SEARCH = 10;
/**
 * A pause is at least this long: Silero falls as low in a word's stop consonant for up to ~100 ms
 * ("slowly a|cross"). Measured (espeak-ng and flite, long sentences, sentences with commas and
 * without a pause between them): cutting at any silent frame, WER 0.041 while idle-mode jobs gave
 * 0.022; at pauses of 160 ms and more, 0.018.
 */
const MIN_PAUSE_FRAMES = Math.round(0.16 / FRAME_SECONDS);
/**
 * Pieces are recognised together up to this span when no conversation waits: the model does better
 * with context. Measured on the bench's espeak-ng sentences (two voices; clean, white noise at 20 dB
 * and 10 dB SNR): one sentence at a time, WER 0.06 / 0.31 / 0.48 and 0.08 / 0.29 / 0.40; merged up
 * to 5 s, 0.13 / 0.31 and 0.06 / 0.29; up to 8 s, 0.24 / 0.26 and 0.05 / 0.26; up to 12 s,
 * 0.00 / 0.18 / 0.35 and 0.06 / 0.26 / 0.50.
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
 * The speech of a file, handed out job by job: speech as the tracker finds it (with `minSilenceMs`
 * 200 ms: a pause between sentences), padded. `next(short)` gives the next job: with `short` (a
 * conversation may need the recogniser soon) pieces of about MAX_PIECE cut at pauses, each on its
 * own; otherwise stretches of up to MAX_REGION joined with neighbours up to MERGE_SPAN. Each call
 * may choose anew.
 */
export class FileSpeech {
  private readonly probabilities: Float32Array;
  private readonly spans: Region[] = [];
  private readonly silence: number;
  /** The span the next job starts in, and where in it. */
  private span = 0;
  private at = 0;

  constructor(probabilities: Float32Array, duration: number, o: VadOptions = {}) {
    this.probabilities = probabilities;
    this.silence = (o.threshold ?? 0.5) - HYSTERESIS;
    const tracker = new SpeechTracker({ minSilenceMs: 200, ...o });
    const found: Region[] = [];
    for (const e of [...tracker.push(probabilities), ...tracker.flush()]) if (e.type === "end") found.push({ start: e.start, end: e.at });
    for (const [i, s] of found.entries()) {
      // Padding never reaches past half the gap to a neighbour.
      const before = i > 0 ? Math.min(REGION_PAD, (s.start - found[i - 1]!.end) / 2) : REGION_PAD;
      const after = i < found.length - 1 ? Math.min(REGION_PAD, (found[i + 1]!.start - s.end) / 2) : REGION_PAD;
      this.spans.push({ start: Math.max(0, s.start - before), end: Math.min(duration, s.end + after) });
    }
    this.at = this.spans[0]?.start ?? 0;
  }

  /** The next stretch to recognise, or undefined when all was handed out. */
  next(short: boolean): Piece | undefined {
    if (this.span >= this.spans.length) return undefined;
    const cutBefore = this.at > this.spans[this.span]!.start;
    const region = this.take(short);
    const span = short ? MAX_PIECE : MERGE_SPAN;
    // Neighbours go in one job while they fit: the model hears more context.
    while (this.span < this.spans.length && this.spans[this.span]!.start - region.end <= MERGE_GAP) {
      const cursor = { span: this.span, at: this.at };
      const next = this.take(short);
      if (next.end - region.start > span) {
        ({ span: this.span, at: this.at } = cursor);
        break;
      }
      region.end = next.end;
    }
    return { ...region, cutBefore, cutAfter: this.span < this.spans.length && this.at > this.spans[this.span]!.start };
  }

  /** The piece from where the next job starts; moves past it. */
  private take(short: boolean): Region {
    const s = this.spans[this.span]!;
    const start = this.at;
    const end = this.cut(start, s.end, short);
    if (end < s.end) this.at = end;
    else this.at = this.spans[++this.span]?.start ?? 0;
    return { start, end };
  }

  /** Where speech from `start` to `end` is cut (`end`: not at all). */
  private cut(start: number, end: number, short: boolean): number {
    if (short && end - start > MAX_PIECE) {
      const pause = this.pause(start, start + MIN_CUT, start + MAX_PIECE, end) ?? this.pause(start, start + MAX_PIECE, start + PAUSE_SEARCH, end);
      if (pause !== undefined) return pause;
    }
    if (end - start <= MAX_REGION) return end;
    const from = Math.ceil((start + LONG_MIN_CUT) / FRAME_SECONDS);
    const to = Math.floor((start + MAX_REGION) / FRAME_SECONDS);
    let cut = to;
    for (let f = from; f < to; f++) if (this.probabilities[f]! < this.probabilities[cut]!) cut = f;
    return cut * FRAME_SECONDS;
  }

  /**
   * The middle of the longest pause in speech from `start` to `end` (a run of silent frames with
   * speech on both sides) whose middle lies in [from, to], if any.
   */
  private pause(start: number, from: number, to: number, end: number): number | undefined {
    const first = Math.ceil(start / FRAME_SECONDS);
    const stop = Math.min(this.probabilities.length, Math.floor(end / FRAME_SECONDS));
    let best: { middle: number; frames: number } | undefined;
    let run = 0;
    let spoke = false;
    for (let f = first; f < stop; f++) {
      if (this.probabilities[f]! < this.silence) {
        if (spoke) run++;
        continue;
      }
      const middle = (f - run / 2) * FRAME_SECONDS;
      if (run >= MIN_PAUSE_FRAMES && run > (best?.frames ?? 0) && middle >= from && middle <= to) best = { middle, frames: run };
      run = 0;
      spoke = true;
    }
    return best?.middle;
  }
}

/** 16-bit samples to -1..1 floats. */
export function toFloat32(pcm: Float32Array | Int16Array): Float32Array {
  if (pcm instanceof Float32Array) return pcm;
  const out = new Float32Array(pcm.length);
  for (let i = 0; i < pcm.length; i++) out[i] = pcm[i]! / 32768;
  return out;
}
