import type { ServerResponse } from "node:http";
import type { Context, MiddlewareHandler } from "hono";
import { matchedRoutes } from "hono/route";
import { bodyWithinLimit } from "./body.ts";
import type { AppEnv } from "./env.ts";
import { ApiError } from "./errors.ts";
import { exchangeOf } from "./exchange.ts";
import { requestHeader } from "./headers.ts";

/**
 * The application's one root middleware: the exchange (exchange.ts) did the request id, CORS and
 * shared headers before the request got here; this hands the route's pattern and the answer's
 * status back to it for the log line and metrics.
 */
export const reported: MiddlewareHandler<AppEnv> = async (c, next) => {
  const x = exchangeOf(c.env);
  if (!x) throw new Error("the application is served through the exchange (src/http/exchange.ts)");
  c.set("requestId", x.requestId);
  await next();
  x.record(c.res.status, handlerPath(c) ?? "unmatched");
};

/**
 * The pattern of the route answering a request (`/contacts/:name`): its handler's, not a
 * middleware's (a surface's gate that refused it, `/openai/v1/*`); undefined when no route matched.
 */
export function handlerPath(c: Context): string | undefined {
  const matched = matchedRoutes(c);
  const current = matched[c.req.routeIndex];
  if (current && current.method !== "ALL") return current.path;
  for (let i = matched.length - 1; i >= 0; i--) {
    const r = matched[i]!;
    if (r.method !== "ALL") return r.path;
  }
  return undefined;
}

/** The status recorded for a request its client abandoned ("client closed request"). */
export const CLIENT_CLOSED_REQUEST = 499;

/**
 * Whether the client went away before its answer: before its request arrived whole (reading the
 * body then fails) or while the answer was being made (a call to a provider then ends aborted).
 * Either is the client's doing, not a server error, and nobody reads the answer.
 */
export function clientClosedRequest(c: Context<AppEnv>): boolean {
  const { incoming, outgoing } = c.env ?? {};
  if (outgoing && clientLeft(outgoing)) return true;
  if (incoming) return !incoming.complete && (incoming.destroyed || incoming.socket?.destroyed === true);
  return c.req.raw.signal?.aborted === true;
}

/** Whether the client of `outgoing` went away before its answer was written whole. */
export function clientLeft(outgoing: ServerResponse): boolean {
  return outgoing.destroyed && !outgoing.writableFinished;
}

const UTF8 = new TextDecoder("utf-8", { fatal: true });

/**
 * Refuses a body that is not declared JSON (the validators would otherwise read a missing body as
 * `{}`), or that is not well-formed UTF-8: read leniently, each bad byte would become U+FFFD, so
 * distinct bodies would store the same text and the echo would differ from what was sent.
 */
export const requireJson: MiddlewareHandler<AppEnv> = async (c, next) => {
  const type = requestHeader(c, "content-type")?.split(";")[0]?.trim().toLowerCase();
  if (type !== "application/json") throw new ApiError(415, "UNSUPPORTED_MEDIA_TYPE", "Content-Type must be application/json");
  try {
    // Hono keeps the bytes, so the validator parses them without reading the body again.
    UTF8.decode(await c.req.arrayBuffer());
  } catch {
    throw new ApiError(400, "INVALID_REQUEST", "the body is not well-formed UTF-8");
  }
  await next();
};

/** `bodyWithinLimit` of a Hono request: a body read here is put back on the web request for the route's validator. */
export function bodyWithin(c: Context<AppEnv>, maxSize: number, drainLimit = 16 * maxSize): boolean | Promise<boolean> {
  const within = bodyWithinLimit(c.env, maxSize, drainLimit);
  if (typeof within === "boolean") return within;
  return within.then((ok) => {
    if (ok && c.env.body) c.req.raw = new Request(c.req.raw, { body: c.env.body as Uint8Array<ArrayBuffer> });
    return ok;
  });
}

/** Refuses a request body over `maxSize` bytes with `tooLarge` (see `bodyWithin`). */
export function bodyLimit(maxSize: number, tooLarge: (c: Context<AppEnv>) => Response, drainLimit = 16 * maxSize): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    const within = bodyWithin(c, maxSize, drainLimit);
    if (within === true || (within !== false && (await within))) return next();
    return tooLarge(c);
  };
}
