import type { ServerResponse } from "node:http";
import type { Context } from "hono";
import type { AppBindings } from "./env.ts";
import { type Exchange, exchangeOf } from "./exchange.ts";

/** How a streamed answer ended, for the metrics: 200 (with an error type when it broke off) or 499 (the client left). */
export type StreamEnd = (status: number, errorType?: string) => void;

export interface StreamOptions<T> {
  encode: (value: T) => Uint8Array;
  /**
   * The last bytes of a stream whose source failed after it started: an event stream's `error`
   * event in its surface's envelope (`sseErrorEvent`). Absent, the answer is aborted instead (raw
   * bytes; Side Control's events, whose client reconnects).
   */
  failed?: (err: unknown) => Uint8Array;
  /** Bytes after the last piece (`speech.audio.done`). */
  last?: () => Uint8Array;
  done?: StreamEnd;
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
 * with the surface's `error` event (`failed`: mapped as every error is, `sseErrorEvent`); raw
 * bytes (audio) and Side Control's events are aborted instead (no final chunk), which every HTTP
 * client reports as an error rather than ending like a whole file. A source may be pushed to
 * (`PushSource`: Side Control's events) or pulled from (a provider's stream, an engine's audio). The client's going away ends `source` (which closes what it holds: a
 * provider's connection, an engine's slot). `done` says how it ended, once: a client that leaves
 * while a piece is awaited is 499, and the source's failure that follows is not counted again.
 */
export async function writeStream<T>(x: Exchange, contentType: string, source: AsyncIterator<T>, o: StreamOptions<T>): Promise<void> {
  const { outgoing } = x;
  let ended = false;
  const end = (status: number, errorType?: string) => {
    if (ended) return false;
    ended = true;
    o.done?.(status, errorType);
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
        if (o.failed) outgoing.end(o.failed(err));
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

/**
 * A source for `writeStream` fed as things happen (Side Control's events): pieces wait here until
 * the writer takes them, which it does as the client takes the last. A client that falls more than
 * `maxBacklog` bytes behind fails the stream (`push` throws, the answer is aborted: the client
 * reconnects and reads the state again). The client's leaving calls `onReturn`.
 */
export class PushSource implements AsyncIterator<Uint8Array> {
  /** Called once when the writer stops reading: the client left (or the stream ended). */
  onReturn: (() => void) | undefined;
  private readonly maxBacklog: number;
  private readonly queue: Uint8Array[] = [];
  private backlog = 0;
  private ended = false;
  private failure: Error | undefined;
  private waiter: { resolve: (r: IteratorResult<Uint8Array>) => void; reject: (e: Error) => void } | undefined;

  constructor(maxBacklog: number) {
    this.maxBacklog = maxBacklog;
  }

  push(piece: Uint8Array): void {
    if (this.ended || this.failure) return;
    const waiter = this.waiter;
    if (waiter) {
      this.waiter = undefined;
      waiter.resolve({ value: piece, done: false });
      return;
    }
    this.queue.push(piece);
    this.backlog += piece.length;
    if (this.backlog > this.maxBacklog) {
      this.failure = new Error("the client reads too slowly");
      throw this.failure;
    }
  }

  /** No more pieces: the stream ends once the queued ones are written. */
  end(): void {
    this.ended = true;
    const waiter = this.waiter;
    this.waiter = undefined;
    waiter?.resolve({ value: undefined, done: true });
  }

  next(): Promise<IteratorResult<Uint8Array>> {
    if (this.failure) return Promise.reject(this.failure);
    const piece = this.queue.shift();
    if (piece) {
      this.backlog -= piece.length;
      return Promise.resolve({ value: piece, done: false });
    }
    if (this.ended) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve, reject) => {
      this.waiter = { resolve, reject };
    });
  }

  return(): Promise<IteratorResult<Uint8Array>> {
    this.ended = true;
    this.queue.length = 0;
    const onReturn = this.onReturn;
    this.onReturn = undefined;
    onReturn?.();
    return Promise.resolve({ value: undefined, done: true });
  }
}
