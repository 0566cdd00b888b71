import type { ServerResponse } from "node:http";
import type { Socket } from "node:net";
import type { Context } from "hono";

/**
 * A write timeout on responses: a client that has not taken any of a response's bytes for `ms`
 * while more are waiting (in its socket's buffer) is disconnected, which cancels whatever
 * produces the response (an upstream call, an engine). A streamed answer is watched from its
 * start; a whole one, written at once, only when its socket could not take all of it then.
 * Through the Node adapter only: a stream of a WebRTC connection has the transport's own flow control.
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
  /** The socket's bytes waiting at the last sweep. */
  waiting: number;
  stalledSince: number | undefined;
}

/**
 * One timer for all the responses in progress (a timer of each response's own showed in the
 * profile of short relayed calls), running only while there are some. What is read is the
 * socket's buffer, not the response's `writableNeedDrain` (false once a response has ended, so a
 * whole answer sitting in the buffer never counted as stalled): a response is stalled while its
 * socket holds bytes and fewer of them have left than the sweep before.
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
      const socket = w.outgoing.socket;
      if (w.outgoing.destroyed || !socket) continue;
      const waiting = waitingBytes(socket);
      const moved = waiting === 0 || waiting !== w.waiting;
      w.waiting = waiting;
      if (moved) {
        w.stalledSince = undefined;
        continue;
      }
      w.stalledSince ??= now;
      if (now - w.stalledSince >= ms) w.outgoing.destroy();
    }
  };
  return (outgoing) => {
    const w: Watched = { outgoing, waiting: 0, stalledSince: undefined };
    watched.add(w);
    if (!timer) {
      timer = setInterval(sweep, Math.max(10, Math.floor(ms / 4)));
      timer.unref();
    }
    outgoing.once("close", () => watched.delete(w));
  };
}

/**
 * Bytes the socket has not yet handed to the kernel. A whole answer is one write, which
 * `writableLength` counts whole until it completes: the handle's queue (what Node's own socket
 * timeout reads for the same purpose) shrinks as the client takes it.
 */
function waitingBytes(socket: Socket): number {
  const queued = (socket as unknown as { _handle?: { writeQueueSize?: number } })._handle?.writeQueueSize;
  return socket.writableLength + (typeof queued === "number" ? queued : 0);
}

/** Whether a whole answer, just written, still waits in its socket for the client to take it. */
export function unsent(outgoing: ServerResponse): boolean {
  return !outgoing.destroyed && (outgoing.socket?.writableLength ?? 0) > 0;
}
