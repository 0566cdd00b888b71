/**
 * JSON.parse and JSON.stringify of large documents (request bodies over a MiB) in a worker thread,
 * so that one request cannot hold the event loop for the hundreds of milliseconds 30 MB of JSON
 * takes: the main thread only copies the result across (structured clone, or a transferred
 * buffer). Small documents are handled in place, where a thread hop would cost more than it saves.
 */
import { WorkerPool } from "../workers/pool.ts";
import type { JsonResult, JsonTask } from "./json-thread-worker.ts";

/** Below this many bytes (or characters), JSON is handled on the calling thread. */
export const OFFLOAD_BYTES = 1024 * 1024;

/**
 * One thread, started when first needed; the pool's rules apply (a thread that dies fails its job
 * only and is replaced). One per node (its engine host's), closed with it.
 */
export class JsonThread {
  private pool: WorkerPool<JsonTask, JsonResult> | undefined;
  private closed = false;

  private run(task: JsonTask, transfer: ArrayBuffer[] = []): Promise<JsonResult> {
    if (this.closed) return Promise.reject(new Error("the JSON thread is closed"));
    this.pool ??= new WorkerPool<JsonTask, JsonResult>({ script: new URL("./json-thread-worker.ts", import.meta.url), size: 1, name: "JSON" });
    const current = this.pool;
    return current.run(task, { transfer }).catch((err: unknown) => {
      // A thread with nothing to load that could not start hit a passing limit (memory, threads):
      // the next large body starts a new one rather than every later one being refused.
      if (this.pool === current && current.failed) this.pool = undefined;
      throw err;
    });
  }

  /** Starts the thread (and compiles its code) before the first large body needs it. */
  warm(): void {
    void this.run({ kind: "parse", bytes: new Uint8Array([123, 125]) }).catch(() => {});
  }

  /** `JSON.parse` of UTF-8 `bytes`; throws SyntaxError as JSON.parse does. Large inputs are parsed in the thread (`bytes` is handed over). */
  async parse(bytes: Buffer): Promise<unknown> {
    if (bytes.length < OFFLOAD_BYTES) return parseJsonHere(bytes);
    // Its own memory, so that it can be moved, not copied.
    const own = bytes.byteOffset === 0 && bytes.byteLength === bytes.buffer.byteLength ? bytes : Buffer.from(bytes);
    const r = await this.run({ kind: "parse", bytes: own }, [own.buffer as ArrayBuffer]);
    if (!r.ok) throw new SyntaxError(r.message);
    return r.value;
  }

  /** `JSON.stringify(value)` as UTF-8; `sizeHint` (bytes or characters the value holds, roughly) sends large ones to the thread. */
  async stringify(value: unknown, sizeHint: number): Promise<Buffer> {
    if (sizeHint < OFFLOAD_BYTES) return Buffer.from(JSON.stringify(value));
    const r = await this.run({ kind: "stringify", value });
    if (!r.ok) throw new Error(r.message);
    const b = r.bytes!;
    return Buffer.from(b.buffer, b.byteOffset, b.byteLength);
  }

  async close(): Promise<void> {
    this.closed = true;
    const pool = this.pool;
    this.pool = undefined;
    await pool?.close();
  }
}

/** `JSON.parse` of UTF-8 `bytes` on this thread, as `parseJson` parses a small body. */
export function parseJsonHere(bytes: Buffer): unknown {
  return JSON.parse(bytes.toString("utf8"));
}
