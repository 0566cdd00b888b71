import { type ChildProcess, fork } from "node:child_process";
import { readdirSync, readlinkSync } from "node:fs";
import { getPriority, setPriority } from "node:os";
import { type Transferable, Worker } from "node:worker_threads";

/**
 * A job's failure as a worker reports it. `code` and `errcode` are the error's own (node:sqlite
 * sets both; a Node system error sets `code`), so that the caller can tell one failure from
 * another (a busy or full database from a bad query).
 */
export type JobError = { type: "error"; id: number; error: string; code?: string; errcode?: number };

/**
 * What a pooled worker says: once `ready` (its model is loaded) or `failed` (it never will be),
 * then one `done` or `error` per job, in any order.
 */
export type PoolMessage<Res> = ReadyMessage | { type: "failed"; error: string } | { type: "done"; id: number; result: Res } | JobError;

/** A worker's `ready`: a thread says its own thread id, so that the pool can set its priority. */
export interface ReadyMessage {
  type: "ready";
  tid?: number;
}

/** The `ready` message a worker posts once loaded (with its thread's id where the system says it: Linux). */
export function readyMessage(): ReadyMessage {
  try {
    // "/proc/thread-self" links to "<pid>/task/<tid>".
    const tid = Number(readlinkSync("/proc/thread-self").split("/").pop());
    if (Number.isInteger(tid) && tid > 0) return { type: "ready", tid };
  } catch {}
  return { type: "ready" };
}

/** The `error` message for job `id` that failed with `error` (for workers to post). */
export function jobError(id: number, error: unknown): JobError {
  const e = error as { code?: unknown; errcode?: unknown } | null | undefined;
  return {
    type: "error",
    id,
    error: error instanceof Error ? error.message : String(error),
    ...(typeof e?.code === "string" ? { code: e.code } : {}),
    ...(typeof e?.errcode === "number" ? { errcode: e.errcode } : {}),
  };
}

/** What a pooled worker receives: one job at a time. */
export interface PoolJob<Req> {
  id: number;
  request: Req;
}

export interface WorkerPoolOptions {
  /** The worker's module. */
  script: URL;
  /** Passed to every worker as `workerData`. */
  workerData?: unknown;
  /** Workers started; each runs one job at a time. */
  size: number;
  /** A name for error messages ("flite", "recogniser", "database read"). */
  name: string;
  /**
   * The error a job gets when its worker ends under it (default: the worker's exit as an Error);
   * the store answers such a job with its own "unavailable" error.
   */
  lostError?: (cause: Error) => Error;
  /**
   * Where each worker runs: a thread (the default), or a child process for native code that must
   * not take the server down with it (onnxruntime aborts the whole process when a thread holding
   * a session is terminated). A process worker reads its data from PERCH_WORKER_DATA (JSON).
   */
  isolation?: "thread" | "process";
  /**
   * Workers (of `size`) that run at a lower OS priority (niceness +10, Linux): background work
   * (the Compatible API's, partial transcripts) runs only on them, urgent work (conversations)
   * prefers the others and may take a free one of them. Default 0: every worker alike, every job on any.
   */
  background?: number;
  /**
   * Where the pool's warning goes, once, when its workers' priorities cannot be set: the node's log
   * (each pool says it to its own node; default `process.emitWarning`).
   */
  warn?: (message: string) => void;
}

/** A worker's lane: foreground workers keep the process's priority, background ones run below it. */
export type Lane = "foreground" | "background";

/** How much lower a background worker runs (niceness added, up to 19). */
export const BACKGROUND_NICENESS = 10;

/**
 * Lowers the priority of the threads `ids` (a thread's id, or every thread of a process) to
 * `niceness`; false when the system refuses (`warn` hears why). An unprivileged process cannot
 * raise it again: the worker keeps it for its life.
 */
