import { AsyncLocalStorage } from "node:async_hooks";
import type { FetchLike } from "@modelcontextprotocol/sdk/shared/transport.js";
import { ErrorCode } from "@modelcontextprotocol/sdk/types.js";

/** What Perch reads of one response of an MCP server at most (tools.md §2); the rest is not read. */
export const MAX_RESPONSE_BYTES = 4 * 1024 * 1024;

const mediaType = (header: string | null) => (header ?? "").split(";")[0]!.trim().toLowerCase();

/** The id of the JSON-RPC request a POST carries (the SDK's body is one message as a string), if any. */
function requestId(body: unknown): string | number | undefined {
  if (typeof body !== "string") return undefined;
  try {
    const m = JSON.parse(body) as { id?: unknown; method?: unknown };
    return typeof m.method === "string" && (typeof m.id === "string" || typeof m.id === "number") ? m.id : undefined;
  } catch {
    return undefined;
  }
}

const tooLarge = (id: string | number, max: number) =>
  JSON.stringify({ jsonrpc: "2.0", id, error: { code: ErrorCode.InternalError, message: `the MCP server's response is over ${max} bytes` } });

/** The body's bytes up to `max`; undefined (and the rest cancelled, unread) when it is longer. */
async function readUpTo(body: ReadableStream<Uint8Array>, max: number): Promise<Buffer | undefined> {
  const reader = body.getReader();
  const parts: Uint8Array[] = [];
  let bytes = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return Buffer.concat(parts);
    bytes += value.byteLength;
    if (bytes > max) {
      await reader.cancel().catch(() => {});
      return undefined;
    }
    parts.push(value);
  }
}

/**
 * An event stream passed on up to `max` bytes; beyond, the event being read is ended, the request's
 * answer is an error (so that the call fails now, not at its timeout), and the rest is not read.
 */
function boundedEvents(max: number, id: string | number | undefined): TransformStream<Uint8Array, Uint8Array> {
  let bytes = 0;
  return new TransformStream({
    transform(chunk, controller) {
      bytes += chunk.byteLength;
      if (bytes <= max) {
        controller.enqueue(chunk);
        return;
      }
      if (id !== undefined) controller.enqueue(Buffer.from(`\n\nevent: message\ndata: ${tooLarge(id, max)}\n\n`));
      // Throwing here cancels the server's body: nothing more is read.
      controller.terminate();
    },
  });
}

/**
 * The abort signal of the MCP request being made in this async context: the SDK's transport sends
 * every request on a fetch of its own but gives it no signal of the call's, so a call that timed
 * out or was cancelled would leave its HTTP request (and socket) open while the server never
 * answers. `boundedFetch` joins this signal to the request's.
 */
const requestSignal = new AsyncLocalStorage<AbortSignal>();

/**
 * Runs `fn` (one SDK request) so that its HTTP request is aborted when it fails: a timeout, an
 * abort or an error ends the request's HTTP exchange too (tools.md §2), the socket freed.
 */
export async function withRequestAbort<T>(fn: () => Promise<T>): Promise<T> {
  const controller = new AbortController();
  try {
    return await requestSignal.run(controller.signal, fn);
  } catch (err) {
    controller.abort(err);
    throw err;
  }
}

/**
 * A fetch for the SDK's Streamable HTTP client transport that reads at most `max` bytes of each
 * response: a JSON answer (or an error page) over it becomes a JSON-RPC error for the request it
 * answers, an event stream is ended there (its request answered with that error).
 */
export function boundedFetch(max = MAX_RESPONSE_BYTES, base: FetchLike = fetch): FetchLike {
  return async (url, init) => {
    const id = requestId(init?.body);
    // Only the request itself: a notification sent on its behalf (`notifications/cancelled`) must still go.
    const own = id !== undefined ? requestSignal.getStore() : undefined;
    if (own) init = { ...init, signal: init?.signal ? AbortSignal.any([init.signal, own]) : own };
    const res = await base(url, init);
    if (!res.body || (res.status >= 300 && res.status < 400)) return res;
    const headers = new Headers(res.headers);
    headers.delete("content-length");
    headers.delete("content-encoding");
    const init2 = { status: res.status, statusText: res.statusText, headers };
    if (mediaType(res.headers.get("content-type")) === "text/event-stream") return new Response(res.body.pipeThrough(boundedEvents(max, id)), init2);
    const body = await readUpTo(res.body, max);
    if (body) return new Response(new Uint8Array(body), init2);
    if (res.ok && id !== undefined) {
      headers.set("content-type", "application/json");
      return new Response(tooLarge(id, max), init2);
    }
    headers.set("content-type", "text/plain");
    return new Response(`the MCP server's response is over ${max} bytes`, { ...init2, status: res.ok ? 502 : res.status });
  };
}
