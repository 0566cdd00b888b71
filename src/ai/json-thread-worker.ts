/** The other side of json-thread.ts: a WorkerPool worker that parses and serialises large JSON off the main thread. */
import { parentPort } from "node:worker_threads";
import { jobError, type PoolJob, type PoolMessage } from "../workers/pool.ts";

export type JsonTask = { kind: "parse"; bytes: Uint8Array } | { kind: "stringify"; value: unknown };
/** Invalid JSON is an answer (the caller's SyntaxError), not a failure of the worker. */
export type JsonResult = { ok: true; value?: unknown; bytes?: Uint8Array } | { ok: false; message: string };

const port = parentPort!;
port.on("message", ({ id, request }: PoolJob<JsonTask>) => {
  try {
    if (request.kind === "parse") {
      const { bytes } = request;
      let value: unknown;
      try {
        value = JSON.parse(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("utf8"));
      } catch (err) {
        if (!(err instanceof SyntaxError)) throw err;
        port.postMessage({ type: "done", id, result: { ok: false, message: err.message } } satisfies PoolMessage<JsonResult>);
        return;
      }
      port.postMessage({ type: "done", id, result: { ok: true, value } } satisfies PoolMessage<JsonResult>);
    } else {
      const bytes = Buffer.from(JSON.stringify(request.value));
      // A fresh buffer of its own (not the shared pool's): its memory moves to the main thread.
      const own = new Uint8Array(bytes.length);
      own.set(bytes);
      port.postMessage({ type: "done", id, result: { ok: true, bytes: own } } satisfies PoolMessage<JsonResult>, [own.buffer]);
    }
  } catch (err) {
    port.postMessage(jobError(id, err) satisfies PoolMessage<JsonResult>);
  }
});
port.postMessage({ type: "ready" } satisfies PoolMessage<JsonResult>);