function lowerPriority(ids: number[], niceness: number, warn: (reason: string) => void): boolean {
  try {
    if (ids.length === 0) throw new Error("the worker's thread id is unknown on this system");
    for (const id of ids) {
      try {
        setPriority(id, niceness);
      } catch (error) {
        // A thread that ended since the process's threads were listed has nothing to lower.
        if ((error as { info?: { code?: string } }).info?.code !== "ESRCH") throw error;
      }
    }
    return true;
  } catch (error) {
    warn(error instanceof Error ? error.message : String(error));
    return false;
  }
}

/** Every thread of process `pid` (Linux), or the process alone. */
function threadsOf(pid: number): number[] {
  try {
    return readdirSync(`/proc/${pid}/task`)
      .map(Number)
      .filter((t) => t > 0);
  } catch {
    return [pid];
  }
}

/** What the pool needs of a worker thread or a child process. */
interface Runner {
  post(message: unknown, transfer: Transferable[]): void;
  onMessage(listener: (message: unknown) => void): void;
  /** Called once, however the runner ended. */
  onGone(listener: (error: Error) => void): void;
  ref(): void;
  unref(): void;
  terminate(): Promise<void>;
  /** The thread's id, or the child's process id. */
  id: number;
  /** The child's process id (process isolation only). */
  pid?: number | undefined;
}

/** A worker as tests and measurements see it. */
export interface PoolWorker {
  /** The thread's id, or the child's process id. */
  id: number;
  /** The system's id of the thread (from its `ready`), or the child's process id: what `os.getPriority` takes. */
  osId: number | undefined;
  lane: Lane;
  /** Whether it runs a job now. */
  readonly busy: boolean;
  /** Ends it at once, as a crash would. */
  terminate(): Promise<void>;
}

function threadRunner(options: WorkerPoolOptions): Runner {
  const worker = new Worker(options.script, { workerData: options.workerData });
  return {
    id: worker.threadId,
    post: (message, transfer) => worker.postMessage(message, transfer),
    onMessage: (listener) => worker.on("message", listener),
    onGone: (listener) => {
      worker.on("error", listener);
      worker.on("exit", (code) => listener(new Error(`the ${options.name} worker exited with code ${code}`)));
    },
    ref: () => worker.ref(),
    unref: () => worker.unref(),
    terminate: async () => {
      await worker.terminate();
    },
  };
}

function processRunner(options: WorkerPoolOptions): Runner {
  const child: ChildProcess = fork(options.script, [], {
    // Not bin/perch's cap on the young generation (given on the command line; an operator's own, in
    // NODE_OPTIONS, still reaches it): it bounds the server's memory per connection, and a forked
    // worker holds no connection (docs/decisions.md, "Memory of a process").
    execArgv: process.execArgv.filter((arg) => !arg.startsWith("--max-semi-space-size")),
    // Structured clone: typed arrays cross as they are.
    serialization: "advanced",
    env: { ...process.env, PERCH_WORKER_DATA: JSON.stringify(options.workerData ?? null) },
    stdio: ["ignore", "inherit", "inherit", "ipc"],
  });
  const channel = () => child.channel as { ref(): void; unref(): void } | null | undefined;
  return {
    id: child.pid ?? -1,
    pid: child.pid,
    post: (message) => {
      if (child.connected) child.send(message as object);
    },
    onMessage: (listener) => child.on("message", listener),
    onGone: (listener) => {
      child.on("error", listener);
      child.on("exit", (code, signal) => listener(new Error(`the ${options.name} process exited with ${signal ?? `code ${code}`}`)));
    },
    ref: () => {
      child.ref();
      channel()?.ref();
    },
    unref: () => {
      child.unref();
      channel()?.unref();
    },
    terminate: async () => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise((resolve) => child.once("exit", resolve));
      child.ref();
      child.kill("SIGKILL");
      await exited;
    },
  };
}

/** The wait before replacing a worker that died, while workers keep dying with no job answered in between. */
const REPLACE_MIN_MS = 100;
const REPLACE_MAX_MS = 5_000;

