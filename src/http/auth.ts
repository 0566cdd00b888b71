import type { MiddlewareHandler } from "hono";
import type { Domain } from "../domain/index.ts";
import { CONNECTION_PRINCIPAL, type ConnectionIdentity } from "../domain/principal.ts";
import type { AppEnv } from "./env.ts";
import { ApiError } from "./errors.ts";

export const bearerSecurity = [{ bearerAuth: [] }];

/** Authenticates the bearer session and requires it to be of `kind`. */
export function requireSession(domain: Domain, kind: "primary" | "side_control"): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    const connection = connectionIdentity(c.env);
    if (connection) {
      // A request on a service stream: the connection's key is the caller, as a primary principal.
      if (kind !== "primary") throw new ApiError(403, "SIDE_CONTROL_SESSION_REQUIRED", "this route needs a Side Control session");
      await domain.peers.self(connection.publicKey);
      c.set("principal", { kind: "primary", publicKey: connection.publicKey });
      return next();
    }
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

/** The WebRTC connection a request arrived on, if it came over a service stream. */
export function connectionIdentity(env: unknown): ConnectionIdentity | undefined {
  const socket = (env as { incoming?: { socket?: Record<symbol, unknown> } } | undefined)?.incoming?.socket;
  return socket?.[CONNECTION_PRINCIPAL] as ConnectionIdentity | undefined;
}
