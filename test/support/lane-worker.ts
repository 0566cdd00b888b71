/**
 * A WorkerPool worker for the lane tests: each job answers with the worker's thread id and the
 * priority it runs at (read inside the thread); a job named "hold" answers only once the test
 * raises the shared gate (workerData: an Int32Array over a SharedArrayBuffer).
 */
import { getPriority } from "node:os";
import { parentPort, threadId, workerData } from "node:worker_threads";
import { type PoolJob, type PoolMessage, readyMessage } from "../../src/workers/pool.ts";

export interface LaneAnswer {
  name: string;
  /** Node's id of the worker thread (the pool's `PoolWorker.id`). */
  threadId: number;
  /** The system's id of the thread (Linux). */
  tid: number | undefined;
  /** The thread's own niceness (Linux: `getpriority` of the calling thread). */
  niceness: number;
}

const port = parentPort!;
const gate = workerData as Int32Array;
const { tid } = readyMessage();

port.on("message", ({ id, request }: PoolJob<string>) => {
  const answer = () =>
    port.postMessage({ type: "done", id, result: { name: request, threadId, tid, niceness: getPriority() } } satisfies PoolMessage<LaneAnswer>);
  if (!request.startsWith("hold")) answer();
  else if (Atomics.load(gate, 0) !== 0) answer();
  else {
    const waited = Atomics.waitAsync(gate, 0, 0);
    if (waited.async) void waited.value.then(answer);
    else answer();
  }
});
port.postMessage(readyMessage() satisfies PoolMessage<LaneAnswer>);
