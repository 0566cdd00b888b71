import { availableParallelism } from "node:os";
import type { PoolWorker } from "../../workers/pool.ts";
import { type Child, writeInput } from "./child.ts";
import { abortReason, EngineBusyError } from "./errors.ts";
import { OUTPUT_SAMPLE_RATE, startEncoder } from "./ffmpeg.ts";
import { type FliteAudio, FlitePool, type FliteVoice } from "./flite.ts";
import type { LoadState } from "./loading.ts";
import { type JobOptions, Scheduler } from "./scheduler.ts";
import { type SpeechChunk, speechChunks } from "./text.ts";
import { SPEECH_FORMATS, type SpeechEngine, type SynthesizeOptions } from "./types.ts";

/**
 * The package holds four speakers (kal, awb, rms, slt; awb_time only reads clock times and kal is
 * kal16 at 8 kHz); the six OpenAI voices are those four, two of them also at another pitch.
 */
export const VOICES: Readonly<Record<string, FliteVoice>> = {
  alloy: { name: "kal16" }, // US male, diphone: neutral and the fastest (~1 ms a word)
  echo: { name: "rms" }, // US male
  fable: { name: "awb" }, // Scottish male, ~130 Hz
  onyx: { name: "awb", features: { int_f0_target_mean: 90 } }, // the same speaker, deeper
  nova: { name: "slt" }, // US female, ~170 Hz
  shimmer: { name: "slt", features: { int_f0_target_mean: 225 } }, // the same speaker, brighter
};

/** Every voice above speaks at this rate. */
const FLITE_SAMPLE_RATE = 16_000;
/** The contract's bounds. */
export const MAX_INPUT_CHARACTERS = 4096;
export const MIN_SPEED = 0.25;
export const MAX_SPEED = 4;

export interface SpeechEngineOptions {
  /** flite workers for every job, at a lower OS priority (each one sentence at a time). Default: the cores. */
  concurrency?: number;
  /**
   * flite workers at the process's own priority, kept for conversations' sentences (which may also
   * take a free worker of the others). Default 1; with 0, every worker takes every job at the process's priority.
   */
  foreground?: number;
  /** Requests streaming at once (each holds an encoder process); one more is refused with EngineBusyError. Default 64. */
  maxStreams?: number;
  /** Where the workers' warning goes (their priorities could not be set): the node's log. */
  warn?: (message: string) => void;
}

/** What a sentence is assumed to take before any was measured. */
const INITIAL_JOB_MS = 60;

/** Quieter than this (of 32767) at either end of a chunk is flite's padding, replaced by the chunk's own pause. */
const SILENCE_THRESHOLD = 256;

function trimSilence(samples: Int16Array, rate: number): Int16Array {
  const margin = Math.round(rate * 0.01);
  let start = 0;
  while (start < samples.length && Math.abs(samples[start]!) < SILENCE_THRESHOLD) start++;
  let end = samples.length;
  while (end > start && Math.abs(samples[end - 1]!) < SILENCE_THRESHOLD) end--;
  if (start === end) return samples.subarray(0, 0);
  return samples.subarray(Math.max(0, start - margin), Math.min(samples.length, end + margin));
}

function bytes(samples: Int16Array): Uint8Array {
  return new Uint8Array(samples.buffer, samples.byteOffset, samples.byteLength);
}

function silence(seconds: number, rate: number): Uint8Array {
  return new Uint8Array(2 * Math.round(seconds * rate));
}

/**
 * flite in worker threads, ffmpeg in a child process per request. Text is spoken chunk by chunk
 * (see text.ts) into one encoder whose output is yielded as it appears; the next chunk is
 * synthesized while the encoder works on the current one. Every chunk is a job of the scheduler
 * (scheduler.ts): conversations' sentences before the Compatible API's, callers in turn.
 */
export class FliteSpeechEngine implements SpeechEngine {
  readonly voices: readonly string[] = Object.keys(VOICES);
  readonly sampleRate = OUTPUT_SAMPLE_RATE;
  readonly scheduler: Scheduler;
  readonly schedulers: readonly Scheduler[];
  private readonly pool: FlitePool;
  private readonly maxStreams: number;
  private streams = 0;
  private warming: Promise<void> | undefined;