/** A job's failure as the worker reported it, with its `code` and `errcode`. */
function errorOf(message: JobError): Error {
  const error: Error & { code?: string; errcode?: number } = new Error(message.error);
  if (message.code !== undefined) error.code = message.code;
  if (message.errcode !== undefined) error.errcode = message.errcode;
  return error;
}

/** Lower runs first; within a priority, first come first served. */
export type Priority = 0 | 1;

interface Pending<Res> {
  id: number;
  request: unknown;
  transfer: Transferable[];
  priority: Priority;
  urgent: boolean;
  anyLane: boolean;
  resolve: (result: Res) => void;
  reject: (error: Error) => void;
}

interface Slot<Res> {
  worker: Runner;
  lane: Lane;
  /** The system's id of the worker's thread (or process), once ready. */
  osId: number | undefined;
  ready: boolean;
  job: Pending<Res> | undefined;
}

/**
 * Worker threads (or processes) that each load something once (a model, a WebAssembly module, a
 * database connection) and then run jobs one at a time. Every worker is started with the pool;
 * jobs wait in a backlog ordered by priority and go to the first worker free. The rules on
 * failure are the same for every use (flite, the recogniser, the store's reads):
 * - a job's own failure (the worker answers `error`) fails that job only, with the worker's
 *   message and its `code`/`errcode`;
 * - a worker that dies (crash, `process.exit`, uncaught error, terminated) fails only the job it
 *   was running (with `lostError`), and a new worker takes its place: at once the first time, then
 *   after 100 ms, doubling to 5 s, while workers keep dying with no job answered in between (so
 *   workers that keep dying cannot spin the CPU). Waiting jobs stay in the backlog meanwhile;
 * - a worker that reports `failed` while loading, or dies before the pool's first worker was
 *   ready, fails the pool: every waiting and later job is rejected with that error (a model that
 *   cannot load will not load on the next try either). A worker whose start can fail for a passing
 *   reason must not report it so: it reports `ready` and fails the jobs (as the store's read
 *   worker does);
 * - a replacement that dies before it is ready (the pool's workers loaded before: a passing
 *   trouble, such as memory or file descriptors) is replaced in turn, with the same back-off;
 *   while no worker is ready, the jobs waiting fail (with `lostError`) rather than wait for one.
 * The backlog is not bounded here: callers bound it (see WorkQueue) before they add to it.
 */
export class WorkerPool<Req, Res> {
  private readonly options: WorkerPoolOptions;
  private readonly slots: Slot<Res>[] = [];
  private readonly backlog: Pending<Res>[] = [];
  private nextId = 1;
  private failure: Error | undefined;
  private closed = false;
  private readyCount = 0;
  private readonly readyWaiters: Array<{ resolve: () => void; reject: (e: Error) => void }> = [];
  /** Workers replaced after dying, since the pool started. */
  restarts = 0;
  /** Workers that died since a job was last answered (sets the wait before the next replacement). */
  private deathsInARow = 0;
  /** Whether a worker of this pool was ever ready (its model loads). */
  private loadedOnce = false;
  private priorityWarned = false;
  /** Says once, to this pool's `warn`, that its workers run without priorities, and why. */
  private readonly priorityUnavailable = (reason: string): void => {
    if (this.priorityWarned) return;
    this.priorityWarned = true;
    const message = `${this.options.name} workers run without OS priorities (background work competes with conversations as an equal): ${reason}`;
    (this.options.warn ?? ((m: string) => process.emitWarning(m)))(message);
  };

  constructor(options: WorkerPoolOptions) {
    if (!(options.size >= 1)) throw new RangeError("a worker pool needs at least one worker");
    const background = options.background ?? 0;
    if (!(Number.isInteger(background) && background >= 0 && background < options.size))
      throw new RangeError("a worker pool's background workers must leave one in the foreground");
    this.options = options;
    for (let i = 0; i < options.size; i++) this.spawn(i < background ? "background" : "foreground");
  }

