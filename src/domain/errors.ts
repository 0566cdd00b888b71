export { StoreUnavailable } from "../store/errors.ts";

/** What went wrong, independent of any surface: each surface maps a kind onto its own status and envelope. */
export type ErrorKind = "invalid" | "unauthenticated" | "forbidden" | "not_found" | "conflict" | "rate_limited" | "unavailable" | "internal";

/** A failure the caller caused or must see, with the contract's code. The domain knows no HTTP status. */
export class DomainError extends Error {
  readonly kind: ErrorKind;
  readonly code: string;
  readonly details: Record<string, unknown> | undefined;
  /** Seconds, for `rate_limited` and `unavailable`. */
  readonly retryAfter: number | undefined;

  constructor(kind: ErrorKind, code: string, message: string, details?: Record<string, unknown>, retryAfter?: number) {
    super(message);
    this.kind = kind;
    this.code = code;
    this.details = details;
    this.retryAfter = retryAfter;
  }
}
