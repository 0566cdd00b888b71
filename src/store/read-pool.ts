import type { CompiledQuery } from "kysely";
import { WorkerPool } from "../workers/pool.ts";
import { StoreUnavailable } from "./errors.ts";
import type { ReadRequest } from "./read-worker.ts";

/**
 * A few worker threads, each with a read-only SQLite connection, for reads that take long
 * (node:sqlite blocks its thread): a WorkerPool, with its rules on failure. A query fails with
 * SQLite's `code` and `errcode` (so a busy or full database reads as unavailable); a query whose
 * worker ended under it fails with `StoreUnavailable`, and the worker is replaced.
 */
export class ReadPool extends WorkerPool<ReadRequest, unknown[]> {
  constructor(file: string, size: number) {
    super({
      script: new URL("./read-worker.ts", import.meta.url),
      workerData: { file },
      size,
      name: "database read",
      lostError: (cause) => new StoreUnavailable(`a database read worker ended (${cause.message})`, { cause }),
    });
  }

  /** Runs a compiled query on the first free worker. */
  query<R>(query: CompiledQuery<R>): Promise<R[]> {
    return this.run({ sql: query.sql, parameters: query.parameters }) as Promise<R[]>;
  }
}
