/**
 * The embedded recogniser behind `whisper-1`: Moonshine base for the words, Silero for where speech
 * is, each in a worker process of its own (one model of each per server process, each loaded on its
 * first use or when the node asks at start-up, src/node/engines.ts; processes rather than threads:
 * see recognition-worker.ts).
 *
 * Files: decoded to 16 kHz mono (decode.ts), scored by the VAD (in jobs of 10 s of audio), then
 * recognised job by job (FileSpeech): speech of up to 20 s, neighbours joined up to 12 s, whatever
 * the load (the same words every time), up to one job a recogniser process at once: while no
 * conversation goes on, every process serves files (a turn then waits for one job at most, and
 * one process is kept from then on). Each job is one segment; silence and noise give none and so
 * an empty transcript. A bounded queue admits requests (EngineBusyError when full, the surface's 429).
 *
 * Conversations' voice activity jobs that wait together are scored in one batch (one message to the
 * process, one inference a frame for all of them).
 *
 * Live audio (voice conversations), through the same workers, ahead of file work:
 *
 *   const vad = engine.createVad();                 // see vad.ts
 *   const asr = engine.createIncrementalRecogniser();
 *   asr.push(pcm);                                   // 16 kHz mono Float32 or Int16, as it arrives
 *   const soFar = await asr.partial();               // text of the utterance so far (cached; bounded cost)
 *   const text = await asr.finish();                 // final text of everything pushed; starts a new utterance
 *
 * `partial()` recognises again only once ≥ 0.5 s of new audio has arrived and at most the last 10 s;
 * 150 ms of silence after speech starts recognising the whole utterance on its own, and `finish()`
 * reuses that (or the last partial) when nothing but silence came after it. Both run only while the
 * recogniser is idle: under load each turn costs one recognition, its final one.
 */
import { availableParallelism } from "node:os";
import { concatFloat32 } from "../../audio/samples.ts";
import { type PoolWorker, WorkerPool } from "../../workers/pool.ts";
import type { Combine } from "./beam-search.ts";
import { DECODED_SAMPLE_RATE, decodeAudio } from "./decode.ts";
import { type DenoiseOptions, denoise } from "./denoise.ts";
import { abortReason, EngineBusyError, UnsupportedLanguageError } from "./errors.ts";
import { FRONT_END, type FrontEndOptions } from "./front-end.ts";
import { type LoadFailure, type LoadState, RetriedLoad } from "./loading.ts";
import type { Heard } from "./moonshine.ts";
import { normaliseTranscript } from "./normalise.ts";
import { type QueueLimits, WorkQueue } from "./queue.ts";
import type { RecognitionRequest, RecognitionResult, RecognitionWorkerData } from "./recognition-worker.ts";
import { type JobClass, type JobOptions, Scheduler } from "./scheduler.ts";
import { initialVadState, VAD_FRAME, type VadItem, type VadResult, type VadState } from "./silero.ts";
import type { TranscribeOptions, TranscribeProgress, Transcript, TranscriptionEngine, TranscriptSegment } from "./types.ts";
import { FileSpeech, type Piece, type Region, SpeechTracker, toFloat32, type VadEvent, type VadOptions } from "./vad.ts";
import { IDENTITY, type View } from "./views.ts";

const RATE = DECODED_SAMPLE_RATE;
const WORKER_SCRIPT = new URL("./recognition-worker.ts", import.meta.url);
/**
 * Silence added where audio starts or ends right at speech (a file's first and last region, a live
 * utterance) and where a file's speech was cut: Moonshine misses words that touch the edge. Inside a
 * file, regions carry real audio around their speech instead (FileSpeech), which does better in noise
 * than silence does.
 */
const EDGE_PAD = 0.25;
/** A conversation's work goes ahead of files (scheduler.ts); partial text goes last. */
const LIVE: JobOptions = { class: "conversation" };
const PARTIAL: JobOptions = { class: "partial" };
const FILE: JobOptions = { class: "api" };
/** What a job is assumed to take before any was measured: an utterance's recognition, a batch of voice activity. */
const INITIAL_RECOGNITION_MS = 400;
/**
 * Conversations' utterances waiting together are recognised in one batch of at most this many,
 * when their lengths are within a factor of 2 (a batch is padded to its longest). Moonshine base's
 * CPU for a batch of 1.7 s questions: 0.50 s for one, 1.32 s for four, 2.02 s for eight, 2.69 s for
 * sixteen: a burst of turns costs far less in large batches (docs/benchmarks.md, fourth round).
 */
const BATCH_MAX = 8;
/**
 * A conversation's transcript later than this after its job was queued (at the measured time of a
 * batch, behind the batches waiting before it) makes its reply late: its batch then runs on
 * Moonshine tiny (about a third less CPU for a batch, more words wrong). The device's goal is a reply
 * 1.2 s after the last word, of which 0.43 s is the end-of-speech silence and ~0.25 s the reply's start.
 */
