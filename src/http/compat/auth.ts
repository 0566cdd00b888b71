import type { Context } from "hono";
import type { Caller } from "../../ai/caller.ts";
import { DomainError } from "../../domain/errors.ts";
import type { AppBindings, AppEnv } from "../env.ts";
import { requestHeader } from "../headers.ts";
import type { Callers } from "../principal.ts";
import type { CompatEnv } from "./env.ts";
import { OpenAIError } from "./errors.ts";

/**
 * Resolves the caller through the one principal resolver: a connection's device (service stream
 * 2), an operator API key, or a primary session's bearer. Side Control sessions are refused.
 */
export function authenticate(callers: Callers, c: Context<CompatEnv>): Promise<Caller> {
  const ctx = c as unknown as Context<AppEnv>;
  return authenticateCaller(callers, ctx.env, (name) => requestHeader(ctx, name));
}

/** `authenticate` of a request known by its bindings and its headers (lower-case names). */
export async function authenticateCaller(callers: Callers, env: AppBindings | undefined, header: (name: string) => string | undefined): Promise<Caller> {
  try {
    const principal = await callers.principalOf(env, header, { apiKeys: true });
    if (principal.kind === "side_control") {
      throw new OpenAIError(403, "A Side Control session cannot use the Compatible API: use a primary session or an API key.", {
        code: "side_control_session",
      });
    }
    return principal.kind === "api_key"
      ? { kind: "application", name: principal.name, models: principal.models }
      : { kind: "device", publicKey: principal.publicKey };
  } catch (err) {
    if (err instanceof DomainError && err.kind === "unauthenticated") {
      const missing = !header("authorization");
      throw new OpenAIError(401, missing ? "You didn't provide an API key. Send it as `Authorization: Bearer <key>`." : "Incorrect API key provided.", {
        code: "invalid_api_key",
      });
    }
    throw err;
  }
}
