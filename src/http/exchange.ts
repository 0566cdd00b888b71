import { randomUUID } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Socket } from "node:net";
import type { Logger } from "pino";
import type { Caller } from "../ai/caller.ts";
import { StoreUnavailable } from "../domain/index.ts";
import type { Principal } from "../domain/principal.ts";
import { requestSpan, routedSpan } from "../observability/http-spans.ts";
import type { Traced, Tracing } from "../observability/tracing.ts";
import type { AppBindings } from "./env.ts";
import { type FramingError, framingError, framingErrorBody, framingErrorHeaders } from "./framing.ts";
import { nodeHeader } from "./headers.ts";
import type { Metrics } from "./metrics.ts";
import type { Callers } from "./principal.ts";

/**
 * The one exchange: the Node request listener of every HTTP server of a node (the TCP listener,
 * each service stream's server, the in-process requests of the fast tests). Every request, whatever
 * route answers it, gets here, in this order: its target and `Host` checked, its request id, CORS
 * (a preflight is answered here), the headers every answer carries, then its route's one handler
 * (a native route of a surface, or the Hono application for every other route), and one log line
 * and metrics observation, recorded through `Exchange.record`.
 */

const REQUEST_ID = /^[A-Za-z0-9._-]{1,128}$/;
export const CORS_EXPOSE_HEADERS = "X-Request-ID, Retry-After, Server-Timing";
const CORS_ALLOW_METHODS = "GET, POST, PUT, DELETE, OPTIONS";
const CORS_ALLOW_HEADERS = "Authorization, Content-Type, X-Public-Key, X-Registration-Token, X-Request-ID";

/** A well-formed inbound `X-Request-ID`, otherwise a new one. */
export function requestIdOf(inbound: string | undefined): string {
  return inbound && REQUEST_ID.test(inbound) ? inbound : randomUUID();
}

/** The request being answered, as every layer under the exchange sees it. */
export class Exchange {
  readonly requestId: string;
  readonly incoming: IncomingMessage;
  readonly outgoing: ServerResponse;
  /** The bindings a handler reads the caller from (`Callers`). */
  readonly env: AppBindings;
  /** The request's path, without its query. */
  readonly path: string;
  /** When the request reached the exchange (`performance.now()`). */
  readonly started = performance.now();
  /** The pattern of the route serving it, once known: a native route's path. */
  route = "unmatched";
  /** Served by a native route: the shared headers go out with its head (`headers`), not set beforehand. */
  native = false;
  /** The caller a route's guard admitted (`Callers.guard`): a Public API route's principal. */
  principal: Principal | undefined;
  /** The caller the Compatible API's gate admitted. */
  caller: Caller | undefined;
  /** The request's server span, when the node traces (`tracing.otlp`): the parent of what serving it does. */
  traced: Traced | undefined;
  private readonly recorder: Recorder;
  private recorded = false;

  constructor(incoming: IncomingMessage, outgoing: ServerResponse, path: string, recorder: Recorder) {
    this.incoming = incoming;
    this.outgoing = outgoing;
    this.path = path;
    this.recorder = recorder;
    this.requestId = requestIdOf(nodeHeader(incoming, "x-request-id"));
    this.env = { incoming, outgoing, exchange: this };
  }

  /**
   * A new list of the answer's head to write (`outgoing.writeHead(status, list)`), holding the
   * headers every answer carries for a native route (set beforehand on the Hono routes'), for the
   * writer to add its own to: one list, no per-header bookkeeping.
   */
  headers(): string[] {
    return this.native ? ["X-Request-ID", this.requestId, "Access-Control-Allow-Origin", "*", "Access-Control-Expose-Headers", CORS_EXPOSE_HEADERS] : [];
  }

  /** The log line and metrics of this request, once: its status and its route's pattern (or `unmatched`). */
  record(status: number, route = this.route): void {
    if (this.recorded) return;
    this.recorded = true;
    this.recorder(this, status, route, performance.now() - this.started);
  }
}

type Recorder = (x: Exchange, status: number, route: string, ms: number) => void;

/**
 * A route served on Node's request and response, declared by its surface (`nativeRoute`,
 * native.ts): the only handler of its method and path. The exchange serves it as `mountSurfaces`
 * wrapped it: its checks, its answer, the surface's error mapping, one `record`.
 */
export interface ServedRoute {
  /** The path (`/me/status`), under its surface's base; no parameters. */
  path: string;
  /** Answers the request, its errors included, and records it once. */
  serve(x: Exchange): Promise<void>;
}

/** Native routes by `METHOD /full/path`. */
export type NativeRoutes = ReadonlyMap<string, ServedRoute>;