const FAST_AFTER_MS = 600;
const BATCH_LENGTH_RATIO = 2;
const INITIAL_VAD_MS = 10;
/** Conversations' voice activity jobs waiting together are scored in one batch of at most this many streams. */
const VAD_BATCH_MAX = 32;
/** A file's voice activity is scored in jobs of this many seconds of audio. */
const FILE_VAD_JOB_S = 10;
/** A conversation counts as going on for this long after it last used the engines. */
const CONVERSING_FOR_MS = 60_000;
/**
 * The decoder's beams for files, and for turns (see MoonshineEngineOptions). Measured by the hearing
 * benchmark (docs/benchmarks.md, issue 50): beam search of 3 with the front end took the set's clean
 * word error rate from 0.17 to 0.12 and the noisy one from 0.44 to 0.35; turns stay greedy, since
 * their recognition time is the reply's, and the front end stays off for them (turnFrontEnd).
 */
const BEAMS = 3;
const TURN_BEAMS = 1;
/**
 * The views each utterance is heard in, decoded jointly (views.ts), for files and for turns' final
 * words; partial words are heard as they are. Measured by the hearing benchmark (docs/benchmarks.md,
 * issue 50): files in three phases against the encoder's stride (0, 8 and 16 ms dropped), with 3
 * beams, took the set's clean word error rate from 0.12 to 0.08 and "Turn on the kitchen lights." by
 * the six voices from 13 to 15 of 18, for about 1.6× the recognition's CPU; turns stay one view, since
 * three tripled their words' time (183 → 698 ms p50 in that run) for one more tour question of 18.
 */
const VIEWS: View[] = [IDENTITY, { shift: 128 }, { shift: 256 }];
const TURN_VIEWS: View[] = [IDENTITY];

/** `concurrency`: files decoded at once; `maxQueued`: files waiting to be decoded (one more is refused). */
export interface MoonshineEngineOptions extends Partial<QueueLimits> {
  /** Recogniser processes, each one recognition at a time. Default 1. */
  processes?: number;
  /** Threads of one recognition (onnxruntime's intra-op pool). Default: the cores shared among the processes. */
  threads?: number;
  /**
   * Conversation batches run on Moonshine tiny when base would give some turn's transcript later
   * than this many ms after it was asked for (FAST_AFTER_MS by default); `false`: base only (tiny not loaded).
   */
  fastAfterMs?: number | false;
  /** A conversation counts as going on for this long after its last turn (CONVERSING_FOR_MS by default; benchmarks shorten it). */
  conversingForMs?: number;
  /** Hypotheses the decoder keeps at each step (beam search) for files; 1 is greedy. Default BEAMS. */
  beams?: number;
  /** The same for conversations' turns and partial words (their time is the reply's). Default TURN_BEAMS. */
  turnBeams?: number;
  /** The ways a file's utterance is heard, decoded jointly (views.ts, ensemble decoding). Default VIEWS. */
  views?: View[];
  /** The same for a conversation's turn (its final words; partial words are heard once). Default TURN_VIEWS. */
  turnViews?: View[];
  /** How the views' next-token distributions are combined (beam-search.ts). Default `product`. */
  combine?: Combine;
  /** What is done to a file's audio before the recogniser hears it (front-end.ts); `false`: nothing. Default FRONT_END. */
  frontEnd?: FrontEndOptions | false;
  /**
   * The same for conversations' turns. Default `false`: with the front end, a backchannel over a
   * reply ("Mm-hmm.", nova) was heard as "And in nature, then." (a barge-in) in the end-to-end test.
   */
  turnFrontEnd?: FrontEndOptions | false;
  /** Noise suppression of a file's audio before its pieces are recognised (denoise.ts); `false` (default): none. */
  denoise?: DenoiseOptions | false;
  /** The same for each of a conversation's utterances (its noise from the utterance's quietest frames). Default `false`. */
  turnDenoise?: DenoiseOptions | false;
  /** Moonshine base's model directory (default the package's). */
  modelDir?: string;
  /** Where the workers' warning goes (their priorities could not be set): the node's log. */
  warn?: (message: string) => void;
  /** A load that failed is tried again on a use after this long, doubling (default 5 s, at most 5 min). */
  loadRetryMs?: number;
}