  /** Resolves once every worker has loaded; rejects when one cannot. */
  ready(): Promise<void> {
    if (this.failure) return Promise.reject(this.failure);
    if (this.readyCount >= this.options.size) return Promise.resolve();
    // Someone waits: the workers still loading keep the process alive until they are ready.
    for (const slot of this.slots) if (!slot.ready) slot.worker.ref();
    return new Promise((resolve, reject) => this.readyWaiters.push({ resolve, reject }));
  }

  /** The process ids of process workers (for measuring their memory). */
  pids(): number[] {
    return this.slots.flatMap((s) => (s.worker.pid !== undefined ? [s.worker.pid] : []));
  }

  /** The workers that have loaded (tests: to end one as a crash would). */
  workers(): PoolWorker[] {
    return this.slots
      .filter((s) => s.ready)
      .map((s) => ({
        id: s.worker.id,
        osId: s.osId,
        lane: s.lane,
        get busy() {
          return s.job !== undefined;
        },
        terminate: () => s.worker.terminate(),
      }));
  }

  /** Whether the pool has failed for good (its workers could not start): every job is refused. */
  get failed(): boolean {
    return this.failure !== undefined;
  }

  /** Jobs waiting for a worker. */
  get waiting(): number {
    return this.backlog.length;
  }

  /** Whether a job run now would start at once: nothing waits and a loaded worker is free. */
  get idle(): boolean {
    return this.backlog.length === 0 && this.slots.some((s) => s.ready && !s.job);
  }

  /**
   * Runs `request` on the first worker free that may take it. `urgent` (a conversation's) prefers
   * a foreground worker and may take a background one; other jobs take background workers only
   * (any worker when the pool has none), unless `anyLane` (no conversation needs the foreground
   * workers now, as their owner judges): then as an urgent job.
   */
  run(request: Req, options: { priority?: Priority; transfer?: Transferable[]; urgent?: boolean; anyLane?: boolean } = {}): Promise<Res> {
    if (this.failure) return Promise.reject(this.failure);
    if (this.closed) return Promise.reject(new Error(`the ${this.options.name} pool is closed`));
    return new Promise<Res>((resolve, reject) => {
      const job: Pending<Res> = {
        id: this.nextId++,
        request,
        transfer: options.transfer ?? [],
        priority: options.priority ?? 1,
        urgent: options.urgent ?? false,
        anyLane: options.anyLane ?? false,
        resolve,
        reject,
      };
      // After the last job of the same or a more urgent priority.
      let at = this.backlog.length;
      while (at > 0 && this.backlog[at - 1]!.priority > job.priority) at--;
      this.backlog.splice(at, 0, job);
      this.dispatch();
    });
  }

  /** Stops every worker; waiting jobs are rejected. */
  async close(): Promise<void> {
    this.closed = true;
    const error = new Error(`the ${this.options.name} pool is closed`);
    for (const job of this.backlog.splice(0)) job.reject(error);
    await Promise.all(this.slots.splice(0).map((s) => s.worker.terminate()));
  }

  /** The free worker `job` may take: see `run`. */
  private slotFor(job: Pending<Res>): Slot<Res> | undefined {
    const free = (lane: Lane) => this.slots.find((s) => s.ready && !s.job && s.lane === lane);
    if (!this.options.background) return free("foreground");
    return job.urgent || job.anyLane ? (free("foreground") ?? free("background")) : free("background");
  }

  private dispatch(): void {
    // In backlog order; a job that no free worker may take leaves its turn to the next (an urgent one).
    for (let i = 0; i < this.backlog.length; ) {
      const job = this.backlog[i]!;
      const slot = this.slotFor(job);
      if (!slot) {
        i++;
        continue;
      }
      this.backlog.splice(i, 1);
      slot.job = job;
      // Keep the process alive while a job is out; an idle pool must not.
      slot.worker.ref();
      slot.worker.post({ id: job.id, request: job.request } satisfies PoolJob<unknown>, job.transfer);
    }
  }

