import { Worker } from "node:worker_threads";
import type { CompiledQuery } from "kysely";
import { StoreUnavailable } from "./errors.ts";

interface Pending {
  resolve: (rows: any[]) => void;
  reject: (err: Error) => void;
}

interface Reader {
  worker: Worker | undefined;
  pending: Map<number, Pending>;
}

/** What a worker sends back: rows, or the error with SQLite's codes (so that a busy or full database reads as unavailable). */
type Reply = { id: number; rows?: any[]; error?: string; code?: string; errcode?: number };

const RESPAWN_MIN_MS = 100;
const RESPAWN_MAX_MS = 5_000;

/**
 * A few worker threads, each with a read-only SQLite connection, for reads that take long
 * (node:sqlite blocks its thread). A worker that ends (an error, or it was terminated) fails what
 * it had in flight and is replaced, at once the first time and with back-off while replacements
 * keep ending.
 */
export class ReadPool {
  private readers: Reader[] = [];
  private nextId = 0;
  private closed = false;
  private respawnWait = RESPAWN_MIN_MS;
  private readonly file: string;

  constructor(file: string, size: number) {
    this.file = file;
    for (let i = 0; i < size; i++) {
      const reader: Reader = { worker: undefined, pending: new Map() };
      this.readers.push(reader);
      this.spawn(reader);
    }
  }

  /** Runs the query on the least busy worker. */
  run<R>(query: CompiledQuery<R>): Promise<R[]> {
    if (this.closed) return Promise.reject(new Error("the store is closed"));
    const live = this.readers.filter((r) => r.worker);
    if (live.length === 0) return Promise.reject(new StoreUnavailable("the database's read workers are restarting"));
    const reader = live.reduce((a, b) => (b.pending.size < a.pending.size ? b : a));
    const worker = reader.worker!;
    const id = this.nextId++;
    return new Promise<R[]>((resolve, reject) => {
      reader.pending.set(id, { resolve, reject });
      // Only a worker with work in flight keeps the process alive.
      if (reader.pending.size === 1) worker.ref();
      worker.postMessage({ id, sql: query.sql, parameters: query.parameters });
    });
  }

  /** Workers running now (tests). */
  get workers(): Worker[] {
    return this.readers.flatMap((r) => (r.worker ? [r.worker] : []));
  }

  async close(): Promise<void> {
    this.closed = true;
    await Promise.all(this.readers.map((r) => r.worker?.terminate()));
  }

  private spawn(reader: Reader): void {
    const worker = new Worker(new URL("./read-worker.ts", import.meta.url), { workerData: { file: this.file } });
    worker.unref();
    reader.worker = worker;
    worker.on("message", (m: Reply) => {
      const p = reader.pending.get(m.id);
      if (!p) return;
      reader.pending.delete(m.id);
      if (reader.pending.size === 0) worker.unref();
      if (m.error === undefined) {
        this.respawnWait = RESPAWN_MIN_MS;
        p.resolve(m.rows!);
        return;
      }
      p.reject(Object.assign(new Error(m.error), m.code === undefined ? {} : { code: m.code }, m.errcode === undefined ? {} : { errcode: m.errcode }));
    });
    let failure: Error | undefined;
    worker.on("error", (err) => {
      failure = err;
    });
    // A worker that ends fails what it had in flight and is replaced.
    worker.on("exit", (code) => {
      if (reader.worker !== worker) return;
      reader.worker = undefined;
      const err = new StoreUnavailable(`a database read worker ended (${failure?.message ?? `exit code ${code}`})`, { cause: failure });
      for (const p of reader.pending.values()) p.reject(err);
      reader.pending.clear();
      if (this.closed) return;
      const wait = this.respawnWait;
      this.respawnWait = Math.min(RESPAWN_MAX_MS, wait * 2);
      if (wait === RESPAWN_MIN_MS) this.spawn(reader);
      else setTimeout(() => !this.closed && this.spawn(reader), wait).unref();
    });
  }
}
