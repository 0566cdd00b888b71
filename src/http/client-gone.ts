import type { IncomingMessage, ServerResponse } from "node:http";
import type { Context } from "hono";

/** The Node request and response behind `c`, when it came through the Node adapter. */
export function nodeBindings(c: Context): { incoming: IncomingMessage; outgoing: ServerResponse } | undefined {
  const env = c.env as { incoming?: IncomingMessage; outgoing?: ServerResponse } | undefined;
  return env?.incoming && env.outgoing ? { incoming: env.incoming, outgoing: env.outgoing } : undefined;
}

/**
 * Aborted when the client goes away before the response is complete, or is already gone (the Node
 * adapter's own signal needs a full Request).
 */
export function clientGone(c: Context): AbortSignal {
  const node = nodeBindings(c);
  if (!node) return c.req.raw.signal;
  return clientGoneOf(node.outgoing);
}

/** `clientGone` of a Node response. */
export function clientGoneOf(outgoing: ServerResponse): AbortSignal {
  if (outgoing.destroyed && !outgoing.writableFinished) return AbortSignal.abort(new Error("the client closed the connection"));
  const controller = new AbortController();
  outgoing.once("close", () => {
    if (!outgoing.writableFinished) controller.abort(new Error("the client closed the connection"));
  });
  return controller.signal;
}
