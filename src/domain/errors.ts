import { type ErrorKind, PerchError } from "../errors.ts";

export type { ErrorKind } from "../errors.ts";
export { PerchError } from "../errors.ts";
export { StoreUnavailable } from "../store/errors.ts";

/** A failure of the domain, with the contract's code (`PEER_BLOCKED`); the domain knows no HTTP status. */
export class DomainError extends PerchError {
  declare readonly code: string;

  constructor(kind: ErrorKind, code: string, message: string, details?: Record<string, unknown>, retryAfter?: number) {
    super(kind, message, { code, ...(details ? { details } : {}), ...(retryAfter !== undefined ? { retryAfter } : {}) });
  }
}
