/**
 * What went wrong, independent of any surface: each surface maps a kind onto its own status and
 * envelope (the Public API's `ErrorResponse`, the Compatible API's OpenAI error object).
 */
export type ErrorKind =
  /** The request cannot be served as sent (`param` names the field). */
  | "invalid"
  | "unauthenticated"
  /** The caller may not do this. */
  | "forbidden"
  /** No such thing (a model: code `model_not_found`), or not one this caller may see. */
  | "not_found"
  | "conflict"
  /** A quota, a limit or an engine's queue is full; `retryAfter` seconds. */
  | "rate_limited"
  /** This node cannot serve now (the store unreachable, shutting down, no engine); `retryAfter` seconds. */
  | "unavailable"
  | "internal"
  /** A provider refused the request itself (its own 4xx, passed on with its `upstreamStatus` and message). */
  | "upstream_refused"
  /** A provider failed (5xx, 429 after retries, a broken connection or stream, a malformed answer). */
  | "upstream_failed"
  /** A provider did not answer in time. */
  | "upstream_timeout";

export interface ErrorDetails {
  /** The contract's code, in the surface's case (Public API `UPPER_SNAKE`; the Compatible API lower-cases it). */
  code?: string | null;
  /** The request field the error is about. */
  param?: string | null;
  details?: Record<string, unknown>;
  retryAfter?: number;
  /** For `upstream_refused`: the provider's HTTP status. */
  upstreamStatus?: number;
  cause?: unknown;
}

/**
 * Every failure a caller sees, from any layer (domain, generation, store): one kind, an optional
 * code, the field it is about and how long to wait. Surfaces map only this (and their own envelope
 * errors); anything else thrown is an internal error.
 */
export class PerchError extends Error {
  readonly kind: ErrorKind;
  readonly code: string | null;
  readonly param: string | null;
  readonly details: Record<string, unknown> | undefined;
  readonly retryAfter: number | undefined;
  readonly upstreamStatus: number | undefined;

  constructor(kind: ErrorKind, message: string, o: ErrorDetails = {}) {
    super(message, o.cause === undefined ? undefined : { cause: o.cause });
    this.name = new.target.name;
    this.kind = kind;
    this.code = o.code ?? null;
    this.param = o.param ?? null;
    this.details = o.details;
    this.retryAfter = o.retryAfter;
    this.upstreamStatus = o.upstreamStatus;
  }
}

/** The HTTP status of each kind, the same on every surface (each has its own envelope). */
export const STATUS_OF_KIND: Record<ErrorKind, 400 | 401 | 403 | 404 | 409 | 429 | 500 | 502 | 503 | 504> = {
  invalid: 400,
  unauthenticated: 401,
  forbidden: 403,
  not_found: 404,
  conflict: 409,
  rate_limited: 429,
  unavailable: 503,
  internal: 500,
  upstream_refused: 400,
  upstream_failed: 502,
  upstream_timeout: 504,
};

/** An error's HTTP status: a refused upstream call keeps the provider's own 4xx. */
export function statusOf(err: PerchError): number {
  return err.kind === "upstream_refused" ? (err.upstreamStatus ?? 400) : STATUS_OF_KIND[err.kind];
}
