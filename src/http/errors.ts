import type { Context } from "hono";
import { HTTPException } from "hono/http-exception";
import type { ZodError } from "zod";
import { PerchError, statusOf } from "../errors.ts";
import { JSON_CONTENT_TYPE, JSON_UTF8 } from "./json.ts";
import type { Failure } from "./surface.ts";

export type ErrorStatus = 400 | 401 | 403 | 404 | 405 | 408 | 409 | 413 | 415 | 429 | 431 | 500 | 502 | 503 | 504;

/** An error of the Public API's (and operations') `ErrorResponse` envelope, with its status. */
export class ApiError extends Error {
  readonly status: ErrorStatus;
  readonly code: string;
  readonly details: Record<string, unknown> | undefined;
  /** Seconds, for 429 and 503. */
  readonly retryAfter: number | undefined;

  constructor(status: ErrorStatus, code: string, message: string, details?: Record<string, unknown>, retryAfter?: number) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details;
    this.retryAfter = retryAfter;
  }
}

/** The contract's `ErrorResponse` body for `err`. */
export function errorBody(err: ApiError): { error: { code: string; message: string; details?: Record<string, unknown> } } {
  const error: { code: string; message: string; details?: Record<string, unknown> } = { code: err.code, message: err.message };
  if (err.details) error.details = err.details;
  return { error };
}

/** Writes the contract's `ErrorResponse`. */
export function errorResponse(c: Context, err: ApiError): Response {
  if (err.retryAfter !== undefined) c.header("Retry-After", String(err.retryAfter));
  return c.json(errorBody(err), err.status, JSON_UTF8);
}

/** The Public API's (and operations', the web app's) error mapping: `ErrorResponse`. */
export function apiFailure(err: unknown): Failure {
  const e = toApiError(err);
  return { status: e.status, body: errorBody(e), retryAfter: e.retryAfter, contentType: JSON_CONTENT_TYPE };
}

/** The `ErrorResponse` for a request no route answers: 405 with `Allow` when the path has other methods, else 404. */
export function unroutedResponse(c: Context, allow: string[]): Response {
  if (allow.length > 0) {
    c.header("Allow", allow.join(", "));
    return errorResponse(c, new ApiError(405, "METHOD_NOT_ALLOWED", `${c.req.method} is not allowed here; use ${allow.join(", ")}`));
  }
  return errorResponse(c, new ApiError(404, "NOT_FOUND", `no route for ${c.req.method} ${c.req.path}`));
}

/** Maps anything thrown while handling a request onto `ErrorResponse`; unexpected errors become 500. */
export function toApiError(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  if (err instanceof PerchError) {
    const code = (err.code ?? err.kind).toUpperCase();
    const details = err.details ?? (err.param ? { field: err.param } : undefined);
    return new ApiError(statusOf(err) as ErrorStatus, code, err.message, details, err.retryAfter);
  }
  if (err instanceof HTTPException) {
    if (err.status === 400) return new ApiError(400, "INVALID_REQUEST", err.message || "malformed request");
    if (err.status === 413) return new ApiError(413, "PAYLOAD_TOO_LARGE", "request body is too large");
    if (err.status === 415) return new ApiError(415, "UNSUPPORTED_MEDIA_TYPE", "Content-Type must be application/json");
  }
  return new ApiError(500, "INTERNAL", "internal server error");
}

/** The field a validation failure is about: the first issue's path, or the unknown key it names. */
function issueField(error: ZodError): string {
  const issue = error.issues[0];
  if (!issue) return "";
  const path = issue.path.map(String);
  if (issue.code === "unrecognized_keys" && issue.keys[0]) path.push(issue.keys[0]);
  return path.join(".");
}

/** A zod-openapi hook that turns a failed validation into `code` with `details.field`. */
export function invalid(code: string) {
  return (result: { success: true } | { success: false; error: ZodError }): undefined => {
    if (result.success) return undefined;
    const field = issueField(result.error);
    const issue = result.error.issues[0];
    const what = issue?.code === "unrecognized_keys" ? "unknown field" : (issue?.message ?? "invalid value");
    throw new ApiError(400, code, field ? `${field}: ${what}` : what, { field });
  };
}
