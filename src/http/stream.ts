import type { ServerResponse } from "node:http";
import type { Context } from "hono";
import { sseErrorEvent } from "./compat/errors.ts";
import type { AppBindings } from "./env.ts";
import { type Exchange, exchangeOf } from "./exchange.ts";

/** How a streamed answer ended, for the metrics: 200 (with an error type when it broke off) or 499 (the client left). */
export type StreamEnd = (status: number, errorType?: string) => void;

export interface StreamOptions<T> {
  /** An event stream (its failure ends it with the `error` event), or raw bytes (a failure aborts it). */
  sse: boolean;
  encode: (value: T) => Uint8Array;
  /** Bytes after the last piece (`speech.audio.done`). */
  last?: () => Uint8Array;
  done: StreamEnd;
}

export const EVENT_STREAM = "text/event-stream; charset=utf-8";

/** Adds the headers of a streamed answer of `contentType` to `headers` (a flat list of names and values). */
function streamHeaders(headers: string[], contentType: string): string[] {
  headers.push("content-type", contentType);
  if (contentType.startsWith("text/event-stream")) headers.push("cache-control", "no-cache", "x-accel-buffering", "no");
  headers.push("transfer-encoding", "chunked");
  return headers;
}

/**
 * The one writer of a streamed answer, straight to Node's response (every request comes through
 * the exchange, so there is one): the head, then each piece of `source` as the client takes the
 * last (no buffering beyond the socket's). The head goes out with the first piece when that is at
 * hand (a provider's stream starts with its first event), else at once (an agent's tool step, an
 * engine's first audio). When the source fails after the answer started, an event stream ends
 * with the surface's `error` event (mapped as every error is, `sseErrorEvent`); raw bytes (audio)
 * are aborted instead (no final chunk), which every HTTP client reports as an error rather than
 * ending like a whole file. The client's going away ends `source` (which closes what it holds: a
 * provider's connection, an engine's slot). `done` says how it ended, once: a client that leaves
 * while a piece is awaited is 499, and the source's failure that follows is not counted again.
 */
export async function writeStream<T>(x: Exchange, contentType: string, source: AsyncIterator<T>, o: StreamOptions<T>): Promise<void> {
  const { outgoing } = x;
  let ended = false;
  const end = (status: number, errorType?: string) => {
    if (ended) return false;
    ended = true;
    o.done(status, errorType);
    return true;
  };
  const left = () => {
    if (outgoing.writableFinished || !end(499)) return;
    source.return?.().catch(() => {});
  };
  outgoing.once("close", left);
  try {
    if (outgoing.destroyed) return left();
    outgoing.writeHead(200, streamHeaders(x.headers(), contentType));
    let first: Promise<IteratorResult<T>> | undefined = source.next();
    if (!(await settledNow(first))) outgoing.flushHeaders();
    for (;;) {
      let next: IteratorResult<T>;
      try {
        next = await (first ?? source.next());
        first = undefined;
      } catch (err) {
        if (!end(200, "api_error")) return;
        if (o.sse) outgoing.end(sseErrorEvent(err));
        // After what was written has left (Node sends a response's first writes on the next tick).
        else setImmediate(() => outgoing.destroy());
        return;
      }
      if (ended) return;
      if (next.done) {
        end(200);
        outgoing.end(o.last?.());
        return;
      }
      if (!outgoing.write(o.encode(next.value))) await drained(outgoing);
      if (ended) return;
    }
  } finally {
    outgoing.off("close", left);
  }
}

/** What a Hono route returns once it has handed its answer to `writeStream`: the adapter then writes nothing. */
export function streamed<T>(c: Context, contentType: string, source: AsyncIterator<T>, o: StreamOptions<T>): Response {
  const x = exchangeOf(c.env as AppBindings | undefined);
  if (!x) throw new Error("a streamed answer is written through the exchange (src/http/exchange.ts)");
  writeStream(x, contentType, source, o).catch(() => x.outgoing.destroy());
  return new Response(null, { headers: { "x-hono-already-sent": "true" } });
}

/** Bytes passed on as they are. */
export const asIs = (bytes: Uint8Array): Uint8Array => bytes;

/** `rest` with `first` (a result already read from it, to fail before answering) handed out again first. */
export function startingWith<T>(first: IteratorResult<T>, rest: AsyncIterator<T>): AsyncIterator<T> {
  let head: IteratorResult<T> | undefined = first;
  return {
    next: () => {
      const h = head;
      head = undefined;
      return h ? Promise.resolve(h) : rest.next();
    },
    return: async () => (await rest.return?.()) ?? { done: true, value: undefined },
  };
}

/** Whether `promise` has settled before this turn of the event loop's I/O. */
function settledNow(promise: Promise<unknown>): Promise<boolean> {
  return Promise.race([
    promise.then(
      () => true,
      () => true,
    ),
    new Promise<boolean>((resolve) => setImmediate(resolve, false)),
  ]);
}

/** Resolves once `outgoing` drains or closes. */
function drained(outgoing: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const go = () => {
      outgoing.off("drain", go);
      outgoing.off("close", go);
      resolve();
    };
    outgoing.on("drain", go);
    outgoing.on("close", go);
  });
}