export class MoonshineEngine implements TranscriptionEngine {
  readonly languages: readonly string[] = ["en"];
  readonly wordTimestamps = false;
  /** Bounds the decoding of files (ffmpeg processes and their memory). */
  private readonly queue: WorkQueue;
  /** Recognitions on the recogniser processes, voice activity on its own. */
  readonly recognitions: Scheduler;
  readonly activity: Scheduler;
  readonly schedulers: readonly Scheduler[];
  private readonly processes: number;
  private readonly threads: number;
  private readonly fast: boolean;
  private readonly conversingForMs: number;
  private readonly beams: number;
  private readonly turnBeams: number;
  private readonly views: View[];
  private readonly turnViews: View[];
  private readonly combine: Combine | undefined;
  private readonly frontEnd: FrontEndOptions | false;
  private readonly turnFrontEnd: FrontEndOptions | false;
  private readonly denoise: DenoiseOptions | false;
  private readonly turnDenoise: DenoiseOptions | false;
  private recogniserPool: WorkerPool<RecognitionRequest, RecognitionResult> | undefined;
  private vadPool: WorkerPool<RecognitionRequest, RecognitionResult> | undefined;
  /** Each part starts on first use (or when asked to: `startRecognition`, `startActivity`); a failed load is tried again with back-off. */
  readonly recognitionLoad: RetriedLoad;
  readonly activityLoad: RetriedLoad;
  /** Batches recognised by each model (Moonshine base, and tiny when a turn would be late). */
  readonly batchesByModel = { base: 0, tiny: 0 };
  /** Milliseconds from `startRecognition()` until the recogniser processes were loaded. */
  loadMs: number | undefined;
  /**
   * When a conversation last took a turn (a recognition of its class) or a detector was made for one
   * (performance.now()). Not its voice activity: a connected microphone sends that all the time.
   */
  private conversedAt = Number.NEGATIVE_INFINITY;

  constructor(options: MoonshineEngineOptions = {}) {
    this.processes = options.processes ?? 1;
    this.threads = options.threads ?? Math.max(1, Math.floor(availableParallelism() / this.processes));
    this.conversingForMs = options.conversingForMs ?? CONVERSING_FOR_MS;
    this.beams = options.beams ?? BEAMS;
    this.turnBeams = options.turnBeams ?? TURN_BEAMS;
    this.views = options.views ?? VIEWS;
    this.turnViews = options.turnViews ?? TURN_VIEWS;
    this.combine = options.combine;
    this.frontEnd = options.frontEnd ?? FRONT_END;
    this.turnFrontEnd = options.turnFrontEnd ?? false;
    this.denoise = options.denoise ?? false;
    this.turnDenoise = options.turnDenoise ?? false;
    const fastAfterMs = options.fastAfterMs ?? FAST_AFTER_MS;
    this.fast = fastAfterMs !== false;
    this.queue = new WorkQueue({ concurrency: options.concurrency ?? Math.max(2, this.processes), maxQueued: options.maxQueued ?? 16 });
    this.recognitions = new Scheduler({
      name: "recognition",
      slots: this.processes,
      initialJobMs: INITIAL_RECOGNITION_MS,
      // With two processes or more, one (the foreground one) is kept while a conversation goes on: a
      // turn's transcript then never waits for a file's, and files and partials run on the others at a
      // lower priority. Otherwise idle processes serve files, and a turn waits for one job at most.
      reserved: () => (this.processes >= 2 && this.conversing ? 1 : 0),
      batching: {
        classes: ["conversation"],
        max: BATCH_MAX,
        fits: (a, b) => alike((a as Float32Array).length, (b as Float32Array).length),
        run: (audios, cls, fast) => this.recogniseBatch(audios as Float32Array[], cls, fast),
        ...(fastAfterMs !== false ? { fastAfterMs } : {}),
      },
    });
    this.activity = new Scheduler({
      name: "voice_activity",
      slots: 1,
      initialJobMs: INITIAL_VAD_MS,
      batching: { classes: ["conversation"], max: VAD_BATCH_MAX, fits: () => true, run: (items) => this.scoreBatch(items as VadItem[]) },
    });
    this.schedulers = [this.recognitions, this.activity];
    const retry = { ...(options.loadRetryMs !== undefined ? { firstRetryMs: options.loadRetryMs } : {}) };
    this.recognitionLoad = new RetriedLoad({
      engine: this.recognitions.name,
      model: "whisper-1: Moonshine",
      ...retry,
      start: () => {
        const started = performance.now();
        const moonshine: RecognitionWorkerData = {
          model: "moonshine",
          threads: this.threads,
          fast: this.fast,
          ...(options.modelDir !== undefined ? { dir: options.modelDir } : {}),
        };
        // One process in the foreground for conversations; the others, at a lower OS priority, for files and partials.
        const pool = new WorkerPool<RecognitionRequest, RecognitionResult>({
          script: WORKER_SCRIPT,
          workerData: moonshine,
          size: this.processes,
          background: this.processes - 1,
          name: "recogniser",
          isolation: "process",
          ...(options.warn ? { warn: options.warn } : {}),
        });
        this.recogniserPool = pool;
        return {
          ready: pool.ready().then(() => {
            this.loadMs = performance.now() - started;
          }),
          stop: () => {
            if (this.recogniserPool === pool) this.recogniserPool = undefined;
            void pool.close().catch(() => {});
          },
        };
      },
    });
    this.activityLoad = new RetriedLoad({
      engine: this.activity.name,
      model: "whisper-1: Silero",
      ...retry,
      start: () => {
        const silero: RecognitionWorkerData = { model: "silero" };
        const pool = new WorkerPool<RecognitionRequest, RecognitionResult>({
          script: WORKER_SCRIPT,
          workerData: silero,
          size: 1,
          name: "voice activity",
          isolation: "process",
        });
        this.vadPool = pool;
        return {
          ready: pool.ready(),
          stop: () => {
            if (this.vadPool === pool) this.vadPool = undefined;
            void pool.close().catch(() => {});
          },
        };
      },
    });
  }

