import type { SpeexModule } from "@echogarden/speex-resampler-wasm";
import { EngineBusyError } from "../ai/speech/errors.ts";
import { Resampler } from "../audio/resampler.ts";
import type { SynthesisSpan, TurnTrace } from "../observability/voice-spans.ts";
import type { VoiceClock } from "./clock.ts";
import type { SpeechChunk, SpeechPort, SynthesisRequest } from "./engine-ports.ts";
import type { FrameEncoder } from "./opus.ts";
import { OPUS_RATE } from "./opus.ts";
import type { VoiceEvents } from "./peer-events.ts";
import { Playout } from "./playout.ts";
import { SentenceSplitter } from "./sentences.ts";
import { SpokenText } from "./spoken.ts";

/** Silence after each sentence: a breath between sentences, and the resampler's tail flushed out. */
const SENTENCE_GAP_S = 0.12;
/**
 * Synthesis runs at most this far ahead of playback: the engine's stream is pulled only while less
 * than this waits to be sent, so a reply of any length holds a few seconds of audio, not all of it.
 */
export const AHEAD_S = 3;
/** Sample rates a speech engine may speak at. */
const MIN_RATE = 8_000;
const MAX_RATE = 48_000;

export interface ReplyOptions {
  /** The turn's trace: a span per sentence's synthesis. */
  trace?: TurnTrace;
  /** Turn number: stream id `out-<n>`. */
  n: number;
  voice: string;
  /** The agent's text, streamed; throws on a failure. Aborted at a barge-in, a failure, or once the reply is cut. */
  text: (signal: AbortSignal) => Promise<AsyncIterable<string>>;
  speech: SpeechPort;
  resampler: SpeexModule;
  /** Encodes the reply's frames. */
  codec: FrameEncoder;
  clock: VoiceClock;
  send: (opus: Buffer, first: boolean) => boolean;
  events: VoiceEvents;
  late: () => void;
  /** Characters of text spoken at most; the rest is not, and the model call ends there. */
  maxChars: number;
  /** The first sentence's synthesis must start within this (ms) on the embedded engine, else the reply fails as `overloaded`. */
  maxWaitMs?: number;
}

/** The error code of a turn that failed: `overloaded` when the engines could not take the work in time. */
export function failureCode(err: unknown): "overloaded" | "failed" {
  return err instanceof EngineBusyError ? "overloaded" : "failed";
}

export interface ReplyOutcome {
  result: "answered" | "interrupted" | "failed";
  /** What the device heard (all of it unless interrupted). */
  heard: string;
  /** The text reached `maxChars`: the rest was not spoken. */
  cut: boolean;
  error?: string;
  /** Clock times of the moments the turn's metrics need: the first text, sentence, synthesised audio, audio sent. */
  at: { firstToken?: number; firstSentence?: number; firstSpeech?: number; firstAudio?: number };
}

/**
 * One reply (a speech handle): the agent's text streamed into sentences, each synthesised as the
 * device plays what came before (at most AHEAD_S ahead, the next sentence's request started while
 * the current one plays) and played on its time. `interrupt()` stops the audio at once and aborts
 * the model call and the synthesis; the outcome says what was heard.
 */
export class Reply {
  readonly outcome: Promise<ReplyOutcome>;
  /** Aborted once the reply ends (done, interrupted, cut or failed): work tied to the reply (a tool call) ends with it. */
  readonly signal: AbortSignal;
  private readonly o: ReplyOptions;
  private readonly abort = new AbortController();
  private readonly at: ReplyOutcome["at"] = {};
  private playout: Playout | undefined;
  private interrupted = false;
  /** The reply's audio was lost (its encoder's thread ended): it ends as failed. */
  private lost: Error | undefined;

  constructor(o: ReplyOptions) {
    this.o = o;
    this.signal = this.abort.signal;
    this.outcome = this.run();
  }

  /** Speech over the reply (voice.md §7): its audio holds at once; the text and synthesis go on (bounded by AHEAD_S). */
  pause(): void {
    if (!this.interrupted) this.playout?.pause();
  }

  /** A false interruption: the audio goes on from where it paused. */
  resume(): void {
    if (!this.interrupted) this.playout?.resume();
  }

  /** Barge-in: the audio stops before this returns; the rest ends as the cancellation reaches it. */
  interrupt(): void {
    if (this.interrupted) return;
    this.interrupted = true;
    this.playout?.stop();
    this.abort.abort(new Error("interrupted"));
  }

  /** Its audio can no longer be sent (the conversation's audio thread ended): it stops at once and ends as failed. */
  fail(err: Error): void {
    if (this.interrupted || this.lost) return;
    this.lost = err;
    this.playout?.stop();
    this.abort.abort(err);
  }

