/**
 * The embedded engines' scheduler: small jobs (one sentence of synthesis, one utterance or region
 * of recognition, one batch of voice activity) from every request, run on a fixed number of
 * workers in this order:
 * 1. `conversation`: a voice turn's final transcript and its reply's sentences, first come first served;
 * 2. `api`: Compatible API requests, fair among callers (start-time fair queuing, every job one
 *    unit: a caller with 18 requests open gets no more turns than a caller with one, and a caller
 *    that comes back after a pause goes next rather than behind the backlog), first come first
 *    served within a caller;
 * 3. `partial`: partial transcripts while someone speaks, when nothing else waits.
 * A scheduler may keep slots for conversations (`reserved`): the other classes never take the last ones.
 * A job is never interrupted once it runs (flite and onnxruntime cannot be), so a request that is
 * given up only loses its place in the queue.
 *
 * Batching (optional): jobs given as payloads of a class the engine batches run together, up to
 * `max` of them waiting in that class one after another (and `fits` the first), as one job on one
 * worker: a recogniser decodes several utterances in one pass for little more than one costs.
 *
 * Degradation (optional, batched conversations only): when the conversation jobs waiting (the batch
 * about to start and those behind it), at the measured time a batch takes, would not all finish
 * within `fastAfterMs` of being queued, the batch runs in the engine's fast mode (a smaller model:
 * fewer words right, but the reply on time). "A batch takes" is the running mean of conversation
 * batches in full mode; a file's long job says nothing of it. Fast batches move it too, in
 * proportion to how their own time moves against their mean: without that, a full-mode mean measured
 * under load would send every later turn fast for good, nothing running in full mode to lower it.
 *
 * Admission: a job may carry `maxWaitMs`. When the queue's own estimate (the jobs ahead of it, at
 * the measured time a job takes) says it cannot start within that, an `api` or `partial` job is
 * refused at once with OverloadedError (and a `retryAfter` from the same estimate); any job still
 * waiting when that time has passed (a conversation's, or one the estimate let in) is refused then.
 */
import { abortReason, EngineBusyError } from "./errors.ts";

export type JobClass = "conversation" | "api" | "partial";
export const JOB_CLASSES: readonly JobClass[] = ["conversation", "api", "partial"];

export interface JobOptions {
  class: JobClass;
  /** Whose job (an `api` job's fair-queuing key); one key for all when absent. */
  caller?: string;
  /** Refused (OverloadedError) when it cannot start within this many milliseconds. */
  maxWaitMs?: number;
  /** Leaves the queue when aborted (a running job runs on; its result is dropped by the caller). */
  signal?: AbortSignal;
}

/** The engine cannot start the work in time: a 429 with `Retry-After` on the Compatible API, `overloaded` in a voice turn. */
export class OverloadedError extends EngineBusyError {
  constructor(message: string, retryAfter: number) {
    super(message, retryAfter);
    this.name = "OverloadedError";
  }
}

