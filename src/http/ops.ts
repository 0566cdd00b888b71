import { createRoute, z } from "@hono/zod-openapi";
import type { Domain } from "../domain/index.ts";
import type { App } from "./env.ts";
import type { Metrics } from "./metrics.ts";
import { errors } from "./public/responses.ts";

const Health = z.object({ status: z.literal("ok") }).openapi("Health");

/** Operational routes: health and Prometheus metrics. */
export function registerOpsRoutes(app: App, domain: Domain, metrics: Metrics): void {
  app.openapi(
    createRoute({
      method: "get",
      path: "/healthz",
      tags: ["ops"],
      summary: "Liveness: the process answers and its store responds",
      responses: { 200: { description: "Healthy", content: { "application/json": { schema: Health } } }, ...errors(500) },
    }),
    async (c) => {
      await domain.ping();
      return c.json({ status: "ok" as const }, 200);
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
    async (c) => c.text(await metrics.registry.metrics(), 200, { "Content-Type": metrics.registry.contentType }),
  );
}
