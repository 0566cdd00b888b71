import type { Traced } from "../../observability/tracing.ts";
import type { ChatCompletion, ChatRequest } from "../../protocol/compat.ts";
import type { ChatStream } from "../chat-stream.ts";

/** What a provider is asked: the client's validated request, with `model` already the upstream model. */
export type ProviderRequest = Omit<ChatRequest, "model"> & { model: string };

export interface CallOptions {
  signal: AbortSignal;
  /** The model id the client asked for: responses name it instead of the upstream model. */
  publicModel: string;
  /** The span the call's span goes under, when the node traces. */
  trace?: Traced | undefined;
}

/** One upstream provider, behind which any of its models is called. Retries and fallbacks live in the router, not here. */
export interface ChatProvider {
  complete(request: ProviderRequest, o: CallOptions): Promise<ChatCompletion>;
  /** Resolves once the first event has arrived, so that a failure before it can still be retried elsewhere. */
  stream(request: ProviderRequest, o: CallOptions): Promise<ChatStream>;
}

/** A provider call that failed before anything reached the client. */
export class ProviderError extends Error {
  /** The provider's HTTP status; undefined for a network failure or a malformed answer. */
  readonly status: number | undefined;
  /** The provider's own error object, when it sent one in OpenAI's shape. */
  readonly upstream: { message?: string; type?: string; param?: string | null; code?: string | null } | undefined;
  /** Milliseconds the provider asked to wait (`Retry-After`). */
  readonly retryAfterMs: number | undefined;
  readonly timedOut: boolean;
  /** False for failures another try would only repeat (an overall deadline passed, an answer over a cap). */
  private readonly mayRetry: boolean;

  constructor(
    message: string,
    o: { status?: number; upstream?: ProviderError["upstream"]; retryAfterMs?: number; timedOut?: boolean; retryable?: boolean } = {},
  ) {
    super(message);
    this.mayRetry = o.retryable ?? true;
    this.status = o.status;
    this.upstream = o.upstream;
    this.retryAfterMs = o.retryAfterMs;
    this.timedOut = o.timedOut ?? false;
  }

  /** Worth another try on the same provider: throttled, overloaded, broken or slow. */
  get retryable(): boolean {
    if (!this.mayRetry) return false;
    return this.status === undefined || this.status === 408 || this.status === 409 || this.status === 429 || this.status >= 500;
  }

  /** The client's own mistake, which no other provider would accept either: passed on as the provider's 4xx. */
  get clientError(): boolean {
    return this.status === 400 || this.status === 413 || this.status === 422;
  }
}

/** `Retry-After` (seconds or an HTTP date) in milliseconds. */
export function retryAfterMs(header: string | null | undefined, now = Date.now()): number | undefined {
  if (!header) return undefined;
  const seconds = Number(header);
  if (Number.isFinite(seconds)) return Math.max(0, seconds * 1000);
  const at = Date.parse(header);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}