/** Time as the scheduler sees it (tests give a fake one). */
export interface SchedulerClock {
  now(): number;
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

const systemClock: SchedulerClock = {
  now: () => performance.now(),
  setTimeout: (fn, ms) => {
    const t = setTimeout(fn, ms);
    t.unref();
    return t;
  },
  clearTimeout: (handle) => clearTimeout(handle as NodeJS.Timeout),
};

/** How an engine runs several waiting jobs' payloads as one job. */
export interface Batching<P = unknown, R = unknown> {
  /** The classes whose jobs are batched. */
  classes: readonly JobClass[];
  /** Most payloads in one batch. */
  max: number;
  /** Whether `other` may run in a batch with `first` (lengths alike: a batch is padded to its longest). */
  fits(first: P, other: P): boolean;
  /** The results of `payloads` (jobs of class `cls`), in order; `fast`: in the engine's fast mode. */
  run(payloads: P[], cls: JobClass, fast: boolean): Promise<R[]>;
  /** Conversation batches go fast when a waiting job would otherwise finish later than this after it was queued (none: never). */
  fastAfterMs?: number;
}

export interface SchedulerOptions {
  /** For messages and metrics: "speech", "recognition", "voice_activity". */
  name: string;
  /** Jobs running at once (the engine's workers). */
  slots: number;
  /** What a job is assumed to take before any has run, in ms. */
  initialJobMs: number;
  clock?: SchedulerClock;
  batching?: Batching;
  /**
   * Slots kept for `conversation` jobs, asked each time a job could start (default none): other
   * jobs start only while more than this many slots are free, so a turn never waits behind them.
   */
  reserved?: () => number;
}

/** Counters of one class, since the scheduler started (for /metrics). */
export interface ClassStats {
  /** Jobs waiting now. */
  depth: number;
  /** Seconds the oldest waiting job has waited. */
  oldestWait: number;
  /** Jobs started. */
  started: number;
  /** Seconds jobs waited before they started, summed. */
  waited: number;
  /** Jobs refused (would not start in time). */
  refused: number;
  /** Jobs run in the engine's fast mode (degraded to keep their deadline). */
  degraded: number;
}

interface Job {
  cls: JobClass;
  caller: string;
  /** An `api` job's virtual start: its caller's previous job's tag + 1, or the virtual time now if later. */
  tag: number;
  /** What the job runs, or its payload for the engine's batch runner. */
  work: (() => Promise<unknown>) | { payload: unknown };
  resolve: (value: unknown) => void;
  reject: (error: unknown) => void;
  queuedAt: number;
  maxWaitMs: number | undefined;
  signal: AbortSignal | undefined;
  onAbort: (() => void) | undefined;
  timer: unknown;
}

/** Weight of the newest job's duration in the running mean. */
const SMOOTHING = 0.2;

export class Scheduler {
  readonly name: string;
  readonly slots: number;
  private readonly clock: SchedulerClock;
  private readonly batching: Batching | undefined;
  private readonly reserved: () => number;
  private running = 0;
  /** Jobs handed to workers, a batch counting once. */
  private dispatched = 0;
  private meanMs: number;
  /** The running mean of conversation batches run in full mode (degradation's measure). */
  private turnMeanMs: number;
  /** The running mean of fast conversation batches (undefined until one ran). */
  private fastMeanMs: number | undefined;
  private readonly conversation: Job[] = [];
  private readonly partial: Job[] = [];
  /** Waiting `api` jobs; the one with the lowest tag runs first. */
  private readonly api: Job[] = [];
  /** The tag after each caller's last `api` job, and the tag of the last one started (the virtual time). */
  private readonly nextTag = new Map<string, number>();
  private virtualTime = 0;
  private readonly counters = new Map<JobClass, { started: number; waited: number; refused: number; degraded: number }>(
    JOB_CLASSES.map((c) => [c, { started: 0, waited: 0, refused: 0, degraded: 0 }]),
  );

  constructor(o: SchedulerOptions) {
    if (!(o.slots >= 1)) throw new RangeError("a scheduler needs at least one slot");
    this.name = o.name;
    this.slots = o.slots;
    this.meanMs = o.initialJobMs;
    this.turnMeanMs = o.initialJobMs;
    this.clock = o.clock ?? systemClock;
    this.batching = o.batching;
    this.reserved = o.reserved ?? (() => 0);
  }

  /**
   * Whether a job of `cls` would start at once: nothing that goes before it waits and a slot it may
   * take is free (only a conversation's may take the slots kept for conversations, and only other
   * conversations' jobs go before it: a file's job waiting for a process does not).
   */
  idleFor(cls: JobClass): boolean {
    if (cls === "conversation") return this.conversation.length === 0 && this.slots > this.running;
    return this.waiting === 0 && this.slots - this.running > Math.min(this.slots - 1, this.reserved());
  }

  /** Jobs waiting, of every class. */
  get waiting(): number {
    return this.conversation.length + this.api.length + this.partial.length;
  }

  /** Jobs running now. */
  get busy(): number {
    return this.running;
  }

  /** Runs handed to the workers since the start (a batch of jobs counts once). */
  get runs(): number {
    return this.dispatched;
  }

  /** The measured mean time of a job, in ms. */
  get jobMs(): number {
    return this.meanMs;
  }

  /**
   * Whether a batch of `batch` (conversation jobs), with `behind` still waiting after it, should run
   * fast: at the mean time of a conversation batch in full mode (batches run `slots` at a time, this
   * one first), some job would finish more than `fastAfterMs` after it was queued.
   */
  private goesFast(batch: readonly Job[], behind: readonly Job[]): boolean {
    const limit = this.batching?.fastAfterMs;
    if (limit === undefined || batch[0]?.cls !== "conversation") return false;
    const now = this.clock.now();
    const max = this.batching!.max;
    const late = (job: Job, batchIndex: number) => now + (Math.floor(batchIndex / this.slots) + 1) * this.turnMeanMs - job.queuedAt > limit;
    return batch.some((job) => late(job, 0)) || behind.some((job, i) => late(job, 1 + Math.floor(i / max)));
  }