  /** Called once per failed load of a part (the node logs it). */
  set onLoadFailed(fn: ((f: LoadFailure) => void) | undefined) {
    this.recognitionLoad.failed = fn;
    this.activityLoad.failed = fn;
  }

  /** Transcriptions running and waiting for a slot. */
  get load(): { running: number; queued: number } {
    return { running: this.queue.running, queued: this.queue.queued };
  }

  /**
   * Whether a recognition asked for now would start at once. Speculative work (recognising an
   * utterance before its end is confirmed, partial text) runs only then: under load it would
   * queue ahead of other conversations' final transcripts and multiply the work per turn.
   */
  recogniserIdle(job: JobOptions): boolean {
    return this.loadMs !== undefined && this.recognitions.idleFor(job.class);
  }

  /** Recognitions waiting for a recogniser process. */
  get recognitionsWaiting(): number {
    return this.recognitions.waiting;
  }

  /** The worker processes holding the models. */
  pids(): { recogniser: number[]; vad: number[] } {
    return { recogniser: this.recogniserPool?.pids() ?? [], vad: this.vadPool?.pids() ?? [] };
  }

  /** The recogniser processes once loaded (tests: their lanes and priorities). */
  recogniserWorkers(): PoolWorker[] {
    return this.recogniserPool?.workers() ?? [];
  }

  /** Starts loading both models in their workers (once); resolves when they are ready. */
  start(): Promise<void> {
    return Promise.all([this.startRecognition(), this.startActivity()]).then(() => {});
  }

  /** Starts the recogniser processes (Moonshine), once; resolves when they are loaded. */
  startRecognition(): Promise<void> {
    return this.recognitionLoad.ensure();
  }

  /** Starts the voice activity process (Silero), once; resolves when it is loaded. */
  startActivity(): Promise<void> {
    return this.activityLoad.ensure();
  }

  /** Where each part's loading stands (`/metrics`): not started yet is not a failure. */
  loadStates(): Array<{ engine: string; state: LoadState }> {
    return [
      { engine: this.recognitions.name, state: this.recognitionLoad.state },
      { engine: this.activity.name, state: this.activityLoad.state },
    ];
  }

  async close(): Promise<void> {
    await Promise.all([this.recogniserPool?.close(), this.vadPool?.close()]);
  }

  /**
   * The words of 16 kHz mono audio (one utterance of at most ~20 s), as the model writes them;
   * `pad` seconds of silence added around it. A job of the scheduler: `job` says its class.
   */
  async recognise(audio: Float32Array, job: JobOptions = FILE, pad = { before: EDGE_PAD, after: EDGE_PAD }): Promise<string> {
    return (await this.recogniseHeard(audio, job, pad)).text;
  }

  /** `recognise()` with how sure the model is of the words. */
  async recogniseHeard(audio: Float32Array, job: JobOptions = FILE, pad = { before: EDGE_PAD, after: EDGE_PAD }): Promise<Heard> {
    // A conversation's recognition is a turn (or its speculative start): the conversation goes on.
    if (job.class === "conversation") this.conversedAt = performance.now();
    await this.startRecognition();
    // The front end is applied in the recogniser process, to each view of the audio (views.ts).
    return this.recognitions.runBatched<Float32Array, Heard>(await this.padded(audio, job, pad), job);
  }

  /**
   * An utterance as the recogniser hears it: a turn's denoised here (a file's audio was denoised
   * whole, in `run`; a turn's noise is in its own quiet frames), then padded with silence.
   */
  private async padded(audio: Float32Array, job: JobOptions, pad: { before: number; after: number }): Promise<Float32Array> {
    const before = Math.round(pad.before * RATE);
    const padded = new Float32Array(audio.length + before + Math.round(pad.after * RATE));
    padded.set(job.class !== "api" && this.turnDenoise ? await denoise(audio, this.turnDenoise) : audio, before);
    return padded;
  }

