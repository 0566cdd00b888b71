import { Hono } from "hono";
import type { Logger } from "pino";
import type { Catalog } from "../../ai/catalog.ts";
import type { ChatService } from "../../ai/chat.ts";
import type { ChatRouter } from "../../ai/router.ts";
import type { SpeechEngine, TranscriptionEngine } from "../../ai/speech/index.ts";
import { TranscriptionService } from "../../ai/transcription.ts";
import type { UsageMeter } from "../../domain/usage-meter.ts";
import type { AppBindings, AppEnv } from "../env.ts";
import type { Exchange } from "../exchange.ts";
import { nodeHeader } from "../headers.ts";
import type { Metrics } from "../metrics.ts";
import { bodyLimitGuard } from "../native.ts";
import type { Callers } from "../principal.ts";
import type { Gate, Surface } from "../surface.ts";
import { authenticateCaller } from "./auth.ts";
import { chatRoute } from "./chat.ts";
import type { CompatEnv } from "./env.ts";
import { OpenAIError, openAIErrorResponse, openAIFailure } from "./errors.ts";
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
    failure: openAIFailure,
    gate,
    unrouted: (c, allow) => {
      if (allow.length > 0) {
        c.header("Allow", allow.join(", "));
        return openAIErrorResponse(c, new OpenAIError(405, `${c.req.method} is not allowed here; use ${allow.join(", ")}.`, { code: "method_not_allowed" }));
      }
      return openAIErrorResponse(c, new OpenAIError(404, `Unknown request URL: ${c.req.method} ${c.req.path}.`, { code: "unknown_url" }));
    },
    native: [chatRoute({ chat: o.chat, metrics: o.metrics, bodies: gate.bodies, usage: o.usage })],
  };
}

/**
 * What every route of the surface checks first, native (chat) and Hono alike, whether or not it is
 * listed anywhere (the surface's gate, run by `mountSurfaces`), in this order: the body's size (413
 * over COMPAT_BODY_LIMIT), the caller (401, 403: `Exchange.caller`), then the response's write timeout.
 */
export class CompatGate implements Gate {
  private readonly callers: Callers;
  private readonly watcher: (outgoing: NonNullable<AppBindings["outgoing"]>) => void;
  private readonly bodyLimit = bodyLimitGuard(
    COMPAT_BODY_LIMIT,
    () => new OpenAIError(413, `The request body is over ${COMPAT_BODY_LIMIT} bytes.`, { code: "request_too_large" }),
    2 * COMPAT_BODY_LIMIT,
  );
  /** The surface's request bodies (large-body slots, the JSON thread). */
  readonly bodies: JsonBodies;

  constructor(callers: Callers, writeTimeoutMs: number, bodies: JsonBodies) {
    this.callers = callers;
    this.bodies = bodies;
    this.watcher = writeTimeout(writeTimeoutMs);
  }

  /**
   * Admits a request's caller, or throws the surface's error. A Hono route's answer is watched by
   * the write timeout from here on; a native route's once it is known whether its answer is a
   * stream or a whole one (`answered`).
   */
  readonly admit = async (x: Exchange): Promise<void> => {
    const limited = this.bodyLimit(x);
    if (limited) await limited;
    x.caller = await authenticateCaller(this.callers, x.env, (name) => nodeHeader(x.incoming, name));
    if (!x.native) this.watcher(x.outgoing);
  };

  /** The write timeout on a native route's answer: a stream from its start, a whole answer when its socket still holds some of it. */
  answered(x: Exchange): void {
    if (!x.outgoing.writableEnded || unsent(x.outgoing)) this.watcher(x.outgoing);
  }
}
