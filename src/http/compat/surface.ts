import { type Context, Hono, type MiddlewareHandler } from "hono";
import type { Catalog } from "../../ai/catalog.ts";
import type { ChatService } from "../../ai/chat.ts";
import { warmJsonThread } from "../../ai/json-thread.ts";
import type { ChatRouter } from "../../ai/router.ts";
import type { SpeechEngine, TranscriptionEngine } from "../../ai/speech/index.ts";
import { TranscriptionService } from "../../ai/transcription.ts";
import type { AppEnv } from "../env.ts";
import type { Metrics } from "../metrics.ts";
import { bodyWithin } from "../middleware.ts";
import type { Callers } from "../principal.ts";
import type { Surface } from "../surface.ts";
import { authenticate } from "./auth.ts";
import { registerChatRoute } from "./chat.ts";
import type { CompatEnv } from "./env.ts";
import { OpenAIError, openAIErrorResponse, toOpenAIError } from "./errors.ts";
import { registerModelsRoute } from "./models.ts";
import { registerSpeechRoute } from "./speech.ts";
import { registerTranscriptionRoute } from "./transcription.ts";
import { writeTimeout } from "./write-timeout.ts";

export const DEFAULT_WRITE_TIMEOUT_MS = 30_000;

export const COMPAT_BASE = "/openai/v1";
export const COMPAT_BODY_LIMIT = 32 * 1024 * 1024;

export interface CompatLimits {
  /** Longest audio a transcription decodes, in seconds. */
  max_audio_seconds: number;
  /** A client that takes none of a response's waiting bytes for this long is disconnected. */
  write_timeout_ms: number;
  /** An embedded-engine request that cannot start within this is refused at once (429). */
  max_queue_wait_ms?: number;
}

export interface CompatSurfaceOptions {
  callers: Callers;
  catalog: Catalog;
  chat: ChatService;
  router: ChatRouter;
  metrics: Metrics;
  /** The embedded engines (`tts-1`, `whisper-1` in the catalog when present). */
  speech?: SpeechEngine | undefined;
  transcription?: TranscriptionEngine | undefined;
  /** The `compat` section of the configuration. */
  limits?: CompatLimits;
  /** Default `/openai/v1`; service stream 2 mounts the same routes at `/v1`. */
  base?: string;
}

/** The Compatible API: OpenAI's routes, every error in OpenAI's envelope, 32 MiB bodies. */
export function compatSurface(o: CompatSurfaceOptions): Surface {
  warmJsonThread();
  const app = new Hono<CompatEnv>();
  const guard = compatGuard(o.callers, o.limits?.write_timeout_ms ?? DEFAULT_WRITE_TIMEOUT_MS);
  app.get("/models", guard);
  for (const path of ["/chat/completions", "/audio/speech", "/audio/transcriptions"]) app.post(path, guard);
  registerModelsRoute(app, o.catalog, o.metrics);
  registerChatRoute(app, o.chat, o.metrics);
  registerSpeechRoute(app, o.catalog, o.speech, o.router, o.metrics, o.limits?.max_queue_wait_ms);
  registerTranscriptionRoute(
    app,
    o.catalog,
    new TranscriptionService({
      engine: o.transcription,
      router: o.router,
      maxAudioSeconds: o.limits?.max_audio_seconds,
      maxQueueWaitMs: o.limits?.max_queue_wait_ms,
    }),
    o.metrics,
  );
  return {
    base: o.base ?? COMPAT_BASE,
    app: app as unknown as Hono<AppEnv>,
    error: (c, err) => openAIErrorResponse(c, toOpenAIError(err)),
    unrouted: (c, allow) => {
      if (allow.length > 0) {
        c.header("Allow", allow.join(", "));
        return openAIErrorResponse(c, new OpenAIError(405, `${c.req.method} is not allowed here; use ${allow.join(", ")}.`, { code: "method_not_allowed" }));
      }
      return openAIErrorResponse(c, new OpenAIError(404, `Unknown request URL: ${c.req.method} ${c.req.path}.`, { code: "unknown_url" }));
    },
  };
}

/**
 * What every route of the surface checks first, in this order and in one middleware (one frame of
 * Hono's chain instead of three on each call): the body's size (413 over COMPAT_BODY_LIMIT), the
 * caller (401, 403), then the response's write timeout.
 */
function compatGuard(callers: Callers, writeTimeoutMs: number): MiddlewareHandler<CompatEnv> {
  const watch = writeTimeout(writeTimeoutMs);
  const tooLarge = (c: Context<CompatEnv>) =>
    openAIErrorResponse(c, new OpenAIError(413, `The request body is over ${COMPAT_BODY_LIMIT} bytes.`, { code: "request_too_large" }));
  return async (c, next) => {
    const within = bodyWithin(c as unknown as Context<AppEnv>, COMPAT_BODY_LIMIT, 2 * COMPAT_BODY_LIMIT);
    if (within !== true && (within === false || !(await within))) return tooLarge(c);
    c.set("caller", await authenticate(callers, c));
    watch(c);
    await next();
  };
}
