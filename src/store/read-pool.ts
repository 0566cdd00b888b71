import { Worker } from "node:worker_threads";
import type { CompiledQuery } from "kysely";

interface Pending {
  resolve: (rows: any[]) => void;
  reject: (err: Error) => void;
}

interface Reader {
  worker: Worker;
  pending: Map<number, Pending>;
}

/** A few worker threads, each with a read-only SQLite connection, for reads that take long (node:sqlite blocks its thread). */
export class ReadPool {
  private readers: Reader[] = [];
  private nextId = 0;
  private closed = false;
  private readonly file: string;

  constructor(file: string, size: number) {
    this.file = file;
    for (let i = 0; i < size; i++) this.readers.push(this.spawn());
  }

  /** Runs the query on the least busy worker. */
  run<R>(query: CompiledQuery<R>): Promise<R[]> {
    if (this.closed) return Promise.reject(new Error("the store is closed"));
    const reader = this.readers.reduce((a, b) => (b.pending.size < a.pending.size ? b : a));
    const id = this.nextId++;
    return new Promise<R[]>((resolve, reject) => {
      reader.pending.set(id, { resolve, reject });
      // Only a worker with work in flight keeps the process alive.
      if (reader.pending.size === 1) reader.worker.ref();
      reader.worker.postMessage({ id, sql: query.sql, parameters: query.parameters });
    });
  }

  async close(): Promise<void> {
    this.closed = true;
    await Promise.all(this.readers.map((r) => r.worker.terminate()));
  }

  private spawn(): Reader {
    const worker = new Worker(new URL("./read-worker.ts", import.meta.url), { workerData: { file: this.file } });
    worker.unref();
    const reader: Reader = { worker, pending: new Map() };
    worker.on("message", (m: { id: number; rows?: any[]; error?: string }) => {
      const p = reader.pending.get(m.id);
      if (!p) return;
      reader.pending.delete(m.id);
      if (reader.pending.size === 0) worker.unref();
      if (m.error !== undefined) p.reject(new Error(m.error));
      else p.resolve(m.rows!);
    });
    // A worker that dies fails what it had in flight and is replaced.
    worker.on("error", (err) => {
      for (const p of reader.pending.values()) p.reject(err);
      reader.pending.clear();
      if (!this.closed) this.readers[this.readers.indexOf(reader)] = this.spawn();
    });
    return reader;
  }
}
