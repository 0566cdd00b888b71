/**
 * A WorkerPool worker that never says its thread's id (as on a system without `/proc/thread-self`):
 * a background one cannot be given its lower priority, so its pool warns. Each job echoes its request.
 */
import { parentPort } from "node:worker_threads";
import type { PoolJob, PoolMessage } from "../../src/workers/pool.ts";

const port = parentPort!;
port.on("message", ({ id, request }: PoolJob<string>) => port.postMessage({ type: "done", id, result: request } satisfies PoolMessage<string>));
port.postMessage({ type: "ready" } satisfies PoolMessage<string>);
