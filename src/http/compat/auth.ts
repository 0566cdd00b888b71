import { createHash } from "node:crypto";
import type { MiddlewareHandler } from "hono";
import type { Caller } from "../../ai/caller.ts";
import type { ApiKeyConfig } from "../../config/config.ts";
import type { Clock } from "../../domain/clock.ts";
import { DomainError } from "../../domain/errors.ts";
import type { Domain } from "../../domain/index.ts";
import type { Principal } from "../../domain/principal.ts";
import { RateLimiter } from "../../domain/rate-limiter.ts";
import type { CompatEnv } from "./env.ts";
import { OpenAIError } from "./errors.ts";

/**
 * Resolves who calls the Compatible API: the device of a connection (stream 2 sets the principal
 * before this runs), an operator API key, or a primary session's bearer. API keys are looked up
 * first because they need no store round trip; a credential cannot be both.
 */
export function authenticate(domain: Domain, apiKeys: readonly ApiKeyConfig[], clock: Clock): MiddlewareHandler<CompatEnv> {
  const keys = new Map(apiKeys.map((k) => [k.sha256, { key: k, limiter: k.rate_limit > 0 ? new RateLimiter(k.rate_limit, clock) : undefined }]));
  return async (c, next) => {
    const connection = c.get("principal") as Principal | undefined;
    if (connection?.kind === "primary") {
      c.set("caller", { kind: "device", publicKey: connection.publicKey });
      return next();
    }
    const bearer = /^Bearer +(\S+)$/i.exec(c.req.header("authorization") ?? "")?.[1];
    if (!bearer) {
      throw new OpenAIError(401, "You didn't provide an API key. Send it as `Authorization: Bearer <key>`.", { code: "invalid_api_key" });
    }
    const apiKey = keys.get(createHash("sha256").update(bearer).digest("hex"));
    let caller: Caller;
    if (apiKey) {
      const wait = apiKey.limiter?.hit(apiKey.key.name) ?? 0;
      if (wait > 0) throw new OpenAIError(429, `Rate limit reached for API key ${apiKey.key.name}.`, { code: "rate_limit_exceeded", retryAfter: wait });
      caller = { kind: "application", name: apiKey.key.name, models: apiKey.key.models };
    } else {
      let principal: Principal;
      try {
        principal = await domain.auth.authenticate(bearer, undefined);
      } catch (err) {
        if (err instanceof DomainError && err.kind === "unauthenticated")
          throw new OpenAIError(401, "Incorrect API key provided.", { code: "invalid_api_key" });
        throw err;
      }
      if (principal.kind !== "primary") {
        throw new OpenAIError(403, "A Side Control session cannot use the Compatible API: use a primary session or an API key.", {
          code: "side_control_session",
        });
      }
      caller = { kind: "device", publicKey: principal.publicKey };
    }
    c.set("caller", caller);
    await next();
  };
}
