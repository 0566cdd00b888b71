import { OpenAPIHono } from "@hono/zod-openapi";
import type { Logger } from "pino";
import type { Domain } from "../domain/index.ts";
import type { ServerInfo } from "../protocol/public.ts";
import type { AppEnv } from "./env.ts";
import { logFailure } from "./exchange.ts";
import type { Metrics } from "./metrics.ts";
import { CLIENT_CLOSED_REQUEST, clientClosedRequest, shared } from "./middleware.ts";
import { opsSurface } from "./ops.ts";
import { Callers } from "./principal.ts";
import { publicSurface } from "./public/surface.ts";
import type { WebRtcPort } from "./public/webrtc.ts";
import { mountSurfaces, type Surface } from "./surface.ts";
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
}

/**
 * The HTTP application: one root for every surface. The root keeps only what they share (request
 * id, logs and metrics, CORS) and hands unrouted requests and errors to the surface that owns them.
 * It is transport-agnostic (web Request → Response), so the same app serves the TCP listener and
 * DataChannel streams (see `connection.ts`).
 */
export function createApp(o: AppOptions): OpenAPIHono<AppEnv> {
  const callers = new Callers(o.domain, o.domain.ctx.config.trust_proxy);
  const root = rootApp(o, callers);

  let document: unknown;
  const openApiDocument = () =>
    (document ??= root.getOpenAPI31Document({
      openapi: "3.1.0",
      info: { title: "Perch Public API", version: o.version, description: "Device login, status, runtime and Side Control." },
    }));
  const surfaces = [
    ...(o.surfaces?.(callers) ?? []),
    publicSurface({ domain: o.domain, callers, serverInfo: o.serverInfo, webrtc: o.webrtc }),
    opsSurface({ domain: o.domain, metrics: o.metrics, document: openApiDocument }),
    webAppSurface({ tileUrl: o.domain.ctx.config.app.tile_url }),
  ];
  mountAll(o, root, surfaces);
  return root;
}

/**
 * An application of only `surfaces` under the same shared root (request id, logs and metrics,
 * CORS): what a transport serves on a stream of its own (the Compatible API at `/v1` on stream 2).
 */
export function createSurfacesApp(o: Pick<AppOptions, "domain" | "logger" | "metrics">, surfaces: (callers: Callers) => Surface[]): OpenAPIHono<AppEnv> {
  const callers = new Callers(o.domain, o.domain.ctx.config.trust_proxy);
  const root = rootApp(o, callers);
  mountAll(o, root, surfaces(callers));
  return root;
}

function rootApp(o: Pick<AppOptions, "logger" | "metrics">, callers: Callers): OpenAPIHono<AppEnv> {
  const root = new OpenAPIHono<AppEnv>();
  root.use(shared(o.logger, o.metrics, callers));
  return root;
}

function mountAll(o: Pick<AppOptions, "logger">, root: OpenAPIHono<AppEnv>, surfaces: Surface[]): void {
  mountSurfaces(root, surfaces, (c, err, surface) => {
    // A body that stopped arriving because its client left: not a server error, and nobody reads the answer.
    if (clientClosedRequest(c)) return new Response(null, { status: CLIENT_CLOSED_REQUEST });
    const res = surface.error(c, err);
    logFailure(o.logger, err, res.status, c.get("requestId"), c.req.path);
    return res;
  });
}