  /**
   * How likely Moonshine (`o.model`, base by default: the model that heard the words) finds each of
   * `texts` as the words of `audio` (padded as `recogniseHeard` pads it): each text's mean
   * log-probability per token (moonshine.ts, `score`). A job of the scheduler, as a recognition is.
   */
  async scoreTexts(
    audio: Float32Array,
    texts: readonly string[],
    job: JobOptions = LIVE,
    o: { pad?: { before: number; after: number }; model?: "base" | "tiny"; views?: View[] } = {},
  ): Promise<number[]> {
    const pad = o.pad ?? { before: EDGE_PAD, after: EDGE_PAD };
    await this.startRecognition();
    // Scored as it was heard (recogniseHeard, recogniseBatch): denoised and padded alike, the same front end and views (`o.views`: those of the recognition scored), in the process.
    const padded = await this.padded(audio, job, pad);
    const front = job.class === "api" ? this.frontEnd : this.turnFrontEnd;
    const views = o.views ?? this.viewsOf(job.class);
    return this.recognitions.run(async () => {
      const result = await this.recogniserPool!.run(
        { op: "score", audio: padded, texts: [...texts], fast: o.model === "tiny", views, frontEnd: front },
        { transfer: [padded.buffer as ArrayBuffer], urgent: job.class === "conversation" },
      );
      if (result.op !== "score") throw new Error("the recogniser answered another job");
      // A text the model cannot score at all (audio too short) is as unlikely as can be.
      return result.scores.map((x) => (typeof x === "number" && Number.isFinite(x) ? x : Number.NEGATIVE_INFINITY));
    }, job);
  }

  /** Utterances recognised in one job of a recogniser process (one, or a batch of a conversation's). */
  private async recogniseBatch(audios: Float32Array[], cls: JobClass, fast: boolean): Promise<Heard[]> {
    const result = await this.recogniserPool!.run(
      {
        op: "transcribe",
        audios,
        fast,
        beams: cls === "api" ? this.beams : this.turnBeams,
        views: this.viewsOf(cls),
        frontEnd: cls === "api" ? this.frontEnd : this.turnFrontEnd,
        ...(this.combine ? { combine: this.combine } : {}),
      },
      { transfer: audios.map((a) => a.buffer as ArrayBuffer), urgent: cls === "conversation", anyLane: cls === "api" && !this.conversing },
    );
    if (result.op !== "transcribe") throw new Error("the recogniser answered another job");
    this.batchesByModel[result.model]++;
    return result.heard.map((h) => ({ ...h, model: result.model, views: this.viewsOf(cls) }));
  }

  /** The views a job's utterance is heard in: files' and turns' own; partial words are heard once. */
  private viewsOf(cls: JobClass): View[] {
    return cls === "api" ? this.views : cls === "conversation" ? this.turnViews : [IDENTITY];
  }

  /**
   * Speech probabilities of each whole 512-sample frame of `audio`, continuing from `state`. A job
   * of the scheduler: conversations' jobs waiting together are scored in one batch.
   */
  async vadFrames(audio: Float32Array, state: VadState, job: JobOptions = FILE): Promise<VadResult> {
    await this.startActivity();
    return this.activity.runBatched<VadItem, VadResult>({ audio, state }, job);
  }

  /** Streams' audio scored in one job of the voice activity process. */
  private async scoreBatch(items: VadItem[]): Promise<VadResult[]> {
    const result = await this.vadPool!.run({ op: "vad", items });
    if (result.op !== "vad") throw new Error("the voice activity detector answered another job");
    return result.results;
  }

  /**
   * Whether a conversation took a turn lately (or a detector was made for one): one recogniser
   * process is then kept for conversations (with two or more).
   */
  get conversing(): boolean {
    return performance.now() - this.conversedAt < this.conversingForMs;
  }

  /** Probabilities of a whole file, scored in jobs of FILE_VAD_JOB_S of audio each (a conversation's job may run between two). */
  private async fileFrames(audio: Float32Array, job: JobOptions): Promise<Float32Array> {
    const usable = audio.length - (audio.length % VAD_FRAME);
    const step = FILE_VAD_JOB_S * RATE - ((FILE_VAD_JOB_S * RATE) % VAD_FRAME);
    const out = new Float32Array(usable / VAD_FRAME);
    let state = initialVadState();
    for (let at = 0; at < usable; at += step) {
      const scored = await this.vadFrames(audio.slice(at, Math.min(usable, at + step)), state, job);
      out.set(scored.probabilities, at / VAD_FRAME);
      state = scored.state;
    }
    return out;
  }

