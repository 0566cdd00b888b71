import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import { getRequestListener } from "@hono/node-server";
import type { Logger } from "pino";
import { recordRefusal } from "./exchange.ts";
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
import type { Metrics } from "./metrics.ts";

export type RequestListener = (incoming: IncomingMessage, outgoing: ServerResponse) => void;

export interface HttpServerOptions {
  /** What serves each request: the exchange (exchange.ts). */
  listener: RequestListener;
  /** Time to receive a whole request, headers and body; 408 after it. */
  requestTimeoutMs: number;
  /** Open connections accepted at once; more are closed on arrival. */
  maxConnections: number;
  logger: Logger;
  metrics: Metrics;
  /** Serve HTTPS with this certificate and key (PEM) instead of HTTP. */
  tls?: { cert: Buffer; key: Buffer } | undefined;
}

/**
 * A web-standard application served through Hono's Node adapter. A request the adapter cannot turn
 * into a URL gets a framing error; the exchange refuses those before the adapter sees them.
 */
export function adapterListener(fetch: (request: Request, env: { incoming: unknown; outgoing: unknown }) => Response | Promise<Response>): RequestListener {
  const listener = getRequestListener(fetch, {
    errorHandler: () => {
      const f = framingError(undefined);
      const body = framingErrorBody(f);
      return new Response(body, { status: f.status, headers: framingErrorHeaders(body, randomUUID()) });
    },
  });
  return (incoming, outgoing) => void listener(incoming, outgoing);
}

/**
 * The Node HTTP/1.1 server around the exchange: bounded request time and connection count, and the
 * answers Node gives before any route runs (bad framing, timeouts, oversized headers, CONNECT, an
 * unsupported expectation) in the `ErrorResponse` envelope. DataChannel streams are served by
 * servers made here too (`server.emit("connection", stream)`), so they get the same parser and the
 * same bounds.
 */
export function createHttpServer(o: HttpServerOptions): Server {
  const options = {
    requestTimeout: o.requestTimeoutMs,
    headersTimeout: o.requestTimeoutMs,
    // Node checks the two timeouts this often (30 s by default, which would stretch a short timeout).
    connectionsCheckingInterval: Math.min(1_000, Math.max(10, Math.floor(o.requestTimeoutMs / 4))),
    // Node would answer a missing Host with a bare 400; the exchange refuses it in the envelope.
    requireHostHeader: false,
  };
  // An HTTPS server is an HTTP server (same parser, bounds and events) behind a TLS handshake.
  const server = o.tls
    ? (createHttpsServer({ ...options, cert: o.tls.cert, key: o.tls.key }, o.listener) as unknown as Server)
    : createServer(options, o.listener);
  server.maxConnections = o.maxConnections;
  const refused = (f: FramingError, requestId: string, socket: unknown, counted = true) => recordRefusal(o.logger, o.metrics, f, requestId, socket, counted);
  server.on("clientError", (err: NodeJS.ErrnoException, socket) => {
    const answer = answerClientError(err, socket);
    // A request in flight is counted by the exchange when its handler ends (as a closed request).
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
