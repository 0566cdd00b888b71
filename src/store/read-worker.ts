// A worker thread of the store's read pool (src/workers/pool.ts), with its own read-only
// connection to the SQLite file (WAL lets it read beside the writer): long reads run here instead
// of on the event loop. It runs SQL the main thread compiled, one query at a time.
import { DatabaseSync, type StatementSync } from "node:sqlite";
import { parentPort, workerData } from "node:worker_threads";
import { jobError, type PoolJob, type PoolMessage } from "../workers/pool.ts";

export interface ReadRequest {
  sql: string;
  parameters: readonly unknown[];
}

const { file } = workerData as { file: string };
const port = parentPort!;
let db: DatabaseSync | undefined;
const statements = new Map<string, StatementSync>();

/**
 * The connection, opened on the first query and again after an open that failed. A worker that
 * cannot open the file (locked, out of file descriptors, failing I/O) fails that query with
 * SQLite's codes, which the store answers 503, and tries again on the next: it never reports
 * `failed`, which would fail the pool, and so every later read, for a moment's trouble with a file
 * the node already has open.
 */
function connection(): DatabaseSync {
  if (db) return db;
  const opened = new DatabaseSync(file, { readOnly: true });
  try {
    opened.exec("PRAGMA busy_timeout = 5000");
  } catch (error) {
    opened.close();
    throw error;
  }
  db = opened;
  return db;
}

port.on("message", ({ id, request }: PoolJob<ReadRequest>) => {
  try {
    const db = connection();
    let stmt = statements.get(request.sql);
    if (!stmt) {
      if (statements.size >= 100) statements.clear();
      stmt = db.prepare(request.sql);
      statements.set(request.sql, stmt);
    }
    port.postMessage({ type: "done", id, result: stmt.all(...(request.parameters as never[])) } satisfies PoolMessage<unknown[]>);
  } catch (error) {
    port.postMessage(jobError(id, error) satisfies PoolMessage<unknown[]>);
  }
});
port.postMessage({ type: "ready" } satisfies PoolMessage<unknown[]>);
