import { OpenAPIHono } from "@hono/zod-openapi";
import type { Logger } from "pino";
import type { Domain } from "../domain/index.ts";
import type { ServerInfo } from "../protocol/public.ts";
import type { AppEnv } from "./env.ts";
import { ApiError, errorResponse, toApiError } from "./errors.ts";
import type { Metrics } from "./metrics.ts";
import { bodyLimit, cors, observe, requestId } from "./middleware.ts";
import { registerOpsRoutes } from "./ops.ts";
import { registerMeRoutes } from "./public/me.ts";
import { registerServerRoutes } from "./public/server.ts";
import { registerSideControlRoutes } from "./public/side-control.ts";
import { OFFER_PATH, registerWebRtcRoutes, type WebRtcPort } from "./public/webrtc.ts";

export const JSON_BODY_LIMIT = 64 * 1024;

export interface AppOptions {
  domain: Domain;
  logger: Logger;
  metrics: Metrics;
  /** `GET /server-info` for a request that arrived with this `Host` header. */
  serverInfo: (host: string | undefined) => ServerInfo;
  version: string;
  /** The WebRTC transport of this node, when it answers offers. */
  webrtc?: WebRtcPort | undefined;
}

/**
 * The HTTP application: the Public API plus operational routes. It is transport-agnostic (web
 * Request → Response), so the same app serves the TCP listener and, later, DataChannel streams.
 */
export function createApp(o: AppOptions): OpenAPIHono<AppEnv> {
  const app = new OpenAPIHono<AppEnv>();

  app.use(requestId());
  app.use(observe(o.logger, o.metrics));
  app.use(cors);
  const jsonLimit = bodyLimit(JSON_BODY_LIMIT, (c) =>
    errorResponse(c, new ApiError(413, "PAYLOAD_TOO_LARGE", `request body is over ${JSON_BODY_LIMIT} bytes`)),
  );
  // The offer route has its own limit, checked after its headers (the contract's order).
  app.use((c, next) => (c.req.path === OFFER_PATH ? next() : jsonLimit(c, next)));

  registerServerRoutes(app, o.domain, o.serverInfo, o.domain.ctx.config.trustProxy);
  registerMeRoutes(app, o.domain);
  registerSideControlRoutes(app, o.domain);
  registerOpsRoutes(app, o.domain, o.metrics);
  if (o.webrtc) registerWebRtcRoutes(app, o.domain, o.webrtc);

  app.openAPIRegistry.registerComponent("securitySchemes", "bearerAuth", {
    type: "http",
    scheme: "bearer",
    description: "access_token from POST /login",
  });
  app.doc31("/openapi.json", {
    openapi: "3.1.0",
    info: { title: "Perch Public API", version: o.version, description: "Device login, status, runtime and Side Control." },
  });

  const allowed = methodsByPath(app);
  app.notFound((c) => {
    const methods = allowed(c.req.path);
    if (methods.length > 0) {
      c.header("Allow", methods.join(", "));
      return errorResponse(c, new ApiError(405, "METHOD_NOT_ALLOWED", `${c.req.method} is not allowed here; use ${methods.join(", ")}`));
    }
    return errorResponse(c, new ApiError(404, "NOT_FOUND", `no route for ${c.req.method} ${c.req.path}`));
  });
  app.onError((err, c) => {
    const apiError = toApiError(err);
    if (apiError.status >= 500) o.logger.error({ err, req_id: c.get("requestId"), path: c.req.path }, "request failed");
    return errorResponse(c, apiError);
  });
  return app;
}

/** For 405s: which methods the app's routes offer on a path. */
function methodsByPath(app: OpenAPIHono<AppEnv>): (path: string) => string[] {
  const routes = app.routes
    .filter((r) => r.method !== "ALL")
    .map((r) => ({ method: r.method, pattern: new RegExp(`^${r.path.replace(/:[^/]+/g, "[^/]+")}$`) }));
  return (path) => [...new Set(routes.filter((r) => r.pattern.test(path)).map((r) => r.method))];
}