  private spawn(lane: Lane): void {
    if (this.closed || this.failure) return;
    const background = lane === "background";
    const worker = this.options.isolation === "process" ? processRunner(this.options) : threadRunner(this.options);
    const slot: Slot<Res> = { worker, lane, osId: worker.pid, ready: false, job: undefined };
    const niceness = Math.min(19, getPriority() + BACKGROUND_NICENESS);
    // A process's threads made from now on (onnxruntime's) inherit its priority; those made before are set when it is ready.
    if (background && worker.pid !== undefined) lowerPriority([worker.pid], niceness, this.priorityUnavailable);
    this.slots.push(slot);
    worker.unref();
    let gone = false;
    worker.onMessage((raw) => {
      const message = raw as PoolMessage<Res>;
      if (message.type === "ready") {
        if (message.tid !== undefined && worker.pid === undefined) slot.osId = message.tid;
        if (background)
          lowerPriority(worker.pid !== undefined ? threadsOf(worker.pid) : slot.osId !== undefined ? [slot.osId] : [], niceness, this.priorityUnavailable);
        slot.ready = true;
        this.loadedOnce = true;
        worker.unref();
        this.readyCount++;
        if (this.readyCount >= this.options.size) for (const w of this.readyWaiters.splice(0)) w.resolve();
        this.dispatch();
        return;
      }
      if (message.type === "failed") {
        this.fail(new Error(`the ${this.options.name} worker could not start: ${message.error}`));
        return;
      }
      const job = slot.job;
      if (!job || job.id !== message.id) return;
      slot.job = undefined;
      this.deathsInARow = 0;
      worker.unref();
      if (message.type === "done") job.resolve(message.result);
      else job.reject(errorOf(message));
      this.dispatch();
    });
    const died = (error: Error) => {
      if (gone) return;
      gone = true;
      const i = this.slots.indexOf(slot);
      if (i >= 0) this.slots.splice(i, 1);
      if (slot.ready) this.readyCount--;
      const job = slot.job;
      slot.job = undefined;
      job?.reject(this.options.lostError ? this.options.lostError(error) : error);
      if (this.closed || this.failure) return;
      if (!slot.ready) {
        const cause = new Error(`the ${this.options.name} worker could not start: ${error.message}`);
        // No worker of this pool ever loaded: it would die again, the pool has failed.
        if (!this.loadedOnce) {
          this.fail(cause);
          return;
        }
        // A replacement that could not start: with no worker ready, the waiting jobs fail now.
        if (this.readyCount === 0) for (const waiting of this.backlog.splice(0)) waiting.reject(this.options.lostError ? this.options.lostError(cause) : cause);
      }
      this.restarts++;
      const wait = this.deathsInARow === 0 ? 0 : Math.min(REPLACE_MAX_MS, REPLACE_MIN_MS * 2 ** (this.deathsInARow - 1));
      this.deathsInARow++;
      if (wait === 0) this.replace(lane);
      else setTimeout(() => this.replace(lane), wait).unref();
    };
    worker.onGone(died);
  }

  /** Starts a worker in place of one that died; a worker that cannot even be created fails the pool. */
  private replace(lane: Lane): void {
    try {
      this.spawn(lane);
    } catch (error) {
      this.fail(new Error(`the ${this.options.name} worker could not start: ${error instanceof Error ? error.message : String(error)}`));
    }
  }

  private fail(error: Error): void {
    if (this.failure) return;
    this.failure = error;
    for (const w of this.readyWaiters.splice(0)) w.reject(error);
    for (const job of this.backlog.splice(0)) job.reject(error);
    for (const slot of this.slots.splice(0)) {
      slot.job?.reject(error);
      slot.worker.terminate().catch(() => {});
    }
  }
}