  transcribe(o: TranscribeOptions, progress: TranscribeProgress = {}): Promise<Transcript> {
    if (o.language !== undefined && !this.languages.includes(o.language.toLowerCase()))
      return Promise.reject(new UnsupportedLanguageError(o.language, this.languages));
    if (!this.queue.accepts()) return Promise.reject(new EngineBusyError("The transcription engine is busy; try again shortly."));
    const job: JobOptions = { ...FILE, ...(o.caller !== undefined ? { caller: o.caller } : {}), ...(o.signal ? { signal: o.signal } : {}) };
    const refusal = this.recognitions.admit({ ...job, ...(o.maxWaitMs !== undefined ? { maxWaitMs: o.maxWaitMs } : {}) });
    if (refusal) return Promise.reject(refusal);
    return this.run(o, progress, job);
  }

  private async run(o: TranscribeOptions, progress: TranscribeProgress, job: JobOptions): Promise<Transcript> {
    if (o.signal?.aborted) throw abortReason(o.signal);
    // Bounded in duration and CPU time, in memory (decode.ts); the queue bounds the files decoded at once.
    const decoded = await this.queue.run(
      () =>
        decodeAudio(o.audio, {
          ...(o.maxSeconds !== undefined ? { maxSeconds: o.maxSeconds } : {}),
          ...(o.signal ? { signal: o.signal } : {}),
        }),
      o.signal,
    );
    if (decoded.sampleRate !== RATE) throw new Error("the decoder's rate is not the recogniser's");
    const duration = decoded.samples.length / RATE;
    const probabilities = await this.fileFrames(decoded.samples, job);
    if (o.signal?.aborted) throw abortReason(o.signal);
    const audio = this.denoise ? await denoise(decoded.samples, this.denoise, nonSpeech(probabilities)) : decoded.samples;
    progress.onStart?.(duration);
    const segments: TranscriptSegment[] = [];
    // The pieces depend on the audio alone (the same words whatever the load); up to one a process
    // runs at once, so that idle processes serve the file, and their words are handed out in order.
    const pieces = new FileSpeech(probabilities, duration).pieces;
    const recognise = (region: Piece) => {
      const pad = { before: region.start <= 0 || region.cutBefore ? EDGE_PAD : 0, after: region.end >= duration || region.cutAfter ? EDGE_PAD : 0 };
      return this.recogniseHeard(slice(audio, region), job, pad);
    };
    const texts: Promise<Heard>[] = [];
    // Each job that ends starts the next piece, whichever ended: no process waits for an earlier piece's.
    const launch = () => {
      if (texts.length >= pieces.length || o.signal?.aborted) return;
      const text = recognise(pieces[texts.length]!);
      texts.push(text);
      text.then(launch, () => {});
    };
    for (let i = 0; i < this.processes; i++) launch();
    for (const [i, region] of pieces.entries()) {
      if (o.signal?.aborted) throw abortReason(o.signal);
      const raw = (await texts[i]!).text;
      if (o.signal?.aborted) throw abortReason(o.signal);
      const text = normaliseTranscript(raw);
      if (!text) continue;
      const segment = { id: segments.length, start: round(region.start), end: round(region.end), text };
      segments.push(segment);
      progress.onSegment?.(segment);
    }
    return { language: "en", duration, text: segments.map((s) => s.text).join(" "), segments };
  }

  /** A voice activity detector for one live stream (see vad.ts). */
  createVad(options: VadOptions = {}): LiveVad {
    this.conversedAt = performance.now();
    return new LiveVad(this, options);
  }

  /** A recogniser for one live stream (see the top of this file). */
  createIncrementalRecogniser(): IncrementalRecogniser {
    return new IncrementalRecogniser(this);
  }
}

/** Below this probability a detector's frame is no speech; a frame counts as noise when its neighbours are none either. */
const NOISE_PROBABILITY = 0.2;
const NOISE_MARGIN_FRAMES = 3;

/** Whether the audio around a sample is noise alone by the detector's frame probabilities (a file's). */
export function nonSpeech(probabilities: Float32Array): (sample: number) => boolean {
  const quiet = new Uint8Array(probabilities.length);
  for (let f = 0; f < probabilities.length; f++) {
    let none = true;
    for (let g = Math.max(0, f - NOISE_MARGIN_FRAMES); g <= Math.min(probabilities.length - 1, f + NOISE_MARGIN_FRAMES) && none; g++)
      none = probabilities[g]! < NOISE_PROBABILITY;
    quiet[f] = none ? 1 : 0;
  }
  return (sample) => quiet[Math.floor(sample / VAD_FRAME)] === 1;
}

/** Voice activity over live audio: frames are scored in the VAD worker, ahead of file work. */
export class LiveVad {
  private readonly engine: MoonshineEngine;
  private readonly tracker: SpeechTracker;
  private state = initialVadState();
  private rest = new Float32Array(0);

  constructor(engine: MoonshineEngine, options: VadOptions) {
    this.engine = engine;
    this.tracker = new SpeechTracker(options);
  }