  /**
   * How long a job of `cls` (from `caller`) asked for now would wait before it starts, in ms: the
   * jobs that would run before it, shared among the slots, at the mean time of a job. A job that
   * cannot start at once waits at least for the first slot to free (by the same mean).
   */
  estimate(cls: JobClass, caller = ""): number {
    // Waiting jobs of a batched class run `max` at a time.
    const batches = (n: number, c: JobClass) => (this.batching?.classes.includes(c) ? Math.ceil(n / this.batching.max) : n);
    let ahead = batches(this.conversation.length, "conversation");
    if (cls === "api") {
      const tag = this.tagFor(caller);
      for (const job of this.api) if (job.tag <= tag) ahead++;
    } else if (cls === "partial") ahead += this.api.length + this.partial.length;
    // Other classes than conversations' have only the slots not reserved.
    const slots = cls === "conversation" ? this.slots : this.slots - Math.min(this.slots - 1, this.reserved());
    const free = Math.max(0, slots - this.running);
    if (ahead < free) return 0;
    return ((ahead - free + 1) * this.meanMs) / slots;
  }

  /** Counters per class (see ClassStats). */
  stats(): Record<JobClass, ClassStats> {
    const now = this.clock.now();
    const oldest = (jobs: Iterable<Job>) => {
      let first = now;
      for (const j of jobs) first = Math.min(first, j.queuedAt);
      return (now - first) / 1000;
    };
    const waiting: Record<JobClass, Job[]> = { conversation: this.conversation, api: this.api, partial: this.partial };
    const out = {} as Record<JobClass, ClassStats>;
    for (const cls of JOB_CLASSES) out[cls] = { depth: waiting[cls].length, oldestWait: oldest(waiting[cls]), ...this.counters.get(cls)! };
    return out;
  }

  /**
   * The refusal a job with these options would get now (counted as refused), or undefined when it
   * would be queued. A conversation's job is never refused by the estimate, only by its deadline:
   * one long job running (a file's 20 s region) inflates the mean far beyond what a turn waits.
   */
  admit(o: JobOptions): OverloadedError | undefined {
    if (o.maxWaitMs === undefined || o.class === "conversation") return undefined;
    const wait = this.estimate(o.class, o.caller);
    return wait > o.maxWaitMs ? this.refuse(o.class, wait, o.maxWaitMs) : undefined;
  }

  /** Runs `work` when its turn comes; see the top of this file. */
  run<T>(work: () => Promise<T>, o: JobOptions): Promise<T> {
    return this.submit(work, o) as Promise<T>;
  }

  /** Runs `payload` through the engine's batch runner when its turn comes, with others of its class when they fit. */
  runBatched<P, R>(payload: P, o: JobOptions): Promise<R> {
    if (!this.batching) throw new Error(`the ${this.name} scheduler does not batch`);
    return this.submit({ payload }, o) as Promise<R>;
  }

  private submit(work: Job["work"], o: JobOptions): Promise<unknown> {
    if (o.signal?.aborted) return Promise.reject(abortReason(o.signal));
    const caller = o.caller ?? "";
    const refusal = this.admit(o);
    if (refusal) return Promise.reject(refusal);
    return new Promise<unknown>((resolve, reject) => {
      const job: Job = {
        cls: o.class,
        caller,
        tag: 0,
        work,
        resolve,
        reject,
        queuedAt: this.clock.now(),
        maxWaitMs: o.maxWaitMs,
        signal: o.signal,
        onAbort: undefined,
        timer: undefined,
      };
      this.enqueue(job);
      this.dispatch();
      // Still waiting (no slot was free): it may leave by abort or by its deadline.
      if (!this.isQueued(job)) return;
      if (o.signal) {
        job.onAbort = () => {
          if (this.remove(job)) reject(abortReason(o.signal!));
        };
        o.signal.addEventListener("abort", job.onAbort, { once: true });
      }
      if (o.maxWaitMs !== undefined) {
        job.timer = this.clock.setTimeout(() => {
          if (this.remove(job)) reject(this.refuse(job.cls, this.estimate(job.cls, job.caller), o.maxWaitMs!));
        }, o.maxWaitMs);
      }
    });
  }

  /** A refusal, counted, with the seconds after which the queue should have room again. */
  private refuse(cls: JobClass, waitMs: number, maxWaitMs: number): OverloadedError {
    this.counters.get(cls)!.refused++;
    const retryAfter = Math.max(1, Math.ceil((waitMs - maxWaitMs) / 1000));
    return new OverloadedError(`The ${this.name} engine is overloaded: the work could not start within ${maxWaitMs} ms; try again shortly.`, retryAfter);
  }

  /** The tag a new `api` job of `caller` would get. */
  private tagFor(caller: string): number {
    return Math.max(this.virtualTime, this.nextTag.get(caller) ?? 0);
  }