  constructor(options: SpeechEngineOptions = {}) {
    const background = options.concurrency ?? availableParallelism();
    const foreground = options.foreground ?? 1;
    // The scheduler's reserved slots are the foreground workers: other jobs than conversations' never run on them.
    this.scheduler = new Scheduler({ name: "speech", slots: background + foreground, initialJobMs: INITIAL_JOB_MS, reserved: () => foreground });
    this.schedulers = [this.scheduler];
    this.pool = new FlitePool(background + foreground, foreground > 0 ? background : 0, options.warn);
    this.maxStreams = options.maxStreams ?? 64;
  }

  /** Requests streaming now. */
  get openStreams(): number {
    return this.streams;
  }

  /** Compiles flite and runs every voice once on a foreground and a background worker, so that no request pays for it. Optional; once. */
  warmUp(): Promise<void> {
    this.warming ??= this.warm();
    return this.warming;
  }

  private async warm(): Promise<void> {
    await this.pool.warmUp();
    // V8 compiles hot WebAssembly functions with its optimising tier only after they have run a while (in each worker).
    const text = "The small device reports its battery level and its temperature every minute.";
    const voices = [...new Set(Object.values(VOICES).map((v) => v.name))];
    const lane = async (urgent: boolean) => {
      for (const voice of voices) await this.pool.synthesize(text, { name: voice }, 1, urgent);
    };
    await Promise.all([lane(true), lane(false)]);
  }

  async close(): Promise<void> {
    await this.pool.close();
  }

  /** Where the flite workers' start stands (`/metrics`): they start with the first sentence or `warmUp()`. */
  loadStates(): Array<{ engine: string; state: LoadState }> {
    return [{ engine: this.scheduler.name, state: this.pool.state }];
  }

  /** The flite workers once started (tests: their lanes and priorities). */
  workers(): Promise<PoolWorker[]> {
    return this.pool.workers();
  }

  synthesize(o: SynthesizeOptions): AsyncIterable<Uint8Array> {
    const voice = VOICES[o.voice];
    if (!voice || !Object.hasOwn(VOICES, o.voice)) throw new RangeError(`unknown voice ${JSON.stringify(o.voice)}; voices: ${this.voices.join(", ")}`);
    if (!SPEECH_FORMATS.includes(o.format)) throw new RangeError(`unknown format ${JSON.stringify(o.format)}`);
    if (!(o.speed >= MIN_SPEED && o.speed <= MAX_SPEED)) throw new RangeError(`speed must be between ${MIN_SPEED} and ${MAX_SPEED}`);
    if (o.text.length < 1 || o.text.length > MAX_INPUT_CHARACTERS) throw new RangeError(`text must have 1 to ${MAX_INPUT_CHARACTERS} characters`);
    if (this.streams >= this.maxStreams) throw new EngineBusyError(`The speech engine has ${this.maxStreams} requests streaming; try again shortly.`);
    // Refused at once when the queue says the first sentence could not start in time (the same
    // check is made again, with a deadline, when the first sentence is queued).
    const refusal = this.scheduler.admit({
      class: "api",
      ...(o.caller !== undefined ? { caller: o.caller } : {}),
      ...(o.maxWaitMs !== undefined ? { maxWaitMs: o.maxWaitMs } : {}),
    });
    if (refusal) throw refusal;
    return this.stream(o, voice);
  }