/**
 * The headers every answer but a preflight's carries, set on Node's response before the answer
 * exists (in this order), so that whatever the Hono adapter writes carries them; a native route's
 * answer has them in its head instead (`Exchange.headers`).
 */
function sharedHeaders(outgoing: ServerResponse, requestId: string): void {
  outgoing.setHeader("X-Request-ID", requestId);
  outgoing.setHeader("Access-Control-Allow-Origin", "*");
  outgoing.setHeader("Access-Control-Expose-Headers", CORS_EXPOSE_HEADERS);
}

export interface ExchangeOptions {
  logger: Logger;
  metrics: Metrics;
  callers: Callers;
  routes: NativeRoutes;
  /** Every other route: the Hono application through its Node adapter (`adapterListener`). */
  app: (incoming: IncomingMessage, outgoing: ServerResponse) => void;
  /** While it returns a promise, requests wait for it (a node joining the store). */
  wait?: () => Promise<void> | undefined;
  /** The node's tracing: every request a server span. */
  tracing?: Tracing | undefined;
}

/** The exchange of one set of surfaces, as a Node request listener. */
export function createExchange(o: ExchangeOptions): (incoming: IncomingMessage, outgoing: ServerResponse) => void {
  const recorder: Recorder = (x, status, route, ms) =>
    recordExchange(o.logger, o.metrics, {
      requestId: x.requestId,
      method: x.incoming.method ?? "GET",
      path: x.path,
      route,
      status,
      client: o.callers.resolveAddress(x.env),
      ms,
      traceId: x.traced && routedSpan(x.traced, x.incoming.method ?? "GET", route, status),
    });
  const tracing = o.tracing;
  return (incoming, outgoing) => {
    const path = targetPath(incoming);
    if (path === undefined) return refuse(o, incoming, outgoing, framingError(undefined));
    const x = new Exchange(incoming, outgoing, path, recorder);
    const method = incoming.method ?? "GET";
    if (tracing) x.traced = requestSpan(tracing, outgoing, method, path);
    if (method === "OPTIONS") {
      outgoing.setHeader("X-Request-ID", x.requestId);
      outgoing.setHeader("Access-Control-Allow-Origin", "*");
      outgoing.setHeader("Access-Control-Allow-Methods", CORS_ALLOW_METHODS);
      outgoing.setHeader("Access-Control-Allow-Headers", nodeHeader(incoming, "access-control-request-headers") || CORS_ALLOW_HEADERS);
      outgoing.setHeader("Access-Control-Max-Age", "600");
      outgoing.setHeader("Vary", "Access-Control-Request-Headers");
      outgoing.writeHead(204).end();
      x.record(204);
      return;
    }
    const route = o.routes.get(`${method === "HEAD" ? "GET" : method} ${path}`);
    if (route) {
      x.route = route.path;
      x.native = true;
    } else {
      sharedHeaders(outgoing, x.requestId);
      (incoming as ExchangeCarrier)[EXCHANGE] = x;
    }
    const go = route
      ? () =>
          void route.serve(x).catch((err: unknown) => {
            o.logger.error({ err, req_id: x.requestId, path }, "request failed");
            outgoing.destroy();
          })
      : () => o.app(incoming, outgoing);
    const waiting = o.wait?.();
    if (waiting) waiting.then(go, go);
    else go();
  };
}

const EXCHANGE = Symbol("exchange");
type ExchangeCarrier = IncomingMessage & { [EXCHANGE]?: Exchange };

/** The exchange of a request (the bindings a Hono route sees are the exchange's own, `honoFetch`). */
export function exchangeOf(env: AppBindings | undefined): Exchange | undefined {
  return env?.exchange ?? (env?.incoming as ExchangeCarrier | undefined)?.[EXCHANGE];
}

/**
 * The Hono application's `fetch` as the Node adapter calls it, with the exchange's bindings in
 * place of the adapter's: a Hono route and a native one read the same bindings (the caller a guard
 * admitted, a chunked body the body limit read).
 */
export function honoFetch(fetch: (request: Request, env: AppBindings) => Response | Promise<Response>) {
  return (request: Request, env: { incoming: unknown; outgoing: unknown }) => fetch(request, exchangeOf(env as AppBindings)?.env ?? (env as AppBindings));
}

/**
 * The path of a request's target, or undefined when the target or its `Host` is one the answer
 * cannot be built for: the same checks as the Hono adapter's, done here once for every route. A
 * `Host` is never remembered: a missing one is refused on every request, a new one served as any other.
 */