  /** Whether speech is going on. */
  get speaking(): boolean {
    return this.tracker.speaking;
  }

  /** Adds 16 kHz mono audio; the speech that started or ended in it. Do not overlap calls. */
  async push(pcm: Float32Array | Int16Array): Promise<VadEvent[]> {
    const audio = concatFloat32([this.rest, toFloat32(pcm)]);
    const usable = audio.length - (audio.length % VAD_FRAME);
    this.rest = audio.slice(usable);
    if (usable === 0) return [];
    const { probabilities, state } = await this.engine.vadFrames(audio.slice(0, usable), this.state, LIVE);
    this.state = state;
    return this.tracker.push(probabilities);
  }

  /** The end of speech still going on, for a stream that stops. */
  flush(): VadEvent[] {
    return this.tracker.flush();
  }
}

/** Partial text is recognised again only once this much new audio arrived. */
const PARTIAL_STEP = 0.5;
/** Partial text covers at most this much of the latest audio. */
const PARTIAL_WINDOW = 10;
/** Below this RMS (of 1) audio is silence: for `finish()`'s reuse and the end-of-speech guess. */
const SILENCE_RMS = 0.01;
/** This much silence after speech starts recognising the utterance before anyone asks. */
const SPECULATE_AFTER = 0.15;
/** Energy is judged in blocks of 20 ms. */
const BLOCK = 320;
const MAX_UTTERANCE = 20;

/** What a live stream's recogniser asks of the engine (the fast tests give a fake one). */
export type LiveRecognition = Pick<MoonshineEngine, "recognise" | "recogniseHeard" | "recogniserIdle"> & Partial<Pick<MoonshineEngine, "scoreTexts">>;

/**
 * One live stream's utterance. Recognition of the whole utterance starts on its own as soon as
 * 150 ms of silence follow speech (the turn detector reports the end of speech only after its own
 * silence, 300 ms or more): `finish()` then has the text already, or soon, instead of starting then.
 */
export class IncrementalRecogniser {
  private readonly engine: LiveRecognition;
  private chunks: Float32Array[] = [];
  private samples = 0;
  private last: { samples: number; heard: Heard } | undefined;
  /** The audio each recognition heard (for `scoreHeard`). */
  private readonly windows = new WeakMap<Heard, Float32Array>();
  private running: Promise<Heard> | undefined;
  private runningSamples = 0;
  /** Samples of silence at the end of the utterance so far. */
  private quietTail = 0;
  /** Whether speech (loud audio) arrived after the audio the last recognition covered. */
  private spokeSinceJob = false;
  /** A block's worth of samples not yet judged. */
  private pending = new Float32Array(0);

  constructor(engine: LiveRecognition) {
    this.engine = engine;
  }

  /** Seconds of audio in the current utterance. */
  get duration(): number {
    return this.samples / RATE;
  }

  /** Adds 16 kHz mono audio to the current utterance. */
  push(pcm: Float32Array | Int16Array): void {
    const audio = pcm instanceof Float32Array ? pcm.slice() : toFloat32(pcm);
    this.chunks.push(audio);
    this.samples += audio.length;
    const blocks = concatFloat32([this.pending, audio]);
    let at = 0;
    for (; at + BLOCK <= blocks.length; at += BLOCK) {
      if (quiet(blocks.subarray(at, at + BLOCK))) this.quietTail += BLOCK;
      else {
        this.quietTail = 0;
        this.spokeSinceJob = true;
      }
    }
    this.pending = blocks.slice(at);
    if (
      this.spokeSinceJob &&
      !this.running &&
      this.quietTail >= SPECULATE_AFTER * RATE &&
      this.samples <= PARTIAL_WINDOW * RATE &&
      this.engine.recogniserIdle(LIVE)
    ) {
      this.recognise(this.audio(), this.samples).catch(() => {});
    }
  }

  /**
   * The text of the utterance so far: recognised again at most every 0.5 s of audio, over at most
   * the last 10 s, and only while the recogniser is idle (otherwise the last text, possibly "").
   */
  async partial(): Promise<string> {
    return (await this.soFar(PARTIAL)).text;
  }

  /**
   * The same at a pause in speech, where the text is likely the final one: its job is as urgent as a
   * final transcript's, and its text covers every word said so far, since the end of turn judges
   * them ("set a timer for" must not be judged as "set a timer", the words of a recognition that
   * began before "for").
   */
  async speculate(): Promise<string> {
    return (await this.heardSoFar()).text;
  }

