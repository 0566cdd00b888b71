import type { Logger } from "pino";
import { bodyWithinLimit } from "../body.ts";
import { errorBody, toApiError } from "../errors.ts";
import { logFailure, type NativeRoute } from "../exchange.ts";
import { nodeHeader } from "../headers.ts";
import { writeJson } from "../json.ts";
import { CLIENT_CLOSED_REQUEST, clientLeft } from "../middleware.ts";
import type { Callers } from "../principal.ts";
import { JSON_BODY_LIMIT, payloadTooLarge } from "./limits.ts";

export const STATUS_PATH = "/me/status";

/**
 * `GET /me/status`, the route devices poll most: served on Node's request and response (its only
 * handler; documented in the OpenAPI document by `me.ts`). The caller's document as stored, read
 * with the session in one statement (`Callers.primaryStatusOf`); the Public API's body limit and
 * its `ErrorResponse` for every refusal.
 */
export function statusRoute(o: { callers: Callers; logger: Logger }): NativeRoute {
  return {
    method: "GET",
    path: STATUS_PATH,
    async serve(x) {
      const { incoming, outgoing } = x;
      try {
        const within = bodyWithinLimit(x.env, JSON_BODY_LIMIT);
        if (within !== true && (within === false || !(await within))) throw payloadTooLarge();
        const { statusText } = await o.callers.primaryStatusOf(x.env, (name) => nodeHeader(incoming, name));
        writeJson(x, 200, statusText ?? "{}");
        x.record(200, STATUS_PATH);
      } catch (err) {
        if (clientLeft(outgoing) || (!incoming.complete && incoming.destroyed)) {
          x.record(CLIENT_CLOSED_REQUEST, STATUS_PATH);
          return;
        }
        const e = toApiError(err);
        logFailure(o.logger, err, e.status, x.requestId, x.path);
        writeJson(x, e.status, JSON.stringify(errorBody(e)), { retryAfter: e.retryAfter });
        x.record(e.status, STATUS_PATH);
      }
    },
  };
}
