import type { ServerResponse } from "node:http";
import { ATTR_HTTP_REQUEST_METHOD, ATTR_HTTP_RESPONSE_STATUS_CODE, ATTR_HTTP_ROUTE, ATTR_URL_PATH } from "@opentelemetry/semantic-conventions";
import { SpanKind, type Traced, type Tracing } from "./tracing.ts";

/**
 * The server span of one HTTP request, from its arrival at the exchange to its response's close
 * (a stream's last byte, or the client's leaving). Named by the route's pattern once it is known
 * (`routedSpan`); the path is an attribute (no query string, which can hold credentials).
 */
export function requestSpan(tracing: Tracing, outgoing: ServerResponse, method: string, path: string): Traced | undefined {
  const traced = tracing.root(method, { [ATTR_HTTP_REQUEST_METHOD]: method, [ATTR_URL_PATH]: path }, SpanKind.SERVER);
  if (!traced) return undefined;
  outgoing.once("close", () => {
    if (!outgoing.writableFinished) traced.set("perch.http.client_left", true);
    traced.end();
  });
  return traced;
}

/** The request's route and status, once the exchange records them; the trace id for the log line. */
export function routedSpan(traced: Traced, method: string, route: string, status: number): string {
  if (route === "unmatched") traced.set(ATTR_HTTP_RESPONSE_STATUS_CODE, status);
  else traced.rename(`${method} ${route}`).setAll({ [ATTR_HTTP_RESPONSE_STATUS_CODE]: status, [ATTR_HTTP_ROUTE]: route });
  if (status >= 500) traced.fail(String(status));
  return traced.traceId;
}
