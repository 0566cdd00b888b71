import { concatInt16 } from "../audio/samples.ts";
import type { VoiceClock } from "./clock.ts";
import { RECOGNITION_RATE, type TurnTranscription, type VadEvent, type VoiceActivity } from "./engine-ports.ts";

const RATE = RECOGNITION_RATE;
/** Audio kept from before speech was confirmed, so that the recogniser hears the turn's first word. */
const PREROLL_S = 1.2;
/** Speech begins this long before the detector says (its onset). */
const ONSET_PAD_S = 0.2;
/** Audio waiting for the detector beyond this (the engine is overloaded) is dropped, not queued without bound. */
const MAX_PENDING_SAMPLES = 4 * RATE;
/** Quiet: below this share of the turn's loudest chunk, or below this floor (of 32767). */
const QUIET_SHARE = 0.1;
const QUIET_FLOOR = 100;
/** Near-digital silence longer than this between turns is not given to the detector. */
const SKIP_QUIET_AFTER_S = 0.5;
/** Audio heard this recently that is not quiet is sound going on (the end of a turn waits for it). */
const SOUNDING_MS = 60;
/** Quiet this long tells the transcription that the turn may be ending (it may start recognising). */
const QUIET_BEFORE_RECOGNITION_S = 0.12;

/** A turn being heard: its transcription receives the turn's audio. */
export interface ListeningTurn {
  readonly transcription: TurnTranscription;
  /** When sound (audio that is not quiet) was last heard in the turn (clock); kept by the recognition. */
  soundAt: number;
}

/** How the end of a turn was decided, on the conversation's clock. */
export interface TurnEnd {
  /** When the last voiced audio was heard. */
  lastVoiced: number;
  /** When the end of the turn was decided. */
  decided: number;
  /** The turn reached `max_ms` and ended there (the speech that goes on after it is not a turn). */
  cut: boolean;
}

export interface RecognitionHooks<T extends ListeningTurn> {
  /**
   * Voice activity's first frames (at `at` on the clock), between turns: speech may be starting
   * (`speechStarted` follows once it lasts `min_speech_ms`), or a noise (`voiceGone` follows).
   * Only from a detector created with `onsets`.
   */
  voiceOnset?(at: number): void;
  /** The activity of `voiceOnset` ended before it was speech. */
  voiceGone?(): void;
  /** Speech began (its onset at `onset` on the clock): a turn to hear it, or undefined to ignore this speech until it ends. */
  speechStarted(onset: number): T | undefined;
  /** The silence (ms) that ends `turn` now that its words so far are `text` (undefined: being recognised; asked again when known). */
  silenceNeeded(turn: T, text: string | undefined): number;
  /** The user has been quiet `preemptive_after_ms` and said `text` so far (once per quiet stretch). */
  paused(turn: T, text: string): void;
  /** Speech went on after a pause: the turn goes on. */
  resumed(turn: T): void;
  speechEnded(turn: T, end: TurnEnd): void;
}

export interface RecognitionOptions<T extends ListeningTurn> {
  /** Created with `minSilenceMs` = `turn.finished_silence_ms`, the shortest silence that can end a turn. */
  vad: VoiceActivity;
  turn: { silence_ms: number; finished_silence_ms: number; preemptive_after_ms: number; max_ms: number };
  clock: VoiceClock;
  hooks: RecognitionHooks<T>;
  /** Something went wrong that the conversation survives (logged by the caller, rate-limited where it could repeat). */
  warn: (what: string, details: Record<string, unknown>) => void;
}

/**
 * The uplink as turns (agents-js's audio recognition): 16 kHz audio → the voice activity detector
 * (its backlog bounded, near-digital silence between turns spared) → turns, each with the audio
 * from just before its onset given to its transcription, a pause hint when the user goes quiet
 * (with the words so far, asked of the transcription), and an end: once the detector heard the
 * speech stop (or no audio came at all: a device that stops sending), the silence the hooks ask
 * for the words so far (voice.md §7: shorter after finished-looking words, longer after unfinished
 * ones); speech before then continues the turn. `max_ms` ends it regardless.
 */
