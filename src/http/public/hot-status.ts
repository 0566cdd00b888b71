import type { IncomingMessage, ServerResponse } from "node:http";
import type { Logger } from "pino";
import { requestIdOf } from "../exchange.ts";
import { nodeHeader } from "../headers.ts";
import { type HotRoute, hotExchange, writeJson } from "../hot-routes.ts";
import { JSON_CONTENT_TYPE } from "../json.ts";
import type { Metrics } from "../metrics.ts";
import type { Callers } from "../principal.ts";

export const STATUS_PATH = "/me/status";

/**
 * `GET /me/status` served by the listener (see hot-routes.ts): the caller's document as stored,
 * read with the session in one statement (`Callers.primaryStatusOf`, as the app's route reads it).
 * It answers only success; a request with a body, and any failure to authenticate or read (which
 * changed nothing), go to the app, which answers them with its own errors.
 */
export function hotStatusRoute(o: { callers: Callers; logger: Logger; metrics: Metrics }): HotRoute {
  const record = hotExchange(o.logger, o.metrics, STATUS_PATH);
  const serve = async (incoming: IncomingMessage, outgoing: ServerResponse, app: () => void) => {
    const started = performance.now();
    const env = { incoming, outgoing };
    let statusText: string | undefined;
    try {
      ({ statusText } = await o.callers.primaryStatusOf(env, (name) => nodeHeader(incoming, name)));
    } catch {
      app();
      return;
    }
    const requestId = requestIdOf(nodeHeader(incoming, "x-request-id"));
    writeJson(outgoing, requestId, 200, JSON_CONTENT_TYPE, statusText ?? "{}");
    record(requestId, "GET", 200, o.callers.resolveAddress(env), started);
  };
  return (incoming, outgoing, app) => {
    // The app's body limit decides a request with a body (413 over 64 KiB, a chunked one read).
    if (incoming.headers["content-length"] !== undefined || incoming.headers["transfer-encoding"] !== undefined) return false;
    serve(incoming, outgoing, app).catch((err: unknown) => {
      o.logger.error({ err, path: STATUS_PATH }, "hot route failed");
      outgoing.destroy();
    });
    return true;
  };
}
