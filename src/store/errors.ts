import { PerchError } from "../errors.ts";

/** Seconds a client is told to wait (`Retry-After`) when the store cannot be reached. */
export const STORE_RETRY_AFTER_S = 2;

/**
 * The store cannot serve now: its server is unreachable or restarting (PostgreSQL), or its file is
 * full or locked by another process past the wait (SQLite). Nothing was written by the operation
 * that failed so (a transaction is rolled back whole); trying again later may succeed.
 */
export class StoreUnavailable extends PerchError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("unavailable", message, { code: "UNAVAILABLE", retryAfter: STORE_RETRY_AFTER_S, cause: options?.cause });
  }
}

/** PostgreSQL SQLSTATEs of a server that is going away, starting, or out of room. */
const PG_UNAVAILABLE = /^(08...|57P0[1-4]|53[0-9]{3}|58030|XX001)$/;
/** Socket errors reaching the server. */
const NET_CODES = new Set(["ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "EPIPE", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENETUNREACH", "ECONNABORTED"]);
/** What node-postgres says when a connection ended under it, or no connection came in time. */
const PG_CLIENT_MESSAGES =
  /Connection terminated|connection error and is not queryable|timeout exceeded when trying to connect|Query read timeout|Client was closed and is not queryable/;
/** SQLite primary result codes: BUSY, LOCKED (locked past the wait), IOERR, FULL, CANTOPEN. */
const SQLITE_UNAVAILABLE = new Set([5, 6, 10, 13, 14]);

/** Why `err` means the store is unavailable (a short text), or undefined when it is another failure. */
export function unavailableReason(err: unknown): string | undefined {
  if (!(err instanceof Error)) return undefined;
  if (err instanceof StoreUnavailable) return err.message;
  const e = err as Error & { code?: unknown; errcode?: unknown };
  if (typeof e.errcode === "number" && e.code === "ERR_SQLITE_ERROR") {
    const primary = e.errcode & 0xff;
    if (!SQLITE_UNAVAILABLE.has(primary)) return undefined;
    return primary === 13
      ? "the database's disk is full"
      : primary === 5 || primary === 6
        ? "the database is locked by another process"
        : "the database file cannot be written";
  }
  if (typeof e.code === "string" && (PG_UNAVAILABLE.test(e.code) || NET_CODES.has(e.code))) return "the database cannot be reached";
  if (PG_CLIENT_MESSAGES.test(e.message)) return "the database cannot be reached";
  // A pool's aggregate of several connection attempts (IPv4 and IPv6) when every one was refused.
  if (err instanceof AggregateError && err.errors.length > 0 && err.errors.every((x) => unavailableReason(x) !== undefined))
    return "the database cannot be reached";
  return undefined;
}

/** `err` as `StoreUnavailable` when it means the store is unavailable; otherwise `err` itself. */
export function classify(err: unknown): unknown {
  if (err instanceof StoreUnavailable) return err;
  const reason = unavailableReason(err);
  return reason === undefined ? err : new StoreUnavailable(reason, { cause: err });
}
