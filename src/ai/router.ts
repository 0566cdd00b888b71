import { type Config, EMBEDDED_SPEECH_MODEL, EMBEDDED_TRANSCRIPTION_MODEL, type ModelConfig, type ProviderConfig } from "../config/config.ts";
import { chatSpan, genAiProvider, type ModelSpan } from "../observability/gen-ai-spans.ts";
import type { Traced } from "../observability/tracing.ts";
import type { ChatCompletion } from "../protocol/compat.ts";
import type { ChatStream } from "./chat-stream.ts";
import { GenerationError } from "./errors.ts";
import type { InFlight } from "./in-flight.ts";
import type { JsonThread } from "./json-thread.ts";
import { AiSdkProvider } from "./providers/ai-sdk.ts";
import { closing, OpenAIProvider, type RawAnswer } from "./providers/openai.ts";
import { type CallOptions, type ChatProvider, ProviderError, type ProviderRequest } from "./providers/provider.ts";

const DEFAULT_BASE_URL: Record<ProviderConfig["kind"], string | undefined> = {
  openai: "https://api.openai.com/v1",
  "openai-compatible": undefined,
  anthropic: undefined,
  google: undefined,
};

/** The longest `Retry-After` honoured between retries; a longer wait moves on to the next fallback. */
const MAX_RETRY_AFTER_MS = 10_000;

/** `json`: the node's JSON thread, for large requests. */
export type ProviderFactory = (p: ProviderConfig, apiKey: string | undefined, json: JsonThread) => ChatProvider;

export const defaultProviderFactory: ProviderFactory = (p, apiKey, json) =>
  p.kind === "anthropic" || p.kind === "google"
    ? new AiSdkProvider({ kind: p.kind, baseUrl: p.base_url, apiKey, timeoutMs: Math.min(p.timeout_ms, p.deadline_ms) })
    : new OpenAIProvider({ baseUrl: p.base_url ?? DEFAULT_BASE_URL[p.kind]!, apiKey, timeoutMs: p.timeout_ms, deadlineMs: p.deadline_ms, json });

/**
 * Calls a chat model through its provider, with retries (back-off on 429, 5xx, timeouts and broken
 * connections) and then its fallbacks in order — all before the first byte reaches the client.
 * The one place where retry and fallback rules live.
 */
export class ChatRouter {
  private readonly providers = new Map<string, { config: ProviderConfig; provider: ChatProvider }>();
  private readonly models: Map<string, ModelConfig>;

  /** Providers whose key variable (`api_key_env`) is not set, each with the variable: named in their failures. */
  private readonly unsetKeys: Map<string, string>;

  /** `json`: the node's JSON thread (its `EngineHost`'s): a router makes none of its own. */
  constructor(config: Pick<Config, "providers" | "models">, json: JsonThread, env: NodeJS.ProcessEnv = process.env, factory = defaultProviderFactory) {
    for (const p of config.providers)
      this.providers.set(p.id, { config: p, provider: factory(p, p.api_key_env ? env[p.api_key_env] || undefined : undefined, json) });
    this.unsetKeys = new Map(unsetKeyVariables(config.providers, env).map((u) => [u.provider, u.variable]));
    this.models = new Map(config.models.map((m) => [m.id, m]));
  }

  complete(model: ModelConfig, request: ProviderRequest, o: CallOptions): Promise<ChatCompletion> {
    if (!o.trace) return this.attempt(model, o.signal, (provider, upstream) => provider.complete({ ...request, model: upstream }, o));
    const span = this.span(o.trace, model, request, false);
    return this.attempt(model, o.signal, (provider, upstream, m) => {
      span.answeredBy(upstream, this.providerName(m));
      return provider.complete({ ...request, model: upstream }, o);
    }).then(
      (c) => {
        span.completed(c);
        return c;
      },
      (err: unknown) => {
        span.failed(err);
        throw err;
      },
    );
  }

  stream(model: ModelConfig, request: ProviderRequest, o: CallOptions): Promise<ChatStream> {
    if (!o.trace) return this.attempt(model, o.signal, (provider, upstream) => provider.stream({ ...request, model: upstream }, o));
    const span = this.span(o.trace, model, request, true);
    return this.attempt(model, o.signal, (provider, upstream, m) => {
      span.answeredBy(upstream, this.providerName(m));
      return provider.stream({ ...request, model: upstream }, o);
    }).then(
      // The stream has started once its first event is in.
      (stream) => {
        span.firstChunk();
        return stream.watch((piece) => span.sawText(piece)).onEnd(() => span.streamEnded(stream.stats.usage));
      },
      (err: unknown) => {
        span.failed(err);
        throw err;
      },
    );
  }

  private span(parent: Traced, model: ModelConfig, request: ProviderRequest, stream: boolean): ModelSpan {
    return chatSpan(parent, model.upstream_model, this.providerName(model), stream, request.messages);
  }

  private providerName(m: ModelConfig): string {
    return genAiProvider(this.providers.get(m.provider)!.config);
  }