  /** `speculate()` with how sure the model is of the words (Heard.logprob). */
  async heardSoFar(): Promise<Heard> {
    for (;;) {
      const running = this.running;
      if (running) {
        if (this.quietSince(this.runningSamples)) return running;
        await running.catch(() => {});
        continue;
      }
      if (this.last && this.quietSince(this.last.samples)) return this.last.heard;
      const audio = this.audio();
      return this.recognise(audio.subarray(Math.max(0, audio.length - PARTIAL_WINDOW * RATE)), audio.length, LIVE);
    }
  }

  /**
   * How likely the model finds each of `texts` as the words of the audio it heard as `heard` (an
   * answer of `heardSoFar()`), each a mean log-probability per token; [] when the engine cannot say.
   */
  async scoreHeard(heard: Heard, texts: readonly string[]): Promise<number[]> {
    const window = this.windows.get(heard);
    if (!window || !this.engine.scoreTexts) return [];
    // Scored by the model that heard them: tiny's probabilities are not base's.
    // … and heard as they were (the views of their recognition: a partial's are not a turn's).
    return this.engine.scoreTexts(window, texts, LIVE, { ...(heard.model ? { model: heard.model } : {}), ...(heard.views ? { views: heard.views } : {}) });
  }

  /** Whether nothing but silence was pushed after the first `samples` of the utterance. */
  private quietSince(samples: number): boolean {
    return quiet(this.audio().subarray(samples));
  }

  private soFar(job: JobOptions): Promise<Heard> {
    if (this.running) return this.running;
    if (this.last && this.samples - this.last.samples < PARTIAL_STEP * RATE) return Promise.resolve(this.last.heard);
    if (!this.engine.recogniserIdle(job)) return Promise.resolve(this.last?.heard ?? { text: "", logprob: 0 });
    const audio = this.audio();
    const window = audio.subarray(Math.max(0, audio.length - PARTIAL_WINDOW * RATE));
    return this.recognise(window, audio.length, job);
  }

  /**
   * The final text of everything pushed since the last `finish()`; the next push starts a new
   * utterance. Throws OverloadedError when its recognition cannot start within `o.maxWaitMs`.
   */
  async finish(o: { maxWaitMs?: number } = {}): Promise<string> {
    const audio = this.audio();
    this.chunks = [];
    this.samples = 0;
    this.quietTail = 0;
    this.spokeSinceJob = false;
    this.pending = new Float32Array(0);
    const last = this.last;
    this.last = undefined;
    const running = this.running;
    const runningSamples = this.runningSamples;
    this.running = undefined;
    // A recognition of everything but trailing silence is the final text already.
    if (running && audio.length <= PARTIAL_WINDOW * RATE && quiet(audio.subarray(runningSamples))) return (await running).text;
    if (running) await running.catch(() => {});
    if (last && audio.length <= PARTIAL_WINDOW * RATE && quiet(audio.subarray(last.samples))) return last.heard.text;
    const parts: string[] = [];
    for (let at = 0; at < audio.length; at += MAX_UTTERANCE * RATE) {
      const job = { ...LIVE, ...(at === 0 && o.maxWaitMs !== undefined ? { maxWaitMs: o.maxWaitMs } : {}) };
      const text = normaliseTranscript(await this.engine.recognise(audio.slice(at, at + MAX_UTTERANCE * RATE), job));
      if (text) parts.push(text);
    }
    return parts.join(" ");
  }

  private recognise(window: Float32Array, samples: number, options: JobOptions = LIVE): Promise<Heard> {
    this.runningSamples = samples;
    this.spokeSinceJob = false;
    const job = this.engine
      .recogniseHeard(window.slice(), options)
      .then((raw) => {
        const heard: Heard = {
          text: normaliseTranscript(raw.text),
          logprob: raw.logprob,
          ...(raw.model ? { model: raw.model } : {}),
          ...(raw.views ? { views: raw.views } : {}),
        };
        // A finish() may have started a new utterance meanwhile; this text belongs to the old one.
        this.windows.set(heard, window);
        if (this.running === job) this.last = { samples, heard };
        return heard;
      })
      .finally(() => {
        if (this.running === job) this.running = undefined;
      });
    this.running = job;
    return job;
  }

  private audio(): Float32Array {
    if (this.chunks.length !== 1) this.chunks = [concatFloat32(this.chunks)];
    return this.chunks[0]!;
  }
}

/** Whether two utterances' lengths are close enough to share a batch. */
function alike(a: number, b: number): boolean {
  return Math.max(a, b) <= BATCH_LENGTH_RATIO * Math.min(a, b);
}

function quiet(audio: Float32Array): boolean {
  let sum = 0;
  for (const x of audio) sum += x * x;
  return audio.length === 0 || Math.sqrt(sum / audio.length) < SILENCE_RMS;
}

function slice(audio: Float32Array, region: Region): Float32Array {
  return audio.slice(Math.floor(region.start * RATE), Math.ceil(region.end * RATE));
}

function round(seconds: number): number {
  return Math.round(seconds * 100) / 100;
}
