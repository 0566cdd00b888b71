import type { ServerResponse } from "node:http";
import { sseErrorEvent } from "./compat/errors.ts";
import type { StreamEnd } from "./compat/stream-body.ts";
import { sharedHeaders } from "./exchange.ts";

/**
 * Starts a streamed answer as the app's Node adapter starts one whose headers the app gave as an
 * object of several (a web `Headers`, copied out in its order: lower-case names, sorted): the
 * shared headers first, then those. Not flushed yet: `pipeEvents` sends them with the first piece
 * when it is at hand, else at once.
 */
export function writeStreamHead(outgoing: ServerResponse, requestId: string, headers: Record<string, string>): void {
  const list: string[] = [];
  sharedHeaders((name, value) => void list.push(name, value), requestId);
  for (const name of Object.keys(headers).sort()) list.push(name.toLowerCase(), headers[name]!);
  outgoing.writeHead(200, list);
}

/**
 * Writes a server-sent event stream to `outgoing` as the app's route writes it (`streamBody`
 * through the adapter), without a web stream between them: the next piece is asked for once the
 * last one is taken (or drained); a failure of `source` ends the answer with the surface's
 * `error` event; the client's going away ends `source` (which closes what it holds). `done` says
 * how it ended, once.
 */
export async function pipeEvents(source: AsyncIterator<Uint8Array>, outgoing: ServerResponse, done: StreamEnd): Promise<void> {
  let ended = false;
  const end = (status: number, errorType?: string) => {
    if (ended) return false;
    ended = true;
    done(status, errorType);
    return true;
  };
  const left = () => {
    if (outgoing.writableFinished || !end(499)) return;
    source.return?.().catch(() => {});
  };
  outgoing.once("close", left);
  try {
    if (outgoing.destroyed) return left();
    let first: Promise<IteratorResult<Uint8Array>> | undefined = source.next();
    // As the adapter: the head goes out with the first piece if that is at hand (a provider's
    // stream starts with its first event), else at once (an agent's tool step has nothing yet).
    if (!(await settledNow(first))) outgoing.flushHeaders();
    for (;;) {
      let next: IteratorResult<Uint8Array>;
      try {
        next = await (first ?? source.next());
        first = undefined;
      } catch (err) {
        if (end(200, "api_error")) outgoing.end(sseErrorEvent(err));
        return;
      }
      if (ended) return;
      if (next.done) {
        end(200);
        outgoing.end();
        return;
      }
      if (!outgoing.write(next.value)) await drained(outgoing);
      if (ended) return;
    }
  } finally {
    outgoing.off("close", left);
  }
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
