import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { Socket } from "node:net";
import { getRequestListener } from "@hono/node-server";
import type { Logger } from "pino";
import {
  answerClientError,
  answerOnSocket,
  CONNECT_REFUSED,
  EXPECTATION_FAILED,
  type FramingError,
  framingError,
  framingErrorBody,
  framingErrorHeaders,
} from "./framing.ts";
import type { HotRoutes } from "./hot-routes.ts";
import type { Metrics } from "./metrics.ts";

export interface HttpServerOptions {
  fetch: (request: Request, env: { incoming: unknown; outgoing: unknown }) => Response | Promise<Response>;
  /** Time to receive a whole request, headers and body; 408 after it. */
  requestTimeoutMs: number;
  /** Open connections accepted at once; more are closed on arrival. */
  maxConnections: number;
  logger: Logger;
  metrics: Metrics;
  /** Routes the listener serves before the app (hot-routes.ts): the TCP listener's only. */
  hot?: HotRoutes;
}

/**
 * The Node HTTP/1.1 server around the app: bounded request time and connection count, and the
 * answers Node gives before the app runs (bad framing, timeouts, oversized headers, no Host,
 * CONNECT, an unsupported expectation) in the
 * `ErrorResponse` envelope. DataChannel streams are served by the same server
 * (`server.emit("connection", stream)`), so they get the same parser and the same bounds.
 */
export function createHttpServer(o: HttpServerOptions): Server {
  const { hot } = o;
  // The adapter calls the app only for a request whose Host it accepted: the hot routes learn them here.
  const fetch: HttpServerOptions["fetch"] = hot
    ? (request, env) => {
        hot.accepted((env.incoming as IncomingMessage | undefined)?.headers.host);
        return o.fetch(request, env);
      }
    : o.fetch;
  const app = getRequestListener(fetch, {
    // A request Node parsed but the adapter cannot turn into a URL (a bad Host, a backslash in the path).
    errorHandler: () => {
      const f = framingError(undefined);
      const body = framingErrorBody(f);
      const headers = framingErrorHeaders(body, randomUUID());
      return new Response(body, { status: f.status, headers });
    },
  });
  const listener = hot
    ? (incoming: IncomingMessage, outgoing: ServerResponse) => {
        if (!hot.take(incoming, outgoing, () => void app(incoming, outgoing))) void app(incoming, outgoing);
      }
    : app;
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
  const refused = (f: FramingError, requestId: string, socket: unknown, counted = true) => {
    if (counted) o.metrics.observe("", "unmatched", f.status, 0);
    const client = (socket as Partial<Socket> | null)?.remoteAddress;
    o.logger.info({ req_id: requestId, status: f.status, code: f.code, client }, "request refused before routing");
  };
  server.on("clientError", (err: NodeJS.ErrnoException, socket) => {
    const answer = answerClientError(err, socket);
    // A request in flight is counted by the app when its handler ends (as a closed request).
    if (answer) refused(answer, answer.requestId, socket, !answer.inFlight);
  });
  server.on("connect", (_req, socket) => refused(CONNECT_REFUSED, answerOnSocket(socket, CONNECT_REFUSED), socket));
  server.on("checkExpectation", (_req, res) => {
    const requestId = randomUUID();
    const body = framingErrorBody(EXPECTATION_FAILED);
    res.writeHead(EXPECTATION_FAILED.status, framingErrorHeaders(body, requestId)).end(body);
    refused(EXPECTATION_FAILED, requestId, res.socket);
  });
  return server;
}
