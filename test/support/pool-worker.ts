/**
 * A WorkerPool worker for tests: echoes, fails, or dies (exits its thread) on request; "fail-start"
 * in workerData makes it fail to load; `{ dieAtStartIf: file }` makes it exit before it is ready
 * while that file exists (a passing trouble at start).
 */
import { existsSync } from "node:fs";
import { parentPort, workerData } from "node:worker_threads";
import type { PoolJob, PoolMessage } from "../../src/workers/pool.ts";

const port = parentPort!;
const dieAtStartIf = (workerData as { dieAtStartIf?: string } | null)?.dieAtStartIf;
if (workerData === "fail-start") port.postMessage({ type: "failed", error: "no model here" } satisfies PoolMessage<string>);
else if (dieAtStartIf !== undefined && existsSync(dieAtStartIf)) process.exit(4);
else {
  port.on("message", ({ id, request }: PoolJob<string>) => {
    if (request === "die") process.exit(3);
    if (request === "throw") port.postMessage({ type: "error", id, error: "asked to fail" } satisfies PoolMessage<string>);
    else setTimeout(() => port.postMessage({ type: "done", id, result: `echo ${request}` } satisfies PoolMessage<string>), 20);
  });
  port.postMessage({ type: "ready" } satisfies PoolMessage<string>);
}
