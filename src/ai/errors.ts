/**
 * Why a generation failed, independent of any surface (the Compatible API maps each kind to
 * OpenAI's error object; a future surface would map them its own way).
 */
export type GenerationErrorKind =
  /** The request cannot be served as sent (`param` names the field). */
  | "invalid"
  /** No such model, or not one this caller may use. */
  | "model_not_found"
  /** The caller may not do this (for example device tools without a device). */
  | "forbidden"
  /** This caller's quota or an engine's queue is full. */
  | "rate_limited"
  /** The provider refused the request itself (its own 4xx, passed on with its message). */
  | "upstream_refused"
  /** The provider failed (5xx, 429 after retries, a broken connection, a malformed answer). */
  | "upstream_failed"
  /** The provider did not answer in time. */
  | "upstream_timeout"
  /** A local engine is missing or cannot run. */
  | "unavailable";

export class GenerationError extends Error {
  readonly kind: GenerationErrorKind;
  readonly param: string | null;
  readonly code: string | null;
  /** For `upstream_refused`: the provider's status; for `rate_limited`: seconds to wait. */
  readonly status: number | undefined;
  readonly retryAfter: number | undefined;

  constructor(kind: GenerationErrorKind, message: string, o: { param?: string | null; code?: string | null; status?: number; retryAfter?: number } = {}) {
    super(message);
    this.kind = kind;
    this.param = o.param ?? null;
    this.code = o.code ?? null;
    this.status = o.status;
    this.retryAfter = o.retryAfter;
  }
}
