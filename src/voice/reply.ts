import type { SpeexModule } from "@echogarden/speex-resampler-wasm";
import { EngineBusyError } from "../ai/speech/errors.ts";
import type { Speaker } from "./engines.ts";
import type { VoiceEvents } from "./events.ts";
import type { OpusCodec } from "./opus.ts";
import { OPUS_RATE } from "./opus.ts";
import { Playout } from "./playout.ts";
import { Resampler } from "./resampler.ts";
import { SentenceSplitter } from "./sentences.ts";
import { SpokenText } from "./spoken.ts";

/** Silence after each sentence: a breath between sentences, and the resampler's tail flushed out. */
const SENTENCE_GAP_S = 0.12;

export interface ReplyOptions {
  /** Turn number: stream id `out-<n>`. */
  n: number;
  voice: string;
  /** The agent's text, streamed; throws on a failure. */
  text: (signal: AbortSignal) => Promise<AsyncIterable<string>>;
  speaker: Speaker;
  resampler: SpeexModule;
  codec: OpusCodec;
  send: (opus: Buffer, first: boolean) => boolean;
  events: VoiceEvents;
  late: () => void;
  /** The first sentence's synthesis must start within this (ms), else the reply fails as `overloaded`. */
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
  error?: string;
  /** performance.now() of the moments the turn's metrics need. */
  at: { firstToken?: number; firstSentence?: number; firstAudio?: number };
}

/**
 * One reply (a speech handle): the agent's text streamed into sentences, each synthesised as soon
 * as it is complete (while the model writes on) and played on its time. `interrupt()` stops the
 * audio at once and cancels the model call and the synthesis; the outcome says what was heard.
 */
export class Reply {
  readonly outcome: Promise<ReplyOutcome>;
  private readonly o: ReplyOptions;
  private readonly abort = new AbortController();
  private readonly at: ReplyOutcome["at"] = {};
  private playout: Playout | undefined;
  private interrupted = false;

  constructor(o: ReplyOptions) {
    this.o = o;
    this.outcome = this.run();
  }

  /** Barge-in: the audio stops before this returns; the rest ends as the cancellation reaches it. */
  interrupt(): void {
    if (this.interrupted) return;
    this.interrupted = true;
    this.playout?.stop();
    this.abort.abort(new Error("interrupted"));
  }

  private async run(): Promise<ReplyOutcome> {
    const { o } = this;
    const out = `out-${o.n}`;
    const signal = this.abort.signal;
    const spoken = new SpokenText();
    let written = "";
    let textStarted = false;
    let audioStarted = false;
    const resampler = new Resampler(o.resampler, 16_000, OPUS_RATE);
    const playout = new Playout({
      codec: o.codec,
      send: o.send,
      late: o.late,
      started: () => {
        audioStarted = true;
        this.at.firstAudio = performance.now();
        o.events.bos(out, "audio", "assistant.audio", "audio/opus");
      },
    });
    this.playout = playout;
    let synthesis: Promise<void> = Promise.resolve();
    let failure: unknown;
    const speak = (sentence: string) => {
      const first = this.at.firstSentence === undefined;
      this.at.firstSentence ??= performance.now();
      synthesis = synthesis.then(async () => {
        if (signal.aborted || failure) return;
        try {
          const admission = first && o.maxWaitMs !== undefined ? { maxWaitMs: o.maxWaitMs } : {};
          const { samples, sampleRate } = await o.speaker.speak(sentence, o.voice, signal, admission);
          if (signal.aborted) return;
          if (sampleRate !== 16_000) throw new Error(`the synthesiser spoke at ${sampleRate} Hz`);
          const padded = new Int16Array(samples.length + Math.round(SENTENCE_GAP_S * sampleRate));
          padded.set(samples);
          const pcm = resampler.process(padded);
          spoken.add(sentence, pcm.length);
          playout.write(pcm);
        } catch (err) {
          if (!signal.aborted) failure ??= err;
        }
      });
    };
    try {
      const splitter = new SentenceSplitter();
      const stream = await o.text(signal);
      for await (const delta of stream) {
        if (signal.aborted) break;
        if (failure) throw failure;
        if (!delta) continue;
        if (!textStarted) {
          textStarted = true;
          this.at.firstToken = performance.now();
          o.events.bos(out, "text", "assistant.text");
        }
        written += delta;
        o.events.delta(out, "assistant.text", delta);
        for (const sentence of splitter.push(delta)) speak(sentence);
      }
      if (!signal.aborted) for (const sentence of splitter.flush()) speak(sentence);
      await synthesis;
      if (failure) throw failure;
      playout.end();
      await playout.done;
      if (this.interrupted) return this.finish("interrupted", spoken.heard(playout.played), { textStarted, audioStarted });
      return this.finish("answered", spoken.text || written.trim(), { textStarted, audioStarted });
    } catch (err) {
      playout.stop();
      if (this.interrupted) return this.finish("interrupted", spoken.heard(playout.played), { textStarted, audioStarted });
      const message = (err as Error)?.message ?? String(err);
      return this.finish("failed", spoken.heard(playout.played), { textStarted, audioStarted }, message, failureCode(err));
    } finally {
      this.abort.abort();
      resampler.close();
    }
  }

  private finish(
    result: ReplyOutcome["result"],
    heard: string,
    s: { textStarted: boolean; audioStarted: boolean },
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
    return { result, heard, ...(error ? { error } : {}), at: this.at };
  }
}
