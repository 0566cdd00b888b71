import type { Hono } from "hono";
import type { Catalog } from "../../ai/catalog.ts";
import type { Metrics } from "../metrics.ts";
import { type CompatEnv, callerOf } from "./env.ts";

/** `GET /models`: what the caller may use, without anything about providers. */
export function registerModelsRoute(app: Hono<CompatEnv>, catalog: Catalog, metrics: Metrics): void {
  app.get("/models", (c) => {
    const started = performance.now();
    // A speech-to-speech model or agent says so (voice.md §6): `/chat/completions` refuses it.
    const data = catalog.list(callerOf(c)).map((e) => ({
      id: e.id,
      object: "model" as const,
      created: catalog.created,
      owned_by: "perch",
      ...(e.kind === "realtime" || (e.kind === "agent" && e.model.kind === "realtime") ? { kind: "realtime" as const } : {}),
    }));
    metrics.observeAi("/models", "-", 200, (performance.now() - started) / 1000);
    return c.json({ object: "list" as const, data });
  });
}
