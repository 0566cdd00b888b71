import type { MiddlewareHandler } from "hono";
import type { Domain } from "../domain/index.ts";
import type { AppEnv } from "./env.ts";
import { ApiError } from "./errors.ts";

export const bearerSecurity = [{ bearerAuth: [] }];

/** Authenticates the bearer session and requires it to be of `kind`. */
export function requireSession(domain: Domain, kind: "primary" | "side_control"): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    const bearer = /^Bearer +(\S+)$/i.exec(c.req.header("authorization") ?? "")?.[1];
    const principal = await domain.auth.authenticate(bearer, c.req.header("x-public-key"));
    if (principal.kind !== kind) {
      throw kind === "primary"
        ? new ApiError(403, "PRIMARY_SESSION_REQUIRED", "this route needs a primary session")
        : new ApiError(403, "SIDE_CONTROL_SESSION_REQUIRED", "this route needs a Side Control session");
    }
    c.set("principal", principal);
    await next();
  };
}
