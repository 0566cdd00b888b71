import { OpenAPIHono, type z } from "@hono/zod-openapi";
import type { Logger } from "pino";
import type { Domain } from "../../domain/index.ts";
import type { ServerInfo } from "../../protocol/public.ts";
import type { AppEnv } from "../env.ts";
import { apiFailure, invalid, unroutedResponse } from "../errors.ts";
import type { Callers } from "../principal.ts";
import type { Surface } from "../surface.ts";
import { registerMeRoutes } from "./me.ts";
import { registerServerRoutes } from "./server.ts";
import { registerSideControlRoutes } from "./side-control.ts";
import { registerWebRtcRoutes, type WebRtcPort } from "./webrtc.ts";

export interface PublicSurfaceOptions {
  domain: Domain;
  callers: Callers;
  logger: Logger;
  /** `GET /server-info` for a request that arrived with this `Host` header. */
  serverInfo: (host: string | undefined) => z.infer<typeof ServerInfo>;
  /** The WebRTC transport of this node, when it answers offers. */
  webrtc?: WebRtcPort | undefined;
}

/** The Public API at `/`: 64 KiB JSON bodies, `ErrorResponse` for every error. */
export function publicSurface(o: PublicSurfaceOptions): Surface {
  const app = new OpenAPIHono<AppEnv>({ defaultHook: invalid("INVALID_REQUEST") });
  registerServerRoutes(app, o.domain, o.callers, o.serverInfo);
  const native = registerMeRoutes(app, o.domain, o.callers);
  registerSideControlRoutes(app, o.domain, o.callers);
  if (o.webrtc) registerWebRtcRoutes(app, o.domain, o.callers, o.webrtc);
  app.openAPIRegistry.registerComponent("securitySchemes", "bearerAuth", {
    type: "http",
    scheme: "bearer",
    description: "access_token from POST /login",
  });
  return {
    base: "/",
    app,
    failure: apiFailure,
    unrouted: unroutedResponse,
    native,
  };
}
