import { Hono, type MiddlewareHandler } from "hono";
import type { Logger } from "pino";
import type { Caller } from "../../ai/caller.ts";
import type { Catalog } from "../../ai/catalog.ts";
import type { ChatService } from "../../ai/chat.ts";
import type { ChatRouter } from "../../ai/router.ts";
import type { SpeechEngine, TranscriptionEngine } from "../../ai/speech/index.ts";
import { TranscriptionService } from "../../ai/transcription.ts";
import type { UsageMeter } from "../../domain/usage-meter.ts";
import { bodyWithinLimit } from "../body.ts";
import type { AppBindings, AppEnv } from "../env.ts";
import { nodeHeader } from "../headers.ts";
import type { Metrics } from "../metrics.ts";
import type { Callers } from "../principal.ts";
import type { Surface } from "../surface.ts";
import { authenticateCaller } from "./auth.ts";
import { chatRoute } from "./chat.ts";
import type { CompatEnv } from "./env.ts";
import { OpenAIError, openAIErrorResponse, toOpenAIError } from "./errors.ts";
import type { JsonBodies } from "./json.ts";
import { registerModelsRoute } from "./models.ts";
import { registerSpeechRoute } from "./speech.ts";
import { registerTranscriptionRoute } from "./transcription.ts";
import { unsent, writeTimeout } from "./write-timeout.ts";

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
  logger: Logger;
  /** The embedded engines (`tts-1`, `whisper-1` in the catalog when present). */
  speech?: SpeechEngine | undefined;
  transcription?: TranscriptionEngine | undefined;
  /** The `compat` section of the configuration. */
  limits?: CompatLimits;
  /** Default `/openai/v1`; service stream 2 mounts the same routes at `/v1`. */
  base?: string;
  /** The node's request bodies (one for all its Compatible API surfaces: the large-body slots are the node's). */
  bodies: JsonBodies;
  /** Counts and limits each caller's use (usage.md). */
  usage: UsageMeter;
}

/** The Compatible API: OpenAI's routes, every error in OpenAI's envelope, 32 MiB bodies. */
export function compatSurface(o: CompatSurfaceOptions): Surface {
  o.bodies.warm();
  const app = new Hono<CompatEnv>();
  const gate = new CompatGate(o.callers, o.limits?.write_timeout_ms ?? DEFAULT_WRITE_TIMEOUT_MS, o.bodies);
  const guard = gate.middleware();
  app.get("/models", guard);
  for (const path of ["/audio/speech", "/audio/transcriptions"]) app.post(path, guard);
  registerModelsRoute(app, o.catalog, o.metrics);
  registerSpeechRoute(app, o.catalog, o.speech, o.router, o.metrics, gate.bodies, o.usage, o.limits?.max_queue_wait_ms);
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
    gate.bodies,
    o.usage,
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
    native: [chatRoute({ chat: o.chat, metrics: o.metrics, logger: o.logger, gate, usage: o.usage })],
  };
}

/**
 * What every route of the surface checks first, in this order, for its native route (chat) and its
 * Hono routes alike: the body's size (413 over COMPAT_BODY_LIMIT), the caller (401, 403), then
 * the response's write timeout.
 */
export class CompatGate {
  private readonly callers: Callers;
  private readonly watcher: (outgoing: NonNullable<AppBindings["outgoing"]>) => void;
  /** The surface's request bodies (large-body slots, the JSON thread). */
  readonly bodies: JsonBodies;

  constructor(callers: Callers, writeTimeoutMs: number, bodies: JsonBodies) {
    this.callers = callers;
    this.bodies = bodies;
    this.watcher = writeTimeout(writeTimeoutMs);
  }

  /**
   * The caller of a request admitted; throws the surface's error otherwise. A chunked body read
   * whole is left in `env.body`. With `watchLater`, the write timeout is the caller's to apply
   * (`watch`), once it knows whether its answer is a stream or a whole one.
   */
  async admit(env: AppBindings, watchLater = false): Promise<Caller> {
    const { incoming, outgoing } = env;
    if (!incoming || !outgoing) throw new Error("the Compatible API is served through the exchange (src/http/exchange.ts)");
    const within = bodyWithinLimit(env, COMPAT_BODY_LIMIT, 2 * COMPAT_BODY_LIMIT);
    if (within !== true && (within === false || !(await within))) {
      throw new OpenAIError(413, `The request body is over ${COMPAT_BODY_LIMIT} bytes.`, { code: "request_too_large" });
    }
    const caller = await authenticateCaller(this.callers, env, (name) => nodeHeader(incoming, name));
    if (!watchLater) this.watch(outgoing);
    return caller;
  }

  /** The write timeout on `outgoing`: a stream from its start, a whole answer (`whole`) when it is written and its socket still holds some of it. */
  watch(outgoing: NonNullable<AppBindings["outgoing"]>, whole = false): void {
    if (!whole || unsent(outgoing)) this.watcher(outgoing);
  }

  /** `admit` as the Hono routes' first middleware: a body read here is put back on the web request. */
  middleware(): MiddlewareHandler<CompatEnv> {
    return async (c, next) => {
      c.set("caller", await this.admit(c.env));
      if (c.env.body) c.req.raw = new Request(c.req.raw, { body: c.env.body as Uint8Array<ArrayBuffer> });
      await next();
    };
  }
}
