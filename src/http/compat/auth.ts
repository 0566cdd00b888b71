import type { Caller } from "../../ai/caller.ts";
import { DomainError } from "../../domain/errors.ts";
import type { AppBindings } from "../env.ts";
import type { Callers } from "../principal.ts";
import { OpenAIError } from "./errors.ts";

/**
 * The caller of a Compatible API request, through the one principal resolver: a connection's
 * device (service stream 2), an operator API key, or a primary session's bearer (headers by
 * lower-case name). Side Control sessions are refused.
 */
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
