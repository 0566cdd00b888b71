/**
 * A process WorkerPool worker for the lane tests: before it says it is ready it starts a thread
 * that sets itself back to the default priority (as a thread made before the pool lowered the
 * process would be; root may raise it); each job answers with every thread's niceness.
 */
import { readdirSync } from "node:fs";
import { getPriority } from "node:os";
import { Worker } from "node:worker_threads";
import type { PoolJob, PoolMessage } from "../../src/workers/pool.ts";

const send = (m: PoolMessage<number[]>) => process.send?.(m);
const thread = new Worker(
  "const { parentPort } = require('node:worker_threads'); try { require('node:os').setPriority(0); } catch {} parentPort.postMessage('up'); setInterval(() => {}, 1 << 30);",
  { eval: true },
);
thread.once("message", () => {
  process.on("message", ({ id }: PoolJob<string>) => {
    const niceness = readdirSync("/proc/self/task").map((tid) => getPriority(Number(tid)));
    send({ type: "done", id, result: niceness });
  });
  send({ type: "ready" });
});