  /**
   * A speech or transcription call relayed to the model's OpenAI-style provider (`path`:
   * `/audio/speech`, `/audio/transcriptions`), with the model that answered (one of the fallbacks,
   * maybe). Resolves once the answer's first bytes are in (and `o.accept` took them).
   */
  relay(
    model: ModelConfig,
    path: string,
    body: (
      upstreamModel: string,
      model: ModelConfig,
    ) => Promise<{ body: string | Buffer; contentType: string }> | { body: string | Buffer; contentType: string },
    signal: AbortSignal,
    o: RelayOptions = {},
  ): Promise<RawAnswer & { model: ModelConfig }> {
    return this.attempt(model, signal, async (provider, upstream, m) => {
      if (!(provider instanceof OpenAIProvider)) throw new GenerationError("invalid", `\`${model.id}\` has no provider for ${path}`, { param: "model" });
      const release = o.inFlight ? acquire(o.inFlight, this.providers.get(m.provider)!.config) : undefined;
      let answer: RawAnswer;
      try {
        const b = await body(upstream, m);
        answer = await provider.relay(path, b.body, b.contentType, signal);
        if (o.accept) answer = await o.accept(answer);
      } catch (err) {
        release?.();
        throw err;
      }
      return { ...answer, body: release ? closing(answer.body[Symbol.asyncIterator](), release) : answer.body, model: m };
    });
  }

  private async attempt<T>(
    model: ModelConfig,
    signal: AbortSignal,
    call: (provider: ChatProvider, upstreamModel: string, model: ModelConfig) => Promise<T>,
  ): Promise<T> {
    // The embedded engine a speech or transcription model may fall back to last is not a provider's: its caller runs it.
    const chain = [model, ...model.fallbacks.flatMap((id) => this.models.get(id) ?? [])];
    let last: ProviderError | undefined;
    for (const m of chain) {
      const { config, provider } = this.providers.get(m.provider)!;
      for (let attempt = 0; ; attempt++) {
        try {
          return await call(provider, m.upstream_model, m);
        } catch (err) {
          if (signal.aborted) throw signal.reason;
          if (!(err instanceof ProviderError)) throw err;
          if (err.clientError) {
            throw new GenerationError("upstream_refused", `${err.message}${this.keyNote(m.provider, err.status)}`, {
              status: err.status!,
              param: err.upstream?.param ?? null,
              code: err.upstream?.code ?? null,
            });
          }
          last = err;
          if (!err.retryable || attempt >= config.max_retries) break;
          const wait = backoff(config.retry_backoff_ms, attempt, err.retryAfterMs);
          if (wait === undefined) break;
          await sleep(wait, signal);
        }
      }
    }
    if (last?.timedOut)
      throw new GenerationError("upstream_timeout", `the model provider did not answer in time: ${last.message}`, { code: "upstream_timeout" });
    const note = chain.map((m) => this.keyNote(m.provider, last?.status)).find(Boolean) ?? "";
    throw new GenerationError("upstream_failed", `the model provider failed: ${last?.message ?? "no provider"}${note}`, { code: "upstream_error" });
  }

  /** For a refusal of authentication by a provider whose key variable is not set: the variable and the provider. */
  private keyNote(provider: string, status: number | undefined): string {
    const variable = this.unsetKeys.get(provider);
    return variable && (status === 401 || status === 403) ? ` (the variable ${variable}, api_key_env of provider ${provider}, is not set)` : "";
  }
}

/** The providers whose `api_key_env` names a variable that is not set (or empty) in `env`. */
export function unsetKeyVariables(providers: readonly ProviderConfig[], env: NodeJS.ProcessEnv): Array<{ provider: string; variable: string }> {
  return providers.flatMap((p) => (p.api_key_env && !env[p.api_key_env] ? [{ provider: p.id, variable: p.api_key_env }] : []));
}

export interface RelayOptions {
  /** Bounds the calls in flight per provider (`voice_max_in_flight`): a provider at its bound is passed over like a failed one. */
  inFlight?: InFlight;
  /** Checks the answer (its type, its first bytes); a ProviderError it throws moves on to the next fallback. It closes the answer it refuses. */
  accept?: (answer: RawAnswer) => Promise<RawAnswer>;
}

/** One more voice call to `provider`, or a failure that moves on to the next fallback. */
function acquire(inFlight: InFlight, provider: ProviderConfig): () => void {
  const release = inFlight.tryAcquire(provider.id, provider.voice_max_in_flight);
  if (!release) throw new ProviderError(`provider ${provider.id} has ${provider.voice_max_in_flight} voice calls in flight already`, { retryable: false });
  return release;
}

/**
 * Whether the embedded engine should answer for `model` after `err`: it closes the model's
 * fallbacks and every provider failed (not refused the request itself, nor was the call cancelled).
 */
export function embeddedFallback(model: ModelConfig, err: unknown): boolean {
  const last = model.fallbacks.at(-1);
  if (last === undefined || model.kind === "chat" || last !== (model.kind === "speech" ? EMBEDDED_SPEECH_MODEL : EMBEDDED_TRANSCRIPTION_MODEL)) return false;
  return err instanceof GenerationError && (err.kind === "upstream_failed" || err.kind === "upstream_timeout" || err.kind === "rate_limited");
}

/** Exponential back-off with full jitter, or the provider's `Retry-After`; undefined when that is too long to wait. */
function backoff(base: number, attempt: number, retryAfter: number | undefined): number | undefined {
  if (retryAfter !== undefined) return retryAfter <= MAX_RETRY_AFTER_MS ? retryAfter : undefined;
  const cap = base * 2 ** attempt;
  return cap / 2 + Math.random() * (cap / 2);
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    signal.addEventListener("abort", onAbort, { once: true });
  });
}