export class AudioRecognition<T extends ListeningTurn> {
  private readonly o: RecognitionOptions<T>;
  /** Samples pushed to the detector; with `pushedAt`, maps the timeline to the clock. */
  private timeline = 0;
  private pushedAt: number;
  /** When audio last arrived from the uplink. */
  private heardAt: number;
  /** Samples not given to the detector (silence between turns): its seconds + this = our timeline. */
  private vadSkipped = 0;
  /** Samples of near-digital silence in a row, up to now. */
  private quietRun = 0;
  /** The detector is inside speech (whether or not a turn was started for it). */
  private vadSpeaking = false;
  /** The detector reported an onset, and neither speech nor a noise yet. */
  private onsetPending = false;
  private readonly pending: Int16Array[] = [];
  private pendingSamples = 0;
  private draining = false;
  private dropped = 0;
  /** The last PREROLL_S of audio, as [start sample, samples]. */
  private readonly recent: Array<[number, Int16Array]> = [];
  private turn: Heard<T> | undefined;
  /** Speech that is not a turn (refused by the hooks, or going on past a cut): ignored until it ends. */
  private ignoring = false;
  /** Where the last turn was cut (timeline samples): speech going on from there is not a new turn. */
  private cutAt: number | undefined;
  private closed = false;

  constructor(o: RecognitionOptions<T>) {
    this.o = o;
    this.pushedAt = o.clock.now();
    this.heardAt = this.pushedAt;
  }

  /** Samples dropped because the detector was behind, since the last call (for a rate-limited log). */
  takeDropped(): number {
    const n = this.dropped;
    this.dropped = 0;
    return n;
  }

  /** 16 kHz audio from the uplink, in order. */
  hear(pcm: Int16Array): void {
    if (this.closed) return;
    this.heardAt = this.o.clock.now();
    if (this.pendingSamples + pcm.length > MAX_PENDING_SAMPLES) {
      this.dropped += pcm.length;
      return;
    }
    this.pending.push(pcm);
    this.pendingSamples += pcm.length;
    if (!this.draining) this.drain().catch((err: unknown) => this.o.warn("voice audio handling failed", { err }));
  }

  /**
   * Silence of `samples` from the uplink (DTX, a packet whose audio level says silence): heard as
   * zeros; between turns, once the detector is spared quiet (the energy gate), with no more work
   * than the timeline's and the pre-roll's bookkeeping.
   */
  silence(samples: number): void {
    if (this.closed || samples <= 0) return;
    const gated = !this.draining && this.pending.length === 0 && !this.turn && !this.vadSpeaking && this.quietRun > SKIP_QUIET_AFTER_S * RATE;
    if (!gated) {
      this.hear(new Int16Array(samples));
      return;
    }
    // What drain() does with quiet between turns, without its batch, its loudness and its promise.
    this.heardAt = this.o.clock.now();
    const start = this.timeline;
    this.timeline += samples;
    this.pushedAt = this.heardAt;
    this.remember(start, new Int16Array(samples));
    this.quietRun += samples;
    this.vadSkipped += samples;
  }

  /**
   * The conversation's clock: no audio at all for `silence_ms` while speech goes on is silence (a
   * device that stopped sending: push-to-talk, discontinuous transmission, a muted microphone).
   */
  tick(): void {
    if (this.closed || this.draining || !(this.vadSpeaking || this.onsetPending)) return;
    if (this.o.clock.now() - this.heardAt < this.o.turn.finished_silence_ms) return;
    // (An onset not yet speech ends as a noise: a reply paused at it goes on.)
    for (const e of this.o.vad.flush()) this.vadEvent(e);
    // The detector may not have confirmed the end (its own speech state): either way, speech is over.
    this.vadSpeaking = false;
    this.onsetPending = false;
  }

  close(): void {
    this.closed = true;
    this.turn?.stopTimers();
    this.turn = undefined;
    this.pending.length = 0;
    this.recent.length = 0;
  }

  private async drain(): Promise<void> {
    this.draining = true;
    try {
      while (this.pending.length > 0 && !this.closed) {
        // Everything that arrived while the detector worked goes in one push: under load the
        // batches grow instead of the backlog.
        const pcm = concatInt16(this.pending.splice(0));
        this.pendingSamples = 0;
        const start = this.timeline;
        this.timeline += pcm.length;
        this.pushedAt = this.o.clock.now();
        this.remember(start, pcm);
        this.turn?.turn.transcription.push(pcm);
        let events: VadEvent[] = [];
        this.quietRun = rms(pcm) < QUIET_FLOOR ? this.quietRun + pcm.length : 0;
        try {
          // Near-digital silence between turns (half a second of it and more) cannot start speech:
          // the neural detector is spared it. Its clock then runs behind ours by what it skipped.
          if (!this.turn && !this.vadSpeaking && this.quietRun > SKIP_QUIET_AFTER_S * RATE) this.vadSkipped += pcm.length;
          else events = await this.o.vad.push(pcm);
        } catch (err) {
          this.o.warn("voice activity detection failed", { err });
        }
        if (this.closed) return;
        for (const e of events) this.vadEvent(e);
        const turn = this.turn;
        if (turn && this.turn === turn && this.timeline - turn.start >= (this.o.turn.max_ms / 1000) * RATE) {
          this.cutAt = this.timeline;
          for (const e of this.o.vad.flush()) this.vadEvent(e, true);
          if (this.turn === turn) this.end(turn, true);
        } else if (turn && this.turn === turn) this.listen(turn, pcm);
      }
    } finally {
      this.draining = false;
    }
  }

