import { createRoute, type z } from "@hono/zod-openapi";
import type { Domain } from "../../domain/index.ts";
import { LoginHeaders, LoginRequest, LoginResult, ServerInfo } from "../../protocol/public.ts";
import { clientAddress } from "../client-address.ts";
import type { App } from "../env.ts";
import { invalid } from "../errors.ts";
import { errors, json, jsonBody } from "./responses.ts";

const serverInfoRoute = createRoute({
  method: "get",
  path: "/server-info",
  tags: ["server"],
  summary: "The server's public key, time, endpoint and ICE settings",
  responses: { 200: json(ServerInfo, "Server information") },
});

const loginRoute = createRoute({
  method: "post",
  path: "/login",
  tags: ["session"],
  summary: "Log in with an X25519-HS256 assertion: a primary session, or a Side Control session for a device token",
  request: {
    // Documented here; checked by the domain so that each failure gets its own contract code.
    headers: LoginHeaders.partial(),
    body: jsonBody(LoginRequest, false),
  },
  middleware: [
    // An empty body (even one labelled JSON) is the primary grant.
    async (c, next) => {
      if ((await c.req.text()).trim() === "") (c.req.bodyCache as Record<string, Promise<string>>).text = Promise.resolve("{}");
      await next();
    },
  ] as const,
  responses: { 200: json(LoginResult, "A new session"), ...errors(400, 401, 403, 413, 415, 429) },
});

export function registerServerRoutes(app: App, domain: Domain, info: (host: string | undefined) => z.infer<typeof ServerInfo>, trustProxy: boolean): void {
  app.openapi(serverInfoRoute, (c) => c.json(info(c.req.header("host")), 200));

  app.openapi(
    loginRoute,
    async (c) => {
      const result = await domain.auth.login({
        assertion: /^Bearer +(\S+)$/i.exec(c.req.header("authorization") ?? "")?.[1],
        publicKey: c.req.header("x-public-key"),
        registrationToken: c.req.header("x-registration-token"),
        request: c.req.valid("json"),
        address: clientAddress(c, trustProxy),
      });
      return c.json(result, 200);
    },
    invalid("INVALID_REQUEST"),
  );
}