  /**
   * Raw 16-bit samples of `text` (a sentence) at `sampleRate`, with no encoder: for callers that
   * encode themselves (voice conversations), whose jobs go first. Throws OverloadedError when the
   * first chunk cannot start within `o.maxWaitMs`.
   */
  async speak(text: string, voiceName: string, signal?: AbortSignal, o: { maxWaitMs?: number } = {}): Promise<{ samples: Int16Array; sampleRate: number }> {
    const voice = VOICES[voiceName];
    if (!voice || !Object.hasOwn(VOICES, voiceName)) throw new RangeError(`unknown voice ${JSON.stringify(voiceName)}; voices: ${this.voices.join(", ")}`);
    if (text.length < 1 || text.length > MAX_INPUT_CHARACTERS) throw new RangeError(`text must have 1 to ${MAX_INPUT_CHARACTERS} characters`);
    const parts: Int16Array[] = [];
    const chunks = speechChunks(text);
    for (const [i, chunk] of chunks.entries()) {
      const job: JobOptions = {
        class: "conversation",
        ...(signal ? { signal } : {}),
        ...(i === 0 && o.maxWaitMs !== undefined ? { maxWaitMs: o.maxWaitMs } : {}),
      };
      const audio = await this.job(chunk.text, voice, 1, job);
      if (signal?.aborted) throw abortReason(signal);
      if (audio.sampleRate !== FLITE_SAMPLE_RATE) throw new Error(`flite voice ${voice.name} speaks at ${audio.sampleRate} Hz`);
      const samples = trimSilence(audio.samples, audio.sampleRate);
      if (samples.length === 0) continue;
      if (parts.length > 0) parts.push(new Int16Array(Math.round(chunks[i - 1]!.pauseAfter * FLITE_SAMPLE_RATE)));
      parts.push(samples);
    }
    const out = new Int16Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const p of parts) {
      out.set(p, at);
      at += p.length;
    }
    return { samples: out, sampleRate: FLITE_SAMPLE_RATE };
  }

  /** One chunk of speech, when the scheduler gives it its turn. */
  private job(text: string, voice: FliteVoice, stretch: number, o: JobOptions): Promise<FliteAudio> {
    return this.scheduler.run(() => this.pool.synthesize(text, voice, stretch, o.class === "conversation"), o);
  }

  private async *stream(o: SynthesizeOptions, voice: FliteVoice): AsyncGenerator<Uint8Array> {
    this.streams++;
    // Aborted when the caller aborts, stops iterating, or synthesis fails: the encoder dies with it.
    const stop = new AbortController();
    const signal = o.signal ? AbortSignal.any([o.signal, stop.signal]) : stop.signal;
    try {
      const encoder = startEncoder(o.format, FLITE_SAMPLE_RATE, signal);
      let failure: { error: unknown } | undefined;
      const feeding = this.feed(speechChunks(o.text), voice, 1 / o.speed, encoder, signal, o).catch((error: unknown) => {
        failure = { error };
        stop.abort();
      });
      for await (const chunk of encoder.proc.stdout) yield chunk as Uint8Array;
      const exit = await encoder.exited;
      await feeding;
      if (o.signal?.aborted) throw abortReason(o.signal);
      if (failure) throw failure.error;
      if (exit.code !== 0) throw new Error(`ffmpeg could not encode ${o.format}: ${exit.stderr || `exit ${exit.code ?? exit.signal}`}`);
    } finally {
      stop.abort();
      this.streams--;
    }
  }

  private async feed(chunks: SpeechChunk[], voice: FliteVoice, stretch: number, encoder: Child, signal: AbortSignal, o: SynthesizeOptions): Promise<void> {
    const stdin = encoder.proc.stdin;
    let written = 0;
    const synth = (i: number): Promise<FliteAudio> | undefined => {
      const chunk = chunks[i];
      if (!chunk) return undefined;
      const job = this.job(chunk.text, voice, stretch, {
        class: "api",
        signal,
        ...(o.caller !== undefined ? { caller: o.caller } : {}),
        // Admission is for the request's start; once it streams, its later sentences wait their turn.
        ...(i === 0 && o.maxWaitMs !== undefined ? { maxWaitMs: o.maxWaitMs } : {}),
      });
      job.catch(() => {});
      return job;
    };
    let next = synth(0);
    for (let i = 0; next; i++) {
      const audio = await next;
      if (signal.aborted) return;
      next = synth(i + 1);
      if (audio.sampleRate !== FLITE_SAMPLE_RATE) throw new Error(`flite voice ${voice.name} speaks at ${audio.sampleRate} Hz`);
      const samples = trimSilence(audio.samples, audio.sampleRate);
      if (samples.length === 0) continue;
      // The pause goes before the next chunk, so that the audio ends with the last word.
      if (written > 0) await writeInput(stdin, silence(chunks[i - 1]!.pauseAfter * stretch, FLITE_SAMPLE_RATE));
      await writeInput(stdin, bytes(samples));
      written += samples.length;
    }
    // Text with nothing to say (punctuation only) still makes a valid, short file.
    if (written === 0) await writeInput(stdin, silence(0.1, FLITE_SAMPLE_RATE));
    stdin.end();
  }
}
