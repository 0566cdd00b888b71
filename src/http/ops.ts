import { createRoute, OpenAPIHono, z } from "@hono/zod-openapi";
import type { Domain } from "../domain/index.ts";
import { ErrorResponse } from "../protocol/public.ts";
import type { AppEnv } from "./env.ts";
import { apiFailure, invalid, unroutedResponse } from "./errors.ts";
import { JSON_UTF8 } from "./json.ts";
import type { Metrics } from "./metrics.ts";
import type { Surface } from "./surface.ts";

/** How long `/readyz` waits for the store's answer before saying 503. */
const READY_TIMEOUT_MS = 2_000;

const Health = z.object({ status: z.literal("ok") }).openapi("Health");
/** A node refusing new work (fleet.md §2, §3): its balancer's health check sends new devices elsewhere. */
const NotReady = z.object({ status: z.enum(["full", "draining"]) }).openapi("NotReady");

export interface OpsSurfaceOptions {
  domain: Domain;
  metrics: Metrics;
  /** The OpenAPI document served at `/openapi.json`. */
  document: () => unknown;
  /** The node's state in its fleet: `full` or `draining` answer 503 `{"status": …}`. */
  fleetState?: () => "serving" | "full" | "draining";
}

/** Operations: liveness, readiness, Prometheus metrics and the OpenAPI document; no bodies, `ErrorResponse` errors. */
export function opsSurface(o: OpsSurfaceOptions): Surface {
  const app = new OpenAPIHono<AppEnv>({ defaultHook: invalid("INVALID_REQUEST") });
  app.openapi(
    createRoute({
      method: "get",
      path: "/healthz",
      tags: ["ops"],
      summary: "Liveness: the process answers (200 also while its store is unreachable; see /readyz)",
      responses: { 200: { description: "Alive", content: { "application/json": { schema: Health } } } },
    }),
    (c) => c.json({ status: "ok" as const }, 200, JSON_UTF8),
  );

  app.openapi(
    createRoute({
      method: "get",
      path: "/readyz",
      tags: ["ops"],
      summary:
        'Readiness: this node takes new work (its store answers); 503 {"status":"full"} or {"status":"draining"} while it refuses new devices (fleet.md), 503 UNAVAILABLE with Retry-After while the store is unreachable',
      responses: {
        200: { description: "Ready", content: { "application/json": { schema: Health } } },
        503: {
          description: "Full or draining, or the store unreachable (`ErrorResponse` `UNAVAILABLE`)",
          content: { "application/json": { schema: z.union([NotReady, ErrorResponse]) } },
        },
      },
    }),
    async (c) => {
      const state = o.fleetState?.();
      if (state === "full" || state === "draining") return c.json({ status: state }, 503, { ...JSON_UTF8, "Retry-After": state === "full" ? "2" : "1" });
      await o.domain.ready(READY_TIMEOUT_MS);
      return c.json({ status: "ok" as const }, 200, JSON_UTF8);
    },
  );

  app.openapi(
    createRoute({
      method: "get",
      path: "/metrics",
      tags: ["ops"],
      summary: "Prometheus metrics: requests and latency by route and status, active sessions",
      responses: { 200: { description: "Prometheus text format", content: { "text/plain": { schema: z.string() } } } },
    }),
    async (c) => c.text(await o.metrics.registry.metrics(), 200, { "Content-Type": o.metrics.registry.contentType }),
  );

  // Not in the document itself, as before: it describes the API, not its own description.
  app.get("/openapi.json", (c) => c.json(o.document(), 200, JSON_UTF8));

  return { base: "/", app, failure: apiFailure, unrouted: unroutedResponse };
}
