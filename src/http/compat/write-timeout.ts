import type { ServerResponse } from "node:http";
import type { MiddlewareHandler } from "hono";
import type { CompatEnv } from "./env.ts";

/**
 * A write timeout on responses: a client that has not taken any of a response's bytes for `ms`
 * while more are waiting (the socket's buffer is full) is disconnected, which cancels whatever
 * produces the response (an upstream call, an engine). Through the Node adapter only: a stream of
 * a WebRTC connection has the transport's own flow control.
 */
export function writeTimeout(ms: number): MiddlewareHandler<CompatEnv> {
  return async (c, next) => {
    const outgoing = (c.env as { outgoing?: ServerResponse } | undefined)?.outgoing;
    if (outgoing) watch(outgoing, ms);
    await next();
  };
}

function watch(outgoing: ServerResponse, ms: number): void {
  let stalledSince: number | undefined;
  const onDrain = () => {
    stalledSince = undefined;
  };
  const timer = setInterval(
    () => {
      if (outgoing.destroyed) return;
      if (!outgoing.writableNeedDrain) {
        stalledSince = undefined;
        return;
      }
      stalledSince ??= performance.now();
      if (performance.now() - stalledSince >= ms) outgoing.destroy();
    },
    Math.max(10, Math.floor(ms / 4)),
  );
  timer.unref();
  outgoing.on("drain", onDrain);
  outgoing.once("close", () => {
    clearInterval(timer);
    outgoing.off("drain", onDrain);
  });
}