  private async run(): Promise<ReplyOutcome> {
    const { o } = this;
    const out = `out-${o.n}`;
    const signal = this.abort.signal;
    // The model call ends on its own once the text is cut, without stopping the audio.
    const model = new AbortController();
    const stopModel = () => model.abort(new Error("the reply ended"));
    signal.addEventListener("abort", stopModel, { once: true });
    const spoken = new SpokenText();
    const state = { textStarted: false, audioStarted: false, cut: false };
    let written = "";
    const playout = new Playout({
      codec: o.codec,
      clock: o.clock,
      send: o.send,
      late: o.late,
      started: () => {
        state.audioStarted = true;
        this.at.firstAudio = o.clock.now();
        o.events.bos(out, "audio", "assistant.audio", "audio/opus");
      },
    });
    this.playout = playout;
    const sentences = new SentenceQueue();
    let failure: { error: unknown } | undefined;
    const fail = (error: unknown) => {
      if (signal.aborted || failure) return;
      failure = { error };
      stopModel();
      sentences.end();
    };
    const speaking = this.speakAll(sentences, playout, spoken).catch(fail);
    try {
      const splitter = new SentenceSplitter();
      const stream = await o.text(model.signal);
      for await (const delta of untilAborted(stream, model.signal)) {
        if (signal.aborted || failure) break;
        if (!delta) continue;
        let piece = delta;
        if (written.length + piece.length > o.maxChars) {
          piece = cutAtWord(piece, o.maxChars - written.length);
          state.cut = true;
        }
        if (piece && !state.textStarted) {
          state.textStarted = true;
          this.at.firstToken = o.clock.now();
          o.events.bos(out, "text", "assistant.text");
        }
        if (piece) {
          written += piece;
          o.events.delta(out, "assistant.text", piece);
          for (const sentence of splitter.push(piece)) {
            this.at.firstSentence ??= o.clock.now();
            sentences.push(sentence);
          }
        }
        if (state.cut) break;
      }
      if (!signal.aborted && !failure)
        for (const sentence of splitter.flush()) {
          this.at.firstSentence ??= o.clock.now();
          sentences.push(sentence);
        }
    } catch (err) {
      fail(err);
    } finally {
      stopModel();
      sentences.end();
    }
    await speaking;
    try {
      if (this.lost) throw this.lost;
      if (failure) throw failure.error;
      playout.end();
      await playout.done;
      if (this.interrupted) return this.finish("interrupted", spoken.heard(playout.played), state);
      return this.finish("answered", spoken.text || written.trim(), state);
    } catch (err) {
      playout.stop();
      if (this.interrupted) return this.finish("interrupted", spoken.heard(playout.played), state);
      const message = (err as Error)?.message ?? String(err);
      return this.finish("failed", spoken.heard(playout.played), state, message, failureCode(err));
    } finally {
      signal.removeEventListener("abort", stopModel);
      this.abort.abort();
    }
  }

  /** Speaks the sentences in order as they come, pulling audio only as playback makes room for it. */
  private async speakAll(sentences: SentenceQueue, playout: Playout, spoken: SpokenText): Promise<void> {
    const { o } = this;
    const signal = this.abort.signal;
    const ahead = AHEAD_S * OPUS_RATE;
    let resampler: { rate: number; r: Resampler } | undefined;
    const toOpusRate = (chunk: SpeechChunk): Int16Array => {
      if (!(chunk.sampleRate >= MIN_RATE && chunk.sampleRate <= MAX_RATE)) throw new Error(`the speech engine spoke at ${chunk.sampleRate} Hz`);
      if (resampler?.rate !== chunk.sampleRate) {
        resampler?.r.close();
        resampler = { rate: chunk.sampleRate, r: new Resampler(o.resampler, chunk.sampleRate, OPUS_RATE) };
      }
      return resampler.r.process(chunk.pcm);
    };
    let first = true;
    const start = (text: string) => {
      // Only the reply's first sentence carries the budget: once audio plays, a gap beats a cut.
      const budget = first ? o.maxWaitMs : undefined;
      first = false;
      return new Synthesis(o.speech, { text, voice: o.voice, signal, ...(budget !== undefined ? { maxWaitMs: budget } : {}) }, o.trace?.synthesis(text));
    };
    try {
      let current: Synthesis | undefined;
      for (;;) {
        if (!current) {
          const text = await sentences.next();
          if (text === undefined || signal.aborted) return;
          current = start(text);
        }
        spoken.add(current.text, 0);
        let rate: number | undefined;
        let following: Synthesis | undefined;
        for (;;) {
          await playout.room(ahead);
          if (signal.aborted) return;
          const chunk = await current.next();
          if (signal.aborted) return;
          if (chunk) this.at.firstSpeech ??= o.clock.now();
          // The next sentence is requested while this one plays (one ahead at most).
          if (!following) {
            const text = sentences.take();
            if (text !== undefined) following = start(text);
          }
          if (!chunk) break;
          if (rate !== undefined && chunk.sampleRate !== rate) throw new Error("the speech engine changed its sample rate within a sentence");
          rate = chunk.sampleRate;
          const pcm = toOpusRate(chunk);
          spoken.extend(pcm.length);
          playout.write(pcm);
        }
        if (rate !== undefined) {
          const pcm = toOpusRate({ pcm: new Int16Array(Math.round(SENTENCE_GAP_S * rate)), sampleRate: rate });
          spoken.extend(pcm.length);
          playout.write(pcm);
        }
        current = following;
      }
    } finally {
      resampler?.r.close();
    }
  }

