import type { OpenAPIHono } from "@hono/zod-openapi";
import type { Context, Hono } from "hono";
import { matchedRoutes } from "hono/route";
import type { Logger } from "pino";
import type { AppEnv } from "./env.ts";
import { type Exchange, logFailure, type ServedRoute } from "./exchange.ts";
import { writeJson } from "./json.ts";
import { CLIENT_CLOSED_REQUEST, clientClosedRequest, clientLeft, handlerPath } from "./middleware.ts";
import { asMiddleware, type Guard, type NativeRoute } from "./native.ts";

/**
 * One API surface: its routes with their own body limits and validation hook, and its own error
 * envelope, mounted under `base`. The root app keeps only what every surface shares and hands each
 * request it cannot route, and each error, to the surface that owns it.
 */
export interface Surface {
  /** Where its routes live: `/` (Public API, operations) or, e.g., `/openai/v1`. */
  readonly base: string;
  readonly app: Hono<AppEnv>;
  /** Its one error mapping: anything thrown while it served a request, native or Hono, as its envelope (unexpected errors as 500). */
  failure(err: unknown): Failure;
  /** No route for the request: 404, or 405 when `allow` (the methods this path has) is not empty. */
  unrouted(c: Context<AppEnv>, allow: string[]): Response;
  /** What every route of it checks first, native or Hono, whether or not the route says so (`mountSurfaces`). */
  readonly gate?: Gate;
  /** Its routes served on Node's request and response (native.ts), each the only handler of its method and path. */
  readonly native?: readonly NativeRoute[];
}

/** An error answer in a surface's envelope. */
export interface Failure {
  status: number;
  body: unknown;
  /** Seconds, for 429 and 503. */
  retryAfter?: number | undefined;
  contentType: string;
}

/**
 * A surface's checks before every one of its routes (the Compatible API's: body limit and caller):
 * run on every request a route of the surface matched, native or Hono, before the route's own.
 */
export interface Gate {
  admit: Guard;
  /** After a native route's answer started (its head written), or its error answer was written. */
  answered?(x: Exchange): void;
}

/** One route of a mounted surface, for the route table (`HttpApp.table`). */
export interface RouteEntry {
  method: string;
  /** The full pattern (`/openai/v1/chat/completions`, `/contacts/:name`). */
  path: string;
  /** The base of the surface serving it. */
  base: string;
  native: boolean;
}

interface MountedRoute {
  surface: Surface;
  method: string;
  pattern: RegExp;
}

/**
 * Mounts `surfaces` on `root` (in this order) and routes what they do not answer: a path that some
 * surface's route (native ones included) matches with another method gets that surface's 405; any
 * other path gets the 404 of the surface mounted at the longest base path that contains it (the
 * first one mounted, when several share a base). An error goes to the surface whose route raised
 * it. A surface's gate runs before each of its routes. Returns the surfaces' native routes by
 * `METHOD /full/path`, for the exchange, each wrapped as `serveNative`, and the route table.
 */
