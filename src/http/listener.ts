import { randomUUID } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { Socket } from "node:net";
import { getRequestListener } from "@hono/node-server";
import type { Logger } from "pino";
import { answerClientError, framingError, framingErrorBody } from "./framing.ts";
import { JSON_CONTENT_TYPE } from "./json.ts";
import type { Metrics } from "./metrics.ts";

export interface HttpServerOptions {
  fetch: (request: Request, env: { incoming: unknown; outgoing: unknown }) => Response | Promise<Response>;
  /** Time to receive a whole request, headers and body; 408 after it. */
  requestTimeoutMs: number;
  /** Open connections accepted at once; more are closed on arrival. */
  maxConnections: number;
  logger: Logger;
  metrics: Metrics;
}

/**
 * The Node HTTP/1.1 server around the app: bounded request time and connection count, and the
 * answers Node gives before the app runs (bad framing, timeouts, oversized headers) in the
 * `ErrorResponse` envelope. DataChannel streams are served by the same server
 * (`server.emit("connection", stream)`), so they get the same parser and the same bounds.
 */
export function createHttpServer(o: HttpServerOptions): Server {
  const listener = getRequestListener(o.fetch, {
    // A request Node parsed but the adapter cannot turn into a URL (a bad Host, a backslash in the path).
    errorHandler: () => {
      const f = framingError(undefined);
      return new Response(framingErrorBody(f), {
        status: f.status,
        headers: { "Content-Type": JSON_CONTENT_TYPE, "X-Request-ID": randomUUID(), "Access-Control-Allow-Origin": "*", Connection: "close" },
      });
    },
  });
  const server = createServer(
    {
      requestTimeout: o.requestTimeoutMs,
      headersTimeout: o.requestTimeoutMs,
      // Node checks the two timeouts this often (30 s by default, which would stretch a short timeout).
      connectionsCheckingInterval: Math.min(1_000, Math.max(10, Math.floor(o.requestTimeoutMs / 4))),
      // Node would answer a missing Host with a bare 400; the adapter refuses it through errorHandler, in the envelope.
      requireHostHeader: false,
    },
    listener,
  );
  server.maxConnections = o.maxConnections;
  server.on("clientError", (err: NodeJS.ErrnoException, socket) => {
    const answer = answerClientError(err, socket);
    if (!answer) return;
    // A request in flight is counted by the app when its handler ends (as a closed request).
    if (!answer.inFlight) o.metrics.observe("", "unmatched", answer.status, 0);
    o.logger.info(
      { req_id: answer.requestId, status: answer.status, code: answer.code, client: (socket as Partial<Socket>).remoteAddress },
      "request refused before routing",
    );
  });
  return server;
}
