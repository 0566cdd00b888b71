import { sseErrorEvent } from "./errors.ts";

/** How a streamed answer ended, for the metrics: 200 (with an error type when it broke off) or 499 (the client left). */
export type StreamEnd = (status: number, errorType?: string) => void;

/**
 * A response body pulled from `source` one piece at a time, as the client reads (no buffering).
 * When the source fails after the response started, an event stream (`sse`) ends with the
 * surface's `error` event (mapped as every error is, `sseErrorEvent`); raw bytes (audio) are
 * aborted instead (no final chunk), which every HTTP client reports as an error, rather than
 * ending like a whole file. Cancelling it (the client went away) ends the source, which closes
 * whatever it holds (a provider's connection, an engine's slot).
 */
export function streamBody<T>(
  source: AsyncIterator<T>,
  o: {
    sse: boolean;
    encode: (value: T) => Uint8Array;
    /** Bytes after the last piece (`speech.audio.done`). */
    last?: () => Uint8Array;
    done: StreamEnd;
  },
): ReadableStream<Uint8Array> {
  // Once: a client that leaves while a piece is awaited cancels (499), and the source's failure
  // that follows (its upstream call cut) must not count the call again.
  let ended = false;
  const done: StreamEnd = (status, errorType) => {
    if (ended) return;
    ended = true;
    o.done(status, errorType);
  };
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        let next: IteratorResult<T>;
        try {
          next = await source.next();
        } catch (err) {
          done(200, "api_error");
          if (!o.sse) return controller.error(err);
          controller.enqueue(sseErrorEvent(err));
          controller.close();
          return;
        }
        if (next.done) {
          if (o.last) controller.enqueue(o.last());
          done(200);
          controller.close();
          return;
        }
        controller.enqueue(o.encode(next.value));
      },
      async cancel() {
        done(499);
        await source.return?.();
      },
    },
    { highWaterMark: 0 },
  );
}

/** Bytes passed on as they are. */
export const asIs = (bytes: Uint8Array): Uint8Array => bytes;

/** Headers of a streamed answer; `transfer-encoding` declared, so that the Node adapter writes the first piece at once instead of waiting a timer tick to see whether the body is short. */
export function streamHeaders(contentType: string): Record<string, string> {
  const sse = contentType.startsWith("text/event-stream");
  return { "content-type": contentType, ...(sse ? { "cache-control": "no-cache", "x-accel-buffering": "no" } : {}), "transfer-encoding": "chunked" };
}

export const EVENT_STREAM = "text/event-stream; charset=utf-8";

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