  private remember(start: number, pcm: Int16Array): void {
    this.recent.push([start, pcm]);
    while (this.recent.length > 0 && this.recent[0]![0] + this.recent[0]![1].length < this.timeline - PREROLL_S * RATE) this.recent.shift();
  }

  /** Our timeline position (samples) of a detector time (seconds from the first sample it was given). */
  private position(vadSeconds: number): number {
    return vadSeconds * RATE + this.vadSkipped;
  }

  /** The clock time of a timeline position (samples). */
  private clockAt(position: number): number {
    return this.pushedAt - ((this.timeline - position) / RATE) * 1000;
  }

  /** The detector hears voice now: speech, or an onset not yet judged (a drain waits for it: fleet.md §3). */
  get hearing(): boolean {
    return this.vadSpeaking || this.onsetPending;
  }

  private vadEvent(e: VadEvent, cut = false): void {
    this.onsetPending = e.type === "onset";
    if (e.type === "onset" || e.type === "noise") {
      // Between turns only: inside one, the detector's pauses and new onsets are the turn's own.
      if (this.turn || this.ignoring) return;
      if (e.type === "onset") this.o.hooks.voiceOnset?.(this.clockAt(this.position(e.at)));
      else this.o.hooks.voiceGone?.();
      return;
    }
    this.vadSpeaking = e.type === "start";
    if (e.type === "start") this.started(e.at);
    else this.ended(e.at, cut);
  }

  private started(at: number): void {
    const position = this.position(at);
    const going = this.turn;
    if (going?.stopped !== undefined) {
      // Speech again before the silence that ends the turn: the same turn goes on.
      going.stopped = undefined;
      going.stopTimers();
      this.o.hooks.resumed(going.turn);
      return;
    }
    // Speech that goes on past a cut (it starts again right where the cut was) is not a new turn.
    const continued = this.cutAt !== undefined && position - this.cutAt <= (this.o.turn.silence_ms / 1000) * RATE;
    this.cutAt = undefined;
    const turn = continued ? undefined : this.o.hooks.speechStarted(this.clockAt(position));
    if (!turn) {
      this.ignoring = true;
      return;
    }
    const start = Math.max(0, Math.round(position - ONSET_PAD_S * RATE));
    // What was said since the onset: the detector confirms speech only after min_speech_ms of it.
    for (const [from, pcm] of this.recent) {
      const end = from + pcm.length;
      if (end <= start) continue;
      turn.transcription.push(from >= start ? pcm : pcm.subarray(start - from));
    }
    this.turn = new Heard(turn, start);
  }

  /**
   * A pause hint when the audio goes quiet (a likely end of the turn, before the detector's silence
   * confirms it): the transcription may start on everything so far, so that when the turn does end
   * its final text is already under way.
   */
  private listen(turn: Heard<T>, pcm: Int16Array): void {
    const level = rms(pcm);
    turn.peak = Math.max(turn.peak, level);
    const quiet = level < Math.max(QUIET_FLOOR, turn.peak * QUIET_SHARE);
    if (!quiet) turn.turn.soundAt = this.pushedAt;
    if (quiet) turn.quietSince ??= this.timeline - pcm.length;
    else if (turn.quietSince !== undefined) {
      // Sound again: the words of the last pause are stale (a noise the detector drops keeps the turn's end where it was).
      turn.quietSince = undefined;
      turn.paused = false;
      turn.pause = undefined;
      turn.preemptTimer?.();
      turn.preemptTimer = undefined;
    }
    const hint = Math.min(QUIET_BEFORE_RECOGNITION_S, this.o.turn.preemptive_after_ms / 1000);
    if (turn.quietSince !== undefined && !turn.paused && this.timeline - turn.quietSince >= hint * RATE) {
      turn.paused = true;
      turn.turn.transcription.pause();
      this.askWords(turn, this.clockAt(turn.quietSince));
    }
  }

