import { hash } from "node:crypto";
import type { ApiKeyConfig } from "../config/config.ts";
import type { DomainContext } from "./context.ts";
import { DomainError } from "./errors.ts";
import type { ApiKeyPrincipal } from "./principal.ts";
import { RateLimiter } from "./rate-limiter.ts";

/** The operator API keys of the configuration, known only by their SHA-256, each with its optional rate limit. */
export class ApiKeyService {
  private readonly keys: Map<string, { key: ApiKeyConfig; limiter: RateLimiter | undefined; principal: ApiKeyPrincipal }>;

  constructor(ctx: DomainContext) {
    this.keys = new Map(
      ctx.config.api_keys.map((key) => [
        key.sha256,
        {
          key,
          limiter: key.rate_limit > 0 ? new RateLimiter(key.rate_limit, ctx.clock, 1) : undefined,
          principal: Object.freeze({ kind: "api_key" as const, name: key.name, models: key.models }),
        },
      ]),
    );
  }

  /** The key `bearer` is, counted against its rate limit; undefined when it is none of them. */
  authenticate(bearer: string): ApiKeyPrincipal | undefined {
    if (this.keys.size === 0) return undefined;
    const entry = this.keys.get(hash("sha256", bearer, "hex"));
    if (!entry) return undefined;
    const wait = entry.limiter?.hit(entry.key.name) ?? 0;
    if (wait > 0) throw new DomainError("rate_limited", "RATE_LIMITED", `rate limit reached for API key ${entry.key.name}`, undefined, wait);
    return entry.principal;
  }
}
