import type { ServerResponse } from "node:http";
import type { Socket } from "node:net";

/**
 * A write timeout on responses: a client that has not taken any of a response's bytes for `ms`
 * while more are waiting (in its socket's buffer) is disconnected, which cancels whatever
 * produces the response (an upstream call, an engine). A response is watched from its start, or
 * (a whole answer of a native route) only once written, when its socket could not take it at once (`unsent`).
 */
export function writeTimeout(ms: number): (outgoing: ServerResponse) => void {
  return watcher(ms);
}

interface Watched {
  outgoing: ServerResponse;
  /** The socket's bytes waiting at the last sweep (a TCP socket's). */
  waiting: number;
  stalledSince: number | undefined;
}

/**
 * One timer for all the responses in progress (a timer of each response's own showed in the
 * profile of short relayed calls), running only while there are some.
 *
 * On a TCP socket progress is read from the socket: a response is stalled while bytes wait in its
 * buffer and the handle's queue (what Node's own socket timeout reads for the same purpose) and
 * their count has not changed since the sweep before. The response's own `writableNeedDrain`
 * is false once it has ended, so a whole answer a client never read was never cut; and a whole
 * answer is one write, which `writableLength` alone counts whole until it completes. Any other
 * socket (a DataChannel stream of the WebRTC transport, served by the same adapter) has neither:
 * there the response's own flag and its `drain` events say, as before.
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
      if (moving(w)) {
        w.stalledSince = undefined;
        continue;
      }
      w.stalledSince ??= now;
      if (now - w.stalledSince >= ms) w.outgoing.destroy();
    }
  };
  return (outgoing) => {
    if (outgoing.destroyed || outgoing.closed) return;
    const w: Watched = { outgoing, waiting: 0, stalledSince: undefined };
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

/** Whether `w`'s client took bytes since the last sweep, or has none waiting (updates `w.waiting`). */
function moving(w: Watched): boolean {
  const socket = w.outgoing.socket;
  if (!socket) return true; // queued behind an earlier response on its connection: nothing written yet
  const queued = queueOf(socket);
  if (queued === undefined) return !w.outgoing.writableNeedDrain;
  const waiting = socket.writableLength + queued;
  const moved = waiting === 0 || waiting !== w.waiting;
  w.waiting = waiting;
  return moved;
}

/** The bytes a TCP socket's handle has queued for the kernel; undefined for any other socket. */
function queueOf(socket: Socket): number | undefined {
  const queued = (socket as unknown as { _handle?: { writeQueueSize?: unknown } })._handle?.writeQueueSize;
  return typeof queued === "number" ? queued : undefined;
}

/**
 * Whether a whole answer, just written, may still wait for the client to take it: its socket
 * holds bytes, or it has none yet (queued behind an earlier answer on the same connection).
 */
export function unsent(outgoing: ServerResponse): boolean {
  if (outgoing.destroyed) return false;
  const socket = outgoing.socket;
  return !socket || socket.writableLength > 0 || (queueOf(socket) ?? 0) > 0;
}