export function mountSurfaces(root: OpenAPIHono<AppEnv>, surfaces: Surface[], logger: Logger): { native: Map<string, ServedRoute>; table: RouteEntry[] } {
  const routes: MountedRoute[] = [];
  const table: RouteEntry[] = [];
  const native = new Map<string, ServedRoute>();
  const ownerOfRoute = new Map<string, Surface>();
  for (const surface of surfaces) {
    for (const r of surface.native ?? []) {
      const path = `${normalBase(surface.base)}${r.path}`;
      const key = `${r.method} ${path}`;
      if (native.has(key)) throw new Error(`two native routes for ${key}`);
      native.set(key, { path, serve: (x) => serveNative(x, r, surface, logger) });
      routes.push({ surface, method: r.method, pattern: pathPattern(path) });
      table.push({ method: r.method, path, base: surface.base, native: true });
      if (r.doc) (surface.app as OpenAPIHono<AppEnv>).openAPIRegistry?.registerPath(r.doc);
    }
    // Before the surface's routes: the root runs middleware in the order it was added.
    if (surface.gate) root.use(normalBase(surface.base) === "" ? "*" : `${normalBase(surface.base)}/*`, gated(surface.gate));
    const before = root.routes.length;
    root.route(surface.base, surface.app);
    for (const r of root.routes.slice(before)) {
      if (!ownerOfRoute.has(r.path)) ownerOfRoute.set(r.path, surface);
      if (r.method !== "ALL") {
        routes.push({ surface, method: r.method, pattern: pathPattern(r.path) });
        table.push({ method: r.method, path: r.path, base: surface.base, native: false });
      }
    }
  }
  const byBase = [...surfaces].sort((a, b) => normalBase(b.base).length - normalBase(a.base).length);
  const ownerOfPath = (path: string): Surface | undefined => byBase.find((s) => contains(s.base, path));

  root.notFound((c) => {
    const matching = routes.filter((r) => r.pattern.test(c.req.path));
    const surface = matching[0]?.surface ?? ownerOfPath(c.req.path) ?? surfaces[0];
    if (!surface) return c.body(null, 404);
    return surface.unrouted(c, [...new Set(matching.filter((r) => r.surface === surface).map((r) => r.method))].sort());
  });
  root.onError((err, c) => {
    const route = handlerPath(c);
    const surface = (route && ownerOfRoute.get(route)) ?? ownerOfPath(c.req.path) ?? surfaces[0];
    if (!surface) throw err;
    // A body that stopped arriving because its client left: not a server error, and nobody reads the answer.
    if (clientClosedRequest(c)) return new Response(null, { status: CLIENT_CLOSED_REQUEST });
    const f = surface.failure(err);
    logFailure(logger, err, f.status, c.get("requestId"), c.req.path);
    if (f.retryAfter !== undefined) c.header("Retry-After", String(f.retryAfter));
    c.header("Content-Type", f.contentType);
    return c.body(JSON.stringify(f.body), f.status as 400);
  });
  return { native, table };
}

/**
 * A surface's gate as the root's middleware over its base: run only when one of its routes matched
 * the request (a request no route answers gets its 404 or 405, unchecked).
 */
function gated(gate: Gate) {
  const middleware = asMiddleware(gate.admit);
  return async (c: Context<AppEnv>, next: () => Promise<void>) => {
    if (!matchedRoutes(c).some((r) => r.method !== "ALL")) return next();
    return middleware(c, next);
  };
}

/**
 * A native route as the exchange serves it: its surface's gate and its own guards, its answer, or
 * else its surface's error answer; then the one log line and metrics (`record`), with the status
 * the answer's head carried (a stream's as it starts), or 499 when the client left first.
 */
async function serveNative(x: Exchange, route: NativeRoute, surface: Surface, logger: Logger): Promise<void> {
  try {
    // A check that answers at once (a declared body length) is not awaited: no turn of the loop for it.
    const admitted = surface.gate?.admit(x);
    if (admitted) await admitted;
    for (const guard of route.guards) {
      const checked = guard(x);
      if (checked) await checked;
    }
    await route.serve(x);
    surface.gate?.answered?.(x);
    x.record(x.outgoing.statusCode);
  } catch (err) {
    if (clientLeft(x.outgoing) || (!x.incoming.complete && x.incoming.destroyed)) return x.record(CLIENT_CLOSED_REQUEST);
    const f = surface.failure(err);
    logFailure(logger, err, f.status, x.requestId, x.path);
    if (x.outgoing.headersSent) {
      // Its answer had started: nothing else can be said on it.
      x.outgoing.destroy();
      return x.record(f.status);
    }
    writeJson(x, f.status, JSON.stringify(f.body), { contentType: f.contentType, retryAfter: f.retryAfter });
    surface.gate?.answered?.(x);
    x.record(f.status);
  }
}

function normalBase(base: string): string {
  return base.replace(/\/+$/, "");
}

/** Whether `path` lies under `base` (whole segments: `/openai/v1x` is not under `/openai/v1`). */
function contains(base: string, path: string): boolean {
  const b = normalBase(base);
  return b === "" || path === b || path.startsWith(`${b}/`);
}

/** A route pattern (`/contacts/:name`) as an anchored expression; everything but parameters matches literally. */
export function pathPattern(path: string): RegExp {
  const source = path
    .split("/")
    .map((segment) => (segment.startsWith(":") ? "[^/]+" : segment === "*" ? ".*" : segment.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")))
    .join("/");
  return new RegExp(`^${source}$`);
}
