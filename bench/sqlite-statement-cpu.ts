/**
 * `node --import ./bench/sqlite-statement-cpu.ts bench/ingest-worker.ts <checkout> 2000 15 5`: the
 * thread CPU time of every node:sqlite statement the process runs, summed by statement (its SQL
 * with the rows of a multi-row `values` list folded), printed to stderr at exit, largest first.
 * Reads what SQLite and node:sqlite's binding cost, statement by statement, beside a CPU profile
 * (which shows them all as one `run`).
 */
import { StatementSync } from "node:sqlite";

const spent = new Map<string, { us: number; calls: number; parameters: number }>();
const shape = (sql: string) =>
  sql
    .replace(/\s+/g, " ")
    .replace(/\((\?|\d+)[^()]*\)(, \((\?|\d+)[^()]*\))+/g, "(…)")
    .slice(0, 100);

for (const method of ["run", "all", "get"] as const) {
  const original = StatementSync.prototype[method] as (...args: unknown[]) => unknown;
  (StatementSync.prototype as unknown as Record<string, unknown>)[method] = function (this: StatementSync, ...args: unknown[]) {
    const t = process.threadCpuUsage();
    try {
      return original.apply(this, args);
    } finally {
      const d = process.threadCpuUsage(t);
      const key = shape(this.sourceSQL);
      const e = spent.get(key) ?? { us: 0, calls: 0, parameters: 0 };
      e.us += d.user + d.system;
      e.calls++;
      e.parameters += args.length;
      spent.set(key, e);
    }
  };
}

process.on("exit", () => {
  const total = [...spent.values()].reduce((n, e) => n + e.us, 0);
  const lines = [...spent]
    .sort((a, b) => b[1].us - a[1].us)
    .slice(0, 20)
    .map(([sql, e]) => `${(e.us / 1e3).toFixed(0).padStart(7)} ms ${String(e.calls).padStart(7)} calls ${String(e.parameters).padStart(9)} values  ${sql}`);
  process.stderr.write(`node:sqlite statements: ${(total / 1e6).toFixed(2)} s of thread CPU\n${lines.join("\n")}\n`);
});