  private finish(
    result: ReplyOutcome["result"],
    heard: string,
    s: { textStarted: boolean; audioStarted: boolean; cut: boolean },
    error?: string,
    code: "failed" | "overloaded" = "failed",
  ): ReplyOutcome {
    const { events } = this.o;
    const out = `out-${this.o.n}`;
    if (s.textStarted) events.done(out, "assistant.text", heard);
    if (result === "failed" && (!s.textStarted || !s.audioStarted)) events.eos(out, "text", "assistant.text", { code, message: error ?? "failed" });
    if (s.audioStarted) {
      events.eos(
        out,
        "audio",
        "assistant.audio",
        result === "interrupted" ? { code: "interrupted" } : result === "failed" ? { code, message: error ?? "failed" } : undefined,
      );
    }
    return { result, heard, cut: s.cut, ...(error ? { error } : {}), at: this.at };
  }
}

/** One sentence's audio from the speech port; its request starts at once (so that it can run ahead of its turn). */
class Synthesis {
  readonly text: string;
  private readonly iterator: AsyncIterator<SpeechChunk>;
  private first: Promise<IteratorResult<SpeechChunk>> | undefined;
  private readonly span: SynthesisSpan | undefined;

  constructor(speech: SpeechPort, request: SynthesisRequest, span?: SynthesisSpan) {
    this.text = request.text;
    this.span = span;
    this.iterator = speech.synthesize(request)[Symbol.asyncIterator]();
    this.first = this.iterator.next();
    // Awaited when its turn comes; a failure before then (an abort) is not unhandled.
    this.first.catch(() => {});
    // A synthesis left unfinished (a barge-in, the reply's end) ends its span then.
    if (span) request.signal.addEventListener("abort", () => span.end(), { once: true });
  }

  async next(): Promise<SpeechChunk | undefined> {
    const pending = this.first ?? this.iterator.next();
    this.first = undefined;
    if (!this.span) {
      const r = await pending;
      return r.done ? undefined : r.value;
    }
    let r: IteratorResult<SpeechChunk>;
    try {
      r = await pending;
    } catch (err) {
      this.span.end(err);
      throw err;
    }
    if (r.done) this.span.end();
    else this.span.audio();
    return r.done ? undefined : r.value;
  }
}

/** Sentences between the model's text and the synthesis: bounded by the reply's length limit. */
class SentenceQueue {
  private readonly items: string[] = [];
  private ended = false;
  private waiter: ((text: string | undefined) => void) | undefined;

  push(text: string): void {
    if (this.ended) return;
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = undefined;
      w(text);
    } else this.items.push(text);
  }

  end(): void {
    this.ended = true;
    const w = this.waiter;
    this.waiter = undefined;
    w?.(this.items.shift());
  }

  /** The next sentence if one is waiting. */
  take(): string | undefined {
    return this.items.shift();
  }

  /** The next sentence; undefined once they are all taken and no more will come. */
  next(): Promise<string | undefined> {
    if (this.items.length > 0 || this.ended) return Promise.resolve(this.items.shift());
    return new Promise((resolve) => {
      this.waiter = resolve;
    });
  }
}

/**
 * The stream's items until `signal` aborts: then at once, whether or not the source honours the
 * signal (a model that stalls, a tool that runs on), and the source is told to stop.
 */
async function* untilAborted<T>(source: AsyncIterable<T>, signal: AbortSignal): AsyncGenerator<T> {
  const iterator = source[Symbol.asyncIterator]();
  let onAbort = () => {};
  const aborted = new Promise<never>((_, reject) => {
    onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
  });
  aborted.catch(() => {});
  let finished = false;
  try {
    for (;;) {
      signal.throwIfAborted();
      const r = await Promise.race([iterator.next(), aborted]);
      if (r.done) {
        finished = true;
        return;
      }
      yield r.value;
    }
  } finally {
    signal.removeEventListener("abort", onAbort);
    if (!finished) iterator.return?.()?.catch(() => {});
  }
}

/** At most `max` characters of `text`, cut back to the end of a word when one ends in its second half. */
function cutAtWord(text: string, max: number): string {
  if (max <= 0) return "";
  const head = text.slice(0, max);
  if (/\s/.test(text[max] ?? " ")) return head;
  const space = head.search(/\s\S*$/);
  return space > max / 2 ? head.slice(0, space) : head;
}