  /** The words so far at this pause (quiet since `quietAt` on the clock), for the end of turn and the preemptive reply. */
  private askWords(turn: Heard<T>, quietAt: number): void {
    const pause: Pause = { quietAt, text: undefined, told: false };
    turn.pause = pause;
    turn.turn.transcription.soFar().then(
      (text) =>
        this.guard(() => {
          if (turn.pause !== pause || this.turn !== turn) return;
          pause.text = text;
          this.preempt(turn, pause);
          if (turn.stopped !== undefined) this.decide(turn);
        }),
      () =>
        // No words to judge: the turn ends on the plain silence (the final transcript will say what failed).
        this.guard(() => {
          if (turn.pause !== pause || this.turn !== turn) return;
          pause.text = "";
          if (turn.stopped !== undefined) this.decide(turn);
        }),
    );
  }

  /** The pause's words go to the hooks once the user has been quiet `preemptive_after_ms`. */
  private preempt(turn: Heard<T>, pause: Pause): void {
    if (pause.told || pause.text === undefined || !pause.text) return;
    const wait = pause.quietAt + this.o.turn.preemptive_after_ms - this.o.clock.now();
    if (wait > 0) {
      turn.preemptTimer?.();
      turn.preemptTimer = this.o.clock.after(wait, () => this.guard(() => this.preempt(turn, pause)));
      return;
    }
    if (turn.pause !== pause || this.turn !== turn) return;
    pause.told = true;
    this.o.hooks.paused(turn.turn, pause.text);
  }

  /** The turn ends once its silence is what its words ask for; until then, a timer waits for it. */
  private decide(turn: Heard<T>): void {
    if (this.turn !== turn || turn.stopped === undefined) return;
    const now = this.o.clock.now();
    const text = turn.pause?.text;
    const needed = this.o.hooks.silenceNeeded(turn.turn, text);
    // Sound is being heard (speech the detector has not confirmed yet, or a noise): no end in the middle of it.
    const sounding = turn.quietSince === undefined && now - this.heardAt < SOUNDING_MS;
    const wait = sounding ? Math.max(SOUNDING_MS, turn.stopped.lastVoiced + needed - now) : turn.stopped.lastVoiced + needed - now;
    turn.endTimer?.();
    turn.endTimer = undefined;
    if (wait <= 0) {
      this.end(turn, false);
      return;
    }
    turn.endTimer = this.o.clock.after(wait, () => this.guard(() => this.decide(turn)));
  }

  private guard(fn: () => void): void {
    try {
      if (!this.closed) fn();
    } catch (err) {
      this.o.warn("voice end of turn failed", { err });
    }
  }

  private end(turn: Heard<T>, cut: boolean): void {
    if (this.turn !== turn) return;
    this.turn = undefined;
    turn.stopTimers();
    const decided = this.o.clock.now();
    const lastVoiced = Math.min(decided, turn.stopped?.lastVoiced ?? decided);
    this.o.hooks.speechEnded(turn.turn, { lastVoiced, decided, cut });
  }

  private ended(at: number, cut: boolean): void {
    if (this.ignoring) {
      this.ignoring = false;
      return;
    }
    const heard = this.turn;
    if (!heard) return;
    const lastVoiced = Math.min(this.o.clock.now(), this.clockAt(this.position(at)));
    heard.stopped = { lastVoiced };
    if (cut) {
      this.end(heard, true);
      return;
    }
    // Without audio (a device that stopped sending) no pause was heard: the words are asked now.
    if (!heard.pause) this.askWords(heard, lastVoiced);
    this.decide(heard);
  }
}

/** A quiet stretch in a turn and the words said before it. */
interface Pause {
  /** When the quiet began (clock). */
  quietAt: number;
  text: string | undefined;
  /** `paused` was called for it. */
  told: boolean;
}

class Heard<T> {
  readonly turn: T;
  /** Samples of the timeline where the turn's speech began. */
  readonly start: number;
  /** The loudest chunk of the turn (RMS), the yardstick of quiet. */
  peak = 0;
  /** Where the current quiet stretch began (timeline samples); undefined while the user speaks. */
  quietSince: number | undefined;
  /** The transcription was told of the current quiet stretch. */
  paused = false;
  pause: Pause | undefined;
  /** The detector heard the speech stop (its last voiced audio on the clock); the turn ends after the silence its words ask. */
  stopped: { lastVoiced: number } | undefined;
  endTimer: (() => void) | undefined;
  preemptTimer: (() => void) | undefined;

  constructor(turn: T, start: number) {
    this.turn = turn;
    this.start = start;
  }

  stopTimers(): void {
    this.endTimer?.();
    this.preemptTimer?.();
    this.endTimer = undefined;
    this.preemptTimer = undefined;
  }
}

function rms(pcm: Int16Array): number {
  let sum = 0;
  for (const x of pcm) sum += x * x;
  return Math.sqrt(sum / Math.max(1, pcm.length));
}
