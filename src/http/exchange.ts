import { randomUUID } from "node:crypto";
import type { Logger } from "pino";
import { StoreUnavailable } from "../domain/index.ts";
import type { Metrics } from "./metrics.ts";

/**
 * What every answer shares, whoever serves it (the app's root middleware, or a hot route of the
 * listener, `hot-routes.ts`): the request id, the CORS headers, the log line and the metrics, and
 * how a failed request is logged. One definition, so both paths answer and record alike.
 */

const REQUEST_ID = /^[A-Za-z0-9._-]{1,128}$/;
export const CORS_EXPOSE_HEADERS = "X-Request-ID, Retry-After, Server-Timing";

/** A well-formed inbound `X-Request-ID`, otherwise a new one. */
export function requestIdOf(inbound: string | undefined): string {
  return inbound && REQUEST_ID.test(inbound) ? inbound : randomUUID();
}

/** The headers every answer but a preflight's carries, set before the answer exists (in this order). */
export function sharedHeaders(header: (name: string, value: string) => void, requestId: string): void {
  header("X-Request-ID", requestId);
  header("Access-Control-Allow-Origin", "*");
  header("Access-Control-Expose-Headers", CORS_EXPOSE_HEADERS);
}

export interface Exchange {
  requestId: string;
  method: string;
  path: string;
  /** The route's pattern (`/me/status`), or `unmatched`. */
  route: string;
  status: number;
  client: string;
  /** Since the request reached the app. */
  ms: number;
}

/**
 * The request's log line and metrics. Only method, path, route, status, client address and timing
 * are logged: never headers, query strings or bodies, which can hold credentials.
 */
export function recordExchange(logger: Logger, metrics: Metrics, e: Exchange): void {
  metrics.observe(e.method, e.route, e.status, e.ms / 1000);
  if (logger.isLevelEnabled("info")) {
    logger.info(
      { req_id: e.requestId, method: e.method, path: e.path, route: e.route, status: e.status, client: e.client, ms: Math.round(e.ms * 100) / 100 },
      "request",
    );
  }
}

/** Logs a request that failed with `status`: an unreachable store without the stack (during an outage every request says the same), a server error with it. */
export function logFailure(logger: Logger, err: unknown, status: number, requestId: string, path: string): void {
  if (err instanceof StoreUnavailable) logger.warn({ err: err.message, req_id: requestId, path }, "store unavailable");
  else if (status >= 500) logger.error({ err, req_id: requestId, path }, "request failed");
}