export function targetPath(incoming: IncomingMessage): string | undefined {
  const target = incoming.url ?? "";
  if (!validTarget(target)) return undefined;
  // RFC 9112 §3.2: more than one Host is a 400 (Node keeps the first and drops the others silently).
  if (hostLines(incoming.rawHeaders) > 1) return undefined;
  if (target.startsWith("/")) {
    const host = incoming.headers.host;
    if (!host) return undefined;
    if (PLAIN_HOST.test(host) && PLAIN_PATH.test(target) && !target.includes("/.")) {
      const query = target.indexOf("?");
      return query === -1 ? target : target.slice(0, query);
    }
    try {
      const url = new URL(`http://${host}${target}`);
      if (url.hostname.length !== host.length && url.hostname !== host.replace(/:\d+$/, "")) return undefined;
      return decodedPath(url.pathname);
    } catch {
      return undefined;
    }
  }
  // The absolute form (`GET http://host/path`): its own authority, as the adapter reads it.
  if (!(target.startsWith("http://") || target.startsWith("https://"))) return undefined;
  try {
    return decodedPath(new URL(target).pathname);
  } catch {
    return undefined;
  }
}

/** How many `Host` header lines a request has. */
function hostLines(raw: readonly string[]): number {
  let n = 0;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    if (name.length === 4 && name.toLowerCase() === "host") n++;
  }
  return n;
}

/** A host name (or IPv4 address) and port as a URL keeps them, lower case: no parsing needed. */
const PLAIN_HOST = /^[a-z0-9-]+(\.[a-z0-9-]+)*(:[0-9]{1,5})?$/;
/** A target whose path has nothing a URL would rewrite or Hono would decode (`%`, backslashes, spaces); dot segments are checked apart. */
const PLAIN_PATH = /^\/[A-Za-z0-9\-._~!$&'()*+,;=:@/]*(\?.*)?$/;

/** The backslash check of the Hono adapter: none in the path. */
function validTarget(target: string): boolean {
  const backslash = target.indexOf("\\");
  if (backslash === -1) return true;
  const query = target.indexOf("?");
  return query !== -1 && backslash > query;
}

/** A path as Hono routes it: percent-escapes decoded where they decode (`%25` kept). */
function decodedPath(path: string): string {
  if (!path.includes("%")) return path;
  try {
    return decodeURI(path.replace(/%25/g, "%2525"));
  } catch {
    return path;
  }
}

/** Answers a request the exchange cannot serve (a bad target or `Host`) with a framing error, which closes the connection. */
function refuse(o: Pick<ExchangeOptions, "logger" | "metrics">, incoming: IncomingMessage, outgoing: ServerResponse, f: FramingError): void {
  const requestId = randomUUID();
  const body = framingErrorBody(f);
  outgoing.writeHead(f.status, framingErrorHeaders(body, requestId)).end(body);
  recordRefusal(o.logger, o.metrics, f, requestId, incoming.socket);
}

/** The log line and metric of a request refused before routing (framing errors, a bad `Host`). */
export function recordRefusal(logger: Logger, metrics: Metrics, f: FramingError, requestId: string, socket: unknown, counted = true): void {
  if (counted) metrics.observe("", "unmatched", f.status, 0);
  const client = (socket as Partial<Socket> | null)?.remoteAddress;
  logger.info({ req_id: requestId, status: f.status, code: f.code, client }, "request refused before routing");
}

export interface ExchangeRecord {
  requestId: string;
  method: string;
  path: string;
  /** The route's pattern (`/me/status`), or `unmatched`. */
  route: string;
  status: number;
  client: string;
  /** Since the request reached the exchange. */
  ms: number;
  /** The trace of the request, when the node traces. */
  traceId?: string | undefined;
}

/**
 * The request's log line and metrics. Only method, path, route, status, client address and timing
 * are logged: never headers, query strings or bodies, which can hold credentials.
 */
function recordExchange(logger: Logger, metrics: Metrics, e: ExchangeRecord): void {
  metrics.observe(e.method, e.route, e.status, e.ms / 1000);
  if (logger.isLevelEnabled("info")) {
    logger.info(
      {
        req_id: e.requestId,
        method: e.method,
        path: e.path,
        route: e.route,
        status: e.status,
        client: e.client,
        ms: Math.round(e.ms * 100) / 100,
        ...(e.traceId ? { trace_id: e.traceId } : {}),
      },
      "request",
    );
  }
}

/** Logs a request that failed with `status`: an unreachable store without the stack (during an outage every request says the same), a server error with it. */
export function logFailure(logger: Logger, err: unknown, status: number, requestId: string, path: string): void {
  if (err instanceof StoreUnavailable) logger.warn({ err: err.message, req_id: requestId, path }, "store unavailable");
  else if (status >= 500) logger.error({ err, req_id: requestId, path }, "request failed");
}
