import type { Context } from "hono";
import { HTTPException } from "hono/http-exception";
import type { ZodError } from "zod";
import { PerchError, statusOf } from "../../errors.ts";
import { sseEvent } from "../../protocol/sse.ts";
import type { Failure } from "../surface.ts";

export type OpenAIErrorType = "invalid_request_error" | "permission_error" | "rate_limit_error" | "insufficient_quota" | "api_error";

/** An error answered in OpenAI's envelope `{"error":{"message","type","param","code"}}`. */
export class OpenAIError extends Error {
  readonly status: number;
  readonly type: OpenAIErrorType;
  readonly param: string | null;
  readonly code: string | null;
  /** Seconds, for 429 and 503. */
  readonly retryAfter: number | undefined;

  constructor(status: number, message: string, o: { type?: OpenAIErrorType; param?: string | null; code?: string | null; retryAfter?: number } = {}) {
    super(message);
    this.status = status;
    this.type = o.type ?? typeFor(status);
    this.param = o.param ?? null;
    this.code = o.code ?? null;
    this.retryAfter = o.retryAfter;
  }
}

function typeFor(status: number): OpenAIErrorType {
  if (status === 403) return "permission_error";
  if (status === 429) return "rate_limit_error";
  return status >= 500 ? "api_error" : "invalid_request_error";
}

export function openAIErrorResponse(c: Context, err: OpenAIError): Response {
  if (err.retryAfter !== undefined) c.header("Retry-After", String(err.retryAfter));
  return c.json(openAIErrorEnvelope(err), err.status as 400);
}

/** The body of OpenAI's error envelope for `err`. */
export function openAIErrorEnvelope(err: OpenAIError): { error: { message: string; type: OpenAIErrorType; param: string | null; code: string | null } } {
  return { error: { message: err.message, type: err.type, param: err.param, code: err.code } };
}

/** The Compatible API's error mapping: OpenAI's envelope. */
export function openAIFailure(err: unknown): Failure {
  const e = toOpenAIError(err);
  return { status: e.status, body: openAIErrorEnvelope(e), retryAfter: e.retryAfter, contentType: "application/json" };
}

/** Maps anything thrown while serving the Compatible API onto OpenAI's envelope; unexpected errors become 500. */
export function toOpenAIError(err: unknown): OpenAIError {
  if (err instanceof OpenAIError) return err;
  if (err instanceof PerchError) {
    const code = err.kind === "unauthenticated" ? "invalid_api_key" : (err.code?.toLowerCase() ?? null);
    // A usage limit reached is OpenAI's quota error: type and code `insufficient_quota` (usage.md §3).
    const type = code === "insufficient_quota" ? ({ type: "insufficient_quota" } as const) : {};
    return new OpenAIError(statusOf(err), err.message, {
      param: err.param,
      code,
      ...type,
      ...(err.retryAfter !== undefined ? { retryAfter: err.retryAfter } : {}),
    });
  }
  if (err instanceof HTTPException && err.status === 413) return new OpenAIError(413, "request body is too large", { code: "request_too_large" });
  if (err instanceof HTTPException && err.status < 500) return new OpenAIError(err.status, err.message || "malformed request");
  return new OpenAIError(500, "The server had an error while processing your request.", { code: "internal_error" });
}

/** The parameter a validation failure is about, as OpenAI names it (`messages[0].content`), with the reason. */
export function invalidParameter(error: ZodError): OpenAIError {
  const issue = error.issues[0] && deepest(error.issues[0]);
  if (!issue) return new OpenAIError(400, "invalid request", { code: "invalid_request" });
  let param = "";
  for (const p of issue.path) param += typeof p === "number" ? `[${p}]` : param ? `.${String(p)}` : String(p);
  if (issue.code === "unrecognized_keys") {
    const key = issue.keys[0] ?? "";
    const name = param ? `${param}.${key}` : key;
    return new OpenAIError(400, `Unrecognized request argument supplied: ${name}`, { param: name, code: "unknown_parameter" });
  }
  return new OpenAIError(400, `Invalid value for '${param || "body"}': ${issue.message}`, { param: param || null, code: "invalid_value" });
}

type Issue = ZodError["issues"][number];

/** For a value that matched no member of a union, the issue of the member it got furthest into (its path made absolute). */
function deepest(issue: Issue): Issue {
  if (issue.code !== "invalid_union" || issue.errors.length === 0) return issue;
  let best: Issue | undefined;
  for (const branch of issue.errors) {
    const first = branch[0];
    if (!first) continue;
    const candidate = deepest({ ...first, path: [...issue.path, ...first.path] } as Issue);
    if (!best || candidate.path.length > best.path.length) best = candidate;
  }
  return best ?? issue;
}

/** An error that ends a stream already under way, as the Compatible API's SSE `error` event: mapped like any other error. */
export function sseErrorEvent(err: unknown): Buffer {
  const e = toOpenAIError(err);
  return sseEvent({ error: { message: e.message, type: e.type, param: e.param, code: e.code } });
}
