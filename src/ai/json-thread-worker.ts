/** The other side of json-thread.ts: parses and serialises large JSON off the main thread. */
import { parentPort } from "node:worker_threads";

export type JsonTask = { kind: "parse"; bytes: Uint8Array } | { kind: "stringify"; value: unknown };
export type JsonJob = JsonTask & { id: number };
export type JsonReply = { id: number; ok: true; value?: unknown; bytes?: Uint8Array } | { id: number; ok: false; syntax: boolean; message: string };

parentPort?.on("message", (job: JsonJob) => {
  const port = parentPort!;
  try {
    if (job.kind === "parse") {
      const value: unknown = JSON.parse(Buffer.from(job.bytes.buffer, job.bytes.byteOffset, job.bytes.byteLength).toString("utf8"));
      port.postMessage({ id: job.id, ok: true, value } satisfies JsonReply);
    } else {
      const bytes = Buffer.from(JSON.stringify(job.value));
      // A fresh buffer of its own (not the shared pool's): its memory moves to the main thread.
      const own = new Uint8Array(bytes.length);
      own.set(bytes);
      port.postMessage({ id: job.id, ok: true, bytes: own } satisfies JsonReply, [own.buffer]);
    }
  } catch (err) {
    port.postMessage({ id: job.id, ok: false, syntax: err instanceof SyntaxError, message: String((err as Error)?.message ?? err) } satisfies JsonReply);
  }
});
