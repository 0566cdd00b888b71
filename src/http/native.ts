import type { RouteConfig } from "@hono/zod-openapi";
import type { MiddlewareHandler } from "hono";
import { bodyWithinLimit } from "./body.ts";
import type { AppEnv } from "./env.ts";
import type { Exchange } from "./exchange.ts";

/**
 * A check a route makes before it answers (a body limit, the caller), written once on the exchange
 * and run by both kinds of route: a native route's guards by `mountSurfaces`, a Hono route's as its
 * middleware (`asMiddleware`). It refuses by throwing, which the surface's error mapping answers.
 */
export type Guard = (x: Exchange) => void | Promise<void>;

const GUARD = Symbol("guard");
type GuardMiddleware = MiddlewareHandler<AppEnv> & { [GUARD]?: Guard };

/**
 * `guard` as Hono middleware: the route's context gets what it admitted (`principal`), and a
 * chunked body it read whole is put back on the web request for the route's validator. A native
 * route declared with this middleware in its route object runs the guard itself (`nativeRoute`).
 */
export function asMiddleware(guard: Guard): MiddlewareHandler<AppEnv> {
  const middleware: GuardMiddleware = async (c, next) => {
    const x = c.env.exchange;
    if (!x) throw new Error("the application is served through the exchange (src/http/exchange.ts)");
    const hadBody = x.env.body;
    const done = guard(x);
    if (done) await done;
    if (x.principal) c.set("principal", x.principal);
    if (x.env.body && x.env.body !== hadBody) c.req.raw = new Request(c.req.raw, { body: x.env.body as Uint8Array<ArrayBuffer> });
    await next();
  };
  middleware[GUARD] = guard;
  return middleware;
}

/** A route served on Node's request and response: the only handler of its method and path (see `Surface.native`). */
export interface NativeRoute {
  method: "GET" | "POST" | "PUT" | "DELETE";
  /** The path (`/me/status`), under its surface's base; no parameters. */
  path: string;
  /** Its OpenAPI entry (the route object it was declared from, without its middleware): a Public API route is documented with it. */
  doc?: Omit<RouteConfig, "middleware">;
  /** What it checks first, in order (a route object's middleware, as guards). */
  guards: readonly Guard[];
  /**
   * Answers the request once its guards (and its surface's gate) admitted it: resolves once the
   * answer's head is written (a stream goes on by itself, `writeStream`), throws anything the
   * surface's error mapping should answer. It records nothing: the exchange does, once.
   */
  serve(x: Exchange): Promise<void>;
}

/**
 * A native route declared from its route object (`createRoute`): its method, path and checks are
 * the object's (every middleware of it made by `asMiddleware`), and the object, less its
 * middleware, is its OpenAPI entry. The same object a Hono route would be registered with.
 */
export function nativeRoute(route: RouteConfig, serve: (x: Exchange) => Promise<void>): NativeRoute {
  if (route.path.includes("{")) throw new Error(`a native route has no path parameters: ${route.path}`);
  const { middleware, ...doc } = route;
  const guards = (middleware === undefined ? [] : Array.isArray(middleware) ? middleware : [middleware]).map((m) => {
    const guard = (m as GuardMiddleware)[GUARD];
    if (!guard) throw new Error(`${route.method.toUpperCase()} ${route.path}: a native route's middleware must be guards (asMiddleware)`);
    return guard;
  });
  return { method: route.method.toUpperCase() as NativeRoute["method"], path: route.path, doc, guards, serve };
}

/** A guard refusing a body over `maxSize` bytes with `tooLarge` (`bodyWithinLimit`: a chunked body is read whole, up to `drainLimit`, and kept). */
export function bodyLimitGuard(maxSize: number, tooLarge: () => Error, drainLimit = 16 * maxSize): Guard {
  return (x) => {
    const within = bodyWithinLimit(x.env, maxSize, drainLimit);
    if (within === true) return;
    if (within === false) throw tooLarge();
    return within.then((ok) => {
      if (!ok) throw tooLarge();
    });
  };
}
