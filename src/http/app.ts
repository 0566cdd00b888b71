import { OpenAPIHono } from "@hono/zod-openapi";
import type { Logger } from "pino";
import type { Domain } from "../domain/index.ts";
import type { Tracing } from "../observability/tracing.ts";
import type { ServerInfo } from "../protocol/public.ts";
import type { AppEnv } from "./env.ts";
import { createExchange, honoFetch, type NativeRoutes } from "./exchange.ts";
import { adapterListener, type RequestListener } from "./listener.ts";
import type { Metrics } from "./metrics.ts";
import { reported } from "./middleware.ts";
import { opsSurface } from "./ops.ts";
import { Callers } from "./principal.ts";
import { publicSurface } from "./public/surface.ts";
import type { WebRtcPort } from "./public/webrtc.ts";
import { mountSurfaces, type RouteEntry, type Surface } from "./surface.ts";
import { webAppSurface } from "./webapp.ts";

export { JSON_BODY_LIMIT } from "./public/limits.ts";

export interface AppOptions {
  domain: Domain;
  logger: Logger;
  metrics: Metrics;
  /** `GET /server-info` for a request that arrived with this `Host` header. */
  serverInfo: (host: string | undefined) => ServerInfo;
  version: string;
  /** Further surfaces, each at its own base path (the Compatible API at `/openai/v1`). */
  surfaces?: (callers: Callers) => Surface[];
  /** The WebRTC transport of this node, when it answers offers. */
  webrtc?: WebRtcPort | undefined;
  /** The node's state in its fleet, for `/readyz` (fleet.md §2, §3); default always serving. */
  fleetState?: () => "serving" | "full" | "draining";
  /** The node's tracing (every request a server span), when on. */
  tracing?: Tracing | undefined;
}

/** The routes of a set of surfaces: the Hono application, and the surfaces' native routes (exchange.ts). */
export interface HttpApp {
  hono: OpenAPIHono<AppEnv>;
  routes: NativeRoutes;
  /** Every route of its surfaces, native and Hono. */
  table: readonly RouteEntry[];
  callers: Callers;
  logger: Logger;
  metrics: Metrics;
  tracing?: Tracing | undefined;
}

/**
 * The HTTP application: one root for every surface, which hands unrouted requests and errors to
 * the surface that owns them. What every request shares (request id, CORS, logs and metrics) is the
 * exchange's (`listenerOf`), which serves this same application on the TCP listener, DataChannel
 * streams (see `connection.ts`) and in process.
 */
export function createApp(o: AppOptions): HttpApp {
  const callers = new Callers(o.domain, o.domain.ctx.config.trust_proxy);
  const root = rootApp();

  let document: unknown;
  const openApiDocument = () =>
    (document ??= root.getOpenAPI31Document({
      openapi: "3.1.0",
      info: { title: "Perch Public API", version: o.version, description: "Device login, status, runtime and Side Control." },
    }));
  const surfaces = [
    ...(o.surfaces?.(callers) ?? []),
    publicSurface({ domain: o.domain, callers, logger: o.logger, serverInfo: o.serverInfo, webrtc: o.webrtc }),
    opsSurface({ domain: o.domain, metrics: o.metrics, document: openApiDocument, ...(o.fleetState ? { fleetState: o.fleetState } : {}) }),
    webAppSurface({ tileUrl: o.domain.ctx.config.app.tile_url }),
  ];
  const { native, table } = mountSurfaces(root, surfaces, o.logger);
  return { hono: root, routes: native, table, callers, logger: o.logger, metrics: o.metrics, tracing: o.tracing };
}

/**
 * An application of only `surfaces`, served by an exchange of its own: what a transport serves on a
 * stream of its own (the Compatible API at `/v1` on stream 2).
 */
export function createSurfacesApp(o: Pick<AppOptions, "domain" | "logger" | "metrics" | "tracing">, surfaces: (callers: Callers) => Surface[]): HttpApp {
  const callers = new Callers(o.domain, o.domain.ctx.config.trust_proxy);
  const root = rootApp();
  const { native, table } = mountSurfaces(root, surfaces(callers), o.logger);
  return { hono: root, routes: native, table, callers, logger: o.logger, metrics: o.metrics, tracing: o.tracing };
}

/** The exchange serving `app`, as a Node request listener; `wait` holds requests while it returns a promise. */
export function listenerOf(app: HttpApp, wait?: () => Promise<void> | undefined): RequestListener {
  return createExchange({
    logger: app.logger,
    metrics: app.metrics,
    callers: app.callers,
    routes: app.routes,
    app: adapterListener(honoFetch(app.hono.fetch)),
    ...(wait ? { wait } : {}),
    tracing: app.tracing,
  });
}

function rootApp(): OpenAPIHono<AppEnv> {
  const root = new OpenAPIHono<AppEnv>();
  root.use(reported);
  return root;
}
