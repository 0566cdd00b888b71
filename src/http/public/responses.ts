import type { z } from "@hono/zod-openapi";
import { ErrorResponse } from "../../protocol/public.ts";

const ERROR_DESCRIPTIONS: Record<number, string> = {
  400: "Invalid request",
  401: "Not authenticated",
  403: "Not allowed",
  404: "Not found",
  409: "Conflict",
  413: "Body too large",
  415: "Unsupported media type",
  429: "Rate limited (see Retry-After)",
  503: "Unavailable: the store cannot be reached now (see Retry-After)",
};

/** The `ErrorResponse` entries of a route's responses. */
export function errors(...statuses: number[]) {
  return Object.fromEntries(
    statuses.map((s) => [s, { description: ERROR_DESCRIPTIONS[s] ?? "Error", content: { "application/json": { schema: ErrorResponse } } }]),
  );
}

export function json<T extends z.ZodType>(schema: T, description: string) {
  return { description, content: { "application/json": { schema } } };
}

export function jsonBody<T extends z.ZodType>(schema: T, required = true) {
  return { required, content: { "application/json": { schema } } };
}

export const noContent = { description: "Done" };

export const bearerSecurity = [{ bearerAuth: [] }];
