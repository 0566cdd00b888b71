import type { Context } from "hono";
import { HTTPException } from "hono/http-exception";
import type { ZodError } from "zod";
import { ApiError } from "../domain/errors.ts";

/** Writes the contract's `ErrorResponse`. */
export function errorResponse(c: Context, err: ApiError): Response {
  if (err.retryAfter !== undefined) c.header("Retry-After", String(err.retryAfter));
  const error: { code: string; message: string; details?: Record<string, unknown> } = { code: err.code, message: err.message };
  if (err.details) error.details = err.details;
  return c.json({ error }, err.status);
}

/** Maps anything thrown while handling a request onto `ErrorResponse`; unexpected errors become 500. */
export function toApiError(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
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
