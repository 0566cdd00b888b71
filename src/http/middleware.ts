import type { ServerResponse } from "node:http";
import type { Context, MiddlewareHandler } from "hono";
import { routePath } from "hono/route";
import type { Logger } from "pino";
import type { AppEnv } from "./env.ts";
import { ApiError } from "./errors.ts";
import { recordExchange, requestIdOf, sharedHeaders } from "./exchange.ts";
import { requestHeader } from "./headers.ts";
import type { Metrics } from "./metrics.ts";
import type { Callers } from "./principal.ts";

const CORS_ALLOW_METHODS = "GET, POST, PUT, DELETE, OPTIONS";
const CORS_ALLOW_HEADERS = "Authorization, Content-Type, X-Public-Key, X-Registration-Token, X-Request-ID";

/**
 * What every request gets, in one pass (one middleware frame instead of three):
 *
 * - a request id: a well-formed inbound `X-Request-ID` echoed, otherwise a new one; every response
 *   carries it;
 * - CORS for any origin: preflights answer 204 without authentication. Hand-written rather than
 *   hono/cors because that one touches `c.res` before the handler runs, which makes the Node adapter
 *   stream every response instead of writing it at once (it cost a quarter of the throughput);
 * - one log line and one metrics observation. Only method, path, route, status, client address and
 *   timing are logged: never headers, query strings or bodies, which can hold credentials.
 *
 * Under the Node server the shared headers go straight onto Node's response, which merges them into
 * whatever the app answers (errors, 404s and streams included): set through the context, each
 * request would build a web `Headers` object and the adapter would copy it out again.
 */
export function shared(logger: Logger, metrics: Metrics, callers: Callers): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    const started = performance.now();
    const id = requestIdOf(requestHeader(c, "x-request-id"));
    c.set("requestId", id);
    const outgoing = c.env?.outgoing;
    const header = outgoing ? (name: string, value: string) => void outgoing.setHeader(name, value) : c.header;
    // Set before the response exists, so every response carries them.
    if (c.req.method === "OPTIONS") {
      header("X-Request-ID", id);
      header("Access-Control-Allow-Origin", "*");
      header("Access-Control-Allow-Methods", CORS_ALLOW_METHODS);
      header("Access-Control-Allow-Headers", requestHeader(c, "access-control-request-headers") || CORS_ALLOW_HEADERS);
      header("Access-Control-Max-Age", "600");
      header("Vary", "Access-Control-Request-Headers");
      c.res = c.body(null, 204);
    } else {
      sharedHeaders(header, id);
      await next();
    }
    const path = routePath(c);
    recordExchange(logger, metrics, {
      requestId: id,
      method: c.req.method,
      path: c.req.path,
      route: path === "/*" ? "unmatched" : path,
      status: c.res.status,
      client: callers.address(c),
      ms: performance.now() - started,
    });
  };
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

/**
 * Reads a request body of at most `maxSize` bytes; null when it is larger. A body without
 * Content-Length is counted as it arrives and, once over the limit, still read (and dropped) to
 * its end, up to `drainLimit` bytes: a client still sending would otherwise stall on a socket
 * nobody reads and never see the answer. A declared length over the limit is refused unread, so
 * that the adapter can drain it after the answer.
 */
export async function readBodyWithin(c: Context<AppEnv>, maxSize: number, drainLimit = 16 * maxSize): Promise<Uint8Array<ArrayBuffer> | null> {
  // Headers first: touching `body` starts reading it.
  const declared = requestHeader(c, "content-length");
  const chunked = requestHeader(c, "transfer-encoding") !== undefined;
  if (declared !== undefined && !chunked && Number(declared) > maxSize) return null;
  const body = c.req.raw.body;
  if (!body) return new Uint8Array(0);
  const reader = body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  while (size <= drainLimit) {
    const r = await reader.read();
    if (r.done) break;
    size += r.value.length;
    if (size <= maxSize) chunks.push(r.value);
  }
  return size > maxSize ? null : Buffer.concat(chunks);
}

/**
 * Whether the request body is at most `maxSize` bytes. A declared length is judged unread (at once,
 * no promise); a chunked body is read here (up to `drainLimit`) and kept on the request for the
 * route. Hono's `bodyLimit` leaves the stream half read.
 */
export function bodyWithin(c: Context<AppEnv>, maxSize: number, drainLimit = 16 * maxSize): boolean | Promise<boolean> {
  const declared = requestHeader(c, "content-length");
  const chunked = requestHeader(c, "transfer-encoding") !== undefined;
  if (declared !== undefined && !chunked) return Number(declared) <= maxSize;
  if (!chunked) return true; // HTTP/1.1: neither header means no body
  return readBodyWithin(c, maxSize, drainLimit).then((body) => {
    if (!body) return false;
    c.req.raw = new Request(c.req.raw, { body });
    return true;
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
