import { Hono } from "hono";
import type { Logger } from "pino";
import type { Catalog } from "../../ai/catalog.ts";
import type { ChatService } from "../../ai/chat.ts";
import type { SpeechEngine, TranscriptionEngine } from "../../ai/speech/index.ts";
import type { ApiKeyConfig } from "../../config/config.ts";
import type { Clock } from "../../domain/clock.ts";
import type { Domain } from "../../domain/index.ts";
import type { Metrics } from "../metrics.ts";
import { bodyLimit } from "../middleware.ts";
import { authenticate } from "./auth.ts";
import { registerChatRoute } from "./chat.ts";
import type { CompatEnv } from "./env.ts";
import { OpenAIError, openAIErrorResponse, toOpenAIError } from "./errors.ts";
import { registerModelsRoute } from "./models.ts";
import { registerSpeechRoute } from "./speech.ts";
import { registerTranscriptionRoute } from "./transcription.ts";

export const COMPAT_BODY_LIMIT = 32 * 1024 * 1024;

export interface CompatAppOptions {
  domain: Domain;
  clock: Clock;
  catalog: Catalog;
  chat: ChatService;
  apiKeys: readonly ApiKeyConfig[];
  metrics: Metrics;
  logger: Logger;
  /** The embedded engines; without a speech engine the audio routes are not offered. */
  speech?: SpeechEngine | undefined;
  transcription?: TranscriptionEngine | undefined;
}

/** The methods of each route, for 405s. */
const ROUTES: Record<string, string> = {
  "/models": "GET",
  "/chat/completions": "POST",
  "/audio/speech": "POST",
  "/audio/transcriptions": "POST",
};

/**
 * The Compatible API (OpenAI's routes, errors in OpenAI's envelope), mounted by the root at
 * `/openai/v1` and by service stream 2 at `/v1`. Paths here are relative to the mount point.
 */
export function createCompatApp(o: CompatAppOptions): Hono<CompatEnv> {
  const app = new Hono<CompatEnv>();
  const tooLarge = (c: Parameters<Parameters<typeof bodyLimit>[1]>[0]) =>
    openAIErrorResponse(c, new OpenAIError(413, `The request body is over ${COMPAT_BODY_LIMIT} bytes.`, { code: "request_too_large" }));
  const auth = authenticate(o.domain, o.apiKeys, o.clock);

  const guard = [bodyLimit(COMPAT_BODY_LIMIT, tooLarge, 2 * COMPAT_BODY_LIMIT), auth] as const;
  for (const [path, method] of Object.entries(ROUTES)) app.on(method, path, ...guard);
  registerModelsRoute(app, o.catalog, o.metrics);
  registerChatRoute(app, o.chat, o.metrics);
  if (o.speech) {
    registerSpeechRoute(app, o.catalog, o.speech, o.metrics);
    registerTranscriptionRoute(app, o.catalog, o.transcription, o.metrics);
  }

  // Registered last: whatever no route took. Mounted sub-apps do not get their own notFound.
  app.all("*", (c) => {
    const prefix = c.req.routePath.slice(0, -2);
    const path = c.req.path.slice(prefix.length);
    const allowed = ROUTES[path];
    if (allowed) {
      c.header("Allow", allowed);
      throw new OpenAIError(405, `${c.req.method} is not allowed on ${path}; use ${allowed}.`, { code: "method_not_allowed" });
    }
    throw new OpenAIError(404, `Unknown request URL: ${c.req.method} ${c.req.path}.`, { code: "unknown_url" });
  });
  app.onError((err, c) => {
    const e = toOpenAIError(err);
    if (e.status >= 500 && e.status !== 502 && e.status !== 504) o.logger.error({ err, req_id: c.get("requestId"), path: c.req.path }, "request failed");
    return openAIErrorResponse(c, e);
  });
  return app;
}
