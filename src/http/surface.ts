import type { OpenAPIHono } from "@hono/zod-openapi";
import type { Context, Hono } from "hono";
import { routePath } from "hono/route";
import type { AppEnv } from "./env.ts";
import type { NativeRoute } from "./exchange.ts";

/**
 * One API surface: its routes with their own body limits and validation hook, and its own error
 * envelope, mounted under `base`. The root app keeps only what every surface shares and hands each
 * request it cannot route, and each error, to the surface that owns it.
 */
export interface Surface {
  /** Where its routes live: `/` (Public API, operations) or, e.g., `/openai/v1`. */
  readonly base: string;
  readonly app: Hono<AppEnv>;
  /** Answers anything thrown while it handled a request, in its own envelope (unexpected errors as 500). */
  error(c: Context<AppEnv>, err: unknown): Response;
  /** No route for the request: 404, or 405 when `allow` (the methods this path has) is not empty. */
  unrouted(c: Context<AppEnv>, allow: string[]): Response;
  /** Its routes served on Node's request and response (exchange.ts), each the only handler of its method and path. */
  readonly native?: readonly NativeRoute[];
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
 * it. Returns the surfaces' native routes by `METHOD /full/path`, for the exchange.
 */
export function mountSurfaces(
  root: OpenAPIHono<AppEnv>,
  surfaces: Surface[],
  onError: (c: Context<AppEnv>, err: unknown, surface: Surface) => Response,
): Map<string, NativeRoute> {
  const routes: MountedRoute[] = [];
  const native = new Map<string, NativeRoute>();
  const ownerOfRoute = new Map<string, Surface>();
  for (const surface of surfaces) {
    for (const r of surface.native ?? []) {
      const path = `${normalBase(surface.base)}${r.path}`;
      const key = `${r.method} ${path}`;
      if (native.has(key)) throw new Error(`two native routes for ${key}`);
      native.set(key, { ...r, path });
      routes.push({ surface, method: r.method, pattern: pathPattern(path) });
    }
    const before = root.routes.length;
    root.route(surface.base, surface.app);
    for (const r of root.routes.slice(before)) {
      if (!ownerOfRoute.has(r.path)) ownerOfRoute.set(r.path, surface);
      if (r.method !== "ALL") routes.push({ surface, method: r.method, pattern: pathPattern(r.path) });
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
    const surface = ownerOfRoute.get(routePath(c)) ?? ownerOfPath(c.req.path) ?? surfaces[0];
    if (!surface) throw err;
    return onError(c, err, surface);
  });
  return native;
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
