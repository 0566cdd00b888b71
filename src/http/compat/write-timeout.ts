import type { ServerResponse } from "node:http";
import type { Context } from "hono";

/**
 * A write timeout on responses: a client that has not taken any of a response's bytes for `ms`
 * while more are waiting (the socket's buffer is full) is disconnected, which cancels whatever
 * produces the response (an upstream call, an engine). Through the Node adapter only: a stream of
 * a WebRTC connection has the transport's own flow control.
 */
export function writeTimeout(ms: number): (c: Context) => void {
  const watch = writeTimeoutOf(ms);
  return (c) => {
    const outgoing = (c.env as { outgoing?: ServerResponse } | undefined)?.outgoing;
    if (outgoing) watch(outgoing);
  };
}

/** `writeTimeout` of Node's responses. */
export function writeTimeoutOf(ms: number): (outgoing: ServerResponse) => void {
  return watcher(ms);
}

interface Watched {
  outgoing: ServerResponse;
  stalledSince: number | undefined;
}

/**
 * One timer for all the responses in progress (a timer of each response's own showed in the
 * profile of short relayed calls), running only while there are some.
 */
function watcher(ms: number): (outgoing: ServerResponse) => void {
  const watched = new Set<Watched>();
  let timer: NodeJS.Timeout | undefined;
  const sweep = () => {
    if (watched.size === 0) {
      // Stopped only once a whole period passed with nothing to watch: not at every response's end.
      clearInterval(timer);
      timer = undefined;
      return;
    }
    const now = performance.now();
    for (const w of watched) {
      if (w.outgoing.destroyed) continue;
      if (!w.outgoing.writableNeedDrain) {
        w.stalledSince = undefined;
        continue;
      }
      w.stalledSince ??= now;
      if (now - w.stalledSince >= ms) w.outgoing.destroy();
    }
  };
  return (outgoing) => {
    const w: Watched = { outgoing, stalledSince: undefined };
    const onDrain = () => {
      w.stalledSince = undefined;
    };
    watched.add(w);
    if (!timer) {
      timer = setInterval(sweep, Math.max(10, Math.floor(ms / 4)));
      timer.unref();
    }
    outgoing.on("drain", onDrain);
    outgoing.once("close", () => {
      watched.delete(w);
      outgoing.off("drain", onDrain);
    });
  };
}