  private queueOf(job: Job): Job[] {
    return job.cls === "conversation" ? this.conversation : job.cls === "partial" ? this.partial : this.api;
  }

  private enqueue(job: Job): void {
    if (job.cls === "api") {
      job.tag = this.tagFor(job.caller);
      this.nextTag.set(job.caller, job.tag + 1);
    }
    this.queueOf(job).push(job);
  }

  private isQueued(job: Job): boolean {
    return this.queueOf(job).includes(job);
  }

  /** Takes a waiting job out of its queue; false when it was not waiting (it started or left). */
  private remove(job: Job): boolean {
    const list = this.queueOf(job);
    const i = list.indexOf(job);
    if (i < 0) return false;
    list.splice(i, 1);
    this.settle(job);
    return true;
  }

  /**
   * The next job: a conversation's, else (while more slots are free than are reserved for
   * conversations) the `api` job with the lowest tag (the earliest of equals), else a partial.
   */
  private next(): Job | undefined {
    const urgent = this.conversation.shift();
    if (urgent) return urgent;
    if (this.slots - this.running <= Math.min(this.slots - 1, this.reserved())) return undefined;
    if (this.api.length > 0) {
      let best = 0;
      for (let i = 1; i < this.api.length; i++) if (this.api[i]!.tag < this.api[best]!.tag) best = i;
      const [job] = this.api.splice(best, 1);
      this.virtualTime = job!.tag;
      // Callers whose tags the virtual time has passed start afresh from it: no memory to keep.
      for (const [caller, tag] of this.nextTag) if (tag <= this.virtualTime) this.nextTag.delete(caller);
      return job;
    }
    return this.partial.shift();
  }

  private settle(job: Job): void {
    if (job.onAbort) job.signal?.removeEventListener("abort", job.onAbort);
    if (job.timer !== undefined) this.clock.clearTimeout(job.timer);
  }

  /** Waiting jobs that run in one batch with `first` (itself included). */
  private batchWith(first: Job): Job[] {
    const batching = this.batching;
    if (!batching || typeof first.work === "function" || !batching.classes.includes(first.cls)) return [first];
    const head = first.work.payload;
    const batch = [first];
    const queue = this.queueOf(first);
    for (let i = 0; i < queue.length && batch.length < batching.max; ) {
      const other = queue[i]!;
      if (typeof other.work !== "function" && batching.fits(head, other.work.payload)) {
        queue.splice(i, 1);
        batch.push(other);
      } else i++;
    }
    return batch;
  }

  private dispatch(): void {
    while (this.running < this.slots) {
      const first = this.next();
      if (!first) return;
      const jobs = this.batchWith(first);
      const started = this.clock.now();
      for (const job of jobs) {
        this.settle(job);
        const counter = this.counters.get(job.cls)!;
        counter.started++;
        counter.waited += (started - job.queuedAt) / 1000;
      }
      const fast = typeof first.work !== "function" && this.goesFast(jobs, this.queueOf(first));
      if (fast) this.counters.get(first.cls)!.degraded += jobs.length;
      this.running++;
      this.dispatched++;
      let work: Promise<unknown>;
      try {
        work =
          typeof first.work === "function"
            ? first.work()
            : this.batching!.run(
                jobs.map((j) => (j.work as { payload: unknown }).payload),
                first.cls,
                fast,
              );
      } catch (error) {
        work = Promise.reject(error);
      }
      // The slot is free before the jobs' callers hear back, so that what they ask next sees it free.
      const ended = () => {
        this.running--;
        const took = this.clock.now() - started;
        if (fast) {
          // The full model would have taken as much longer or shorter than its mean as the fast one did.
          if (this.fastMeanMs !== undefined && this.fastMeanMs > 0) this.turnMeanMs *= 1 + SMOOTHING * (took / this.fastMeanMs - 1);
          this.fastMeanMs = this.fastMeanMs === undefined ? took : this.fastMeanMs + SMOOTHING * (took - this.fastMeanMs);
          return;
        }
        this.meanMs += SMOOTHING * (took - this.meanMs);
        if (first.cls === "conversation" && typeof first.work !== "function") this.turnMeanMs += SMOOTHING * (took - this.turnMeanMs);
      };
      work.then(
        (result) => {
          ended();
          if (typeof first.work === "function") first.resolve(result);
          else for (const [i, job] of jobs.entries()) job.resolve((result as unknown[])[i]);
          this.dispatch();
        },
        (error) => {
          ended();
          for (const job of jobs) job.reject(error);
          this.dispatch();
        },
      );
    }
  }
}
