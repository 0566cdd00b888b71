// A worker thread with its own read-only connection to the SQLite file (WAL lets it read beside the
// writer): long reads run here instead of on the event loop. It runs SQL the main thread compiled.
import { DatabaseSync, type StatementSync } from "node:sqlite";
import { parentPort, workerData } from "node:worker_threads";

const db = new DatabaseSync((workerData as { file: string }).file, { readOnly: true });
db.exec("PRAGMA busy_timeout = 5000");
const statements = new Map<string, StatementSync>();

parentPort!.on("message", (m: { id: number; sql: string; parameters: never[] }) => {
  try {
    let stmt = statements.get(m.sql);
    if (!stmt) {
      if (statements.size >= 100) statements.clear();
      stmt = db.prepare(m.sql);
      statements.set(m.sql, stmt);
    }
    parentPort!.postMessage({ id: m.id, rows: stmt.all(...m.parameters) });
  } catch (err) {
    const e = err as Error & { code?: string; errcode?: number };
    parentPort!.postMessage({ id: m.id, error: e.message, code: e.code, errcode: e.errcode });
  }
});
