import { createRoute, type z } from "@hono/zod-openapi";
import type { Domain } from "../../domain/index.ts";
import { LoginHeaders, type LoginRequest, LoginRequest as LoginRequestSchema, LoginResult, ServerInfo } from "../../protocol/public.ts";
import type { App } from "../env.ts";
import { ApiError, invalid } from "../errors.ts";
import { requestHeader } from "../headers.ts";
import { JSON_UTF8 } from "../json.ts";
import { bearerToken, type Callers } from "../principal.ts";
import { jsonBodyLimit } from "./limits.ts";
import { errors, json } from "./responses.ts";

const serverInfoRoute = createRoute({
  method: "get",
  path: "/server-info",
  tags: ["server"],
  summary: "The server's public key, time, endpoint and ICE settings",
  middleware: jsonBodyLimit,
  responses: { 200: json(ServerInfo, "Server information") },
});

const loginRoute = createRoute({
  method: "post",
  path: "/login",
  tags: ["session"],
  summary: "Log in with an X25519-HS256 assertion: a primary session, or a Side Control session for a device token",
  middleware: jsonBodyLimit,
  request: {
    // Documented here; checked by the domain so that each failure gets its own contract code.
    headers: LoginHeaders.partial(),
    // A reference, not the schema itself: the handler validates, because an empty body of any
    // Content-Type is the primary grant, which the generic JSON validator would refuse.
    body: { required: false, content: { "application/json": { schema: { $ref: "#/components/schemas/LoginRequest" } } } },
  },
  responses: { 200: json(LoginResult, "A new session"), ...errors(400, 401, 403, 413, 429) },
});

/** Whether an HTTP/1.1 request has a body at all (reading an absent one still costs a stream). */
function hasBody(contentLength: string | undefined, transferEncoding: string | undefined): boolean {
  return transferEncoding !== undefined || (contentLength !== undefined && contentLength !== "0");
}

/** The login body: empty means `{}`; anything else must be JSON that `LoginRequest` accepts. */
function loginRequest(text: string): LoginRequest {
  let value: unknown = {};
  if (text.trim() !== "") {
    try {
      value = JSON.parse(text);
    } catch {
      throw new ApiError(400, "INVALID_REQUEST", "the body is not JSON");
    }
  }
  const parsed = LoginRequestSchema.safeParse(value);
  if (!parsed.success) invalid("INVALID_REQUEST")(parsed);
  return parsed.data as LoginRequest;
}

export function registerServerRoutes(app: App, domain: Domain, callers: Callers, info: (host: string | undefined) => z.infer<typeof ServerInfo>): void {
  app.openAPIRegistry.register("LoginRequest", LoginRequestSchema);
  app.openapi(serverInfoRoute, (c) => c.json(info(requestHeader(c, "host")), 200, JSON_UTF8));

  app.openapi(loginRoute, async (c) => {
    const result = await domain.auth.login({
      assertion: bearerToken(requestHeader(c, "authorization")),
      publicKey: requestHeader(c, "x-public-key"),
      registrationToken: requestHeader(c, "x-registration-token"),
      request: loginRequest(hasBody(requestHeader(c, "content-length"), requestHeader(c, "transfer-encoding")) ? await c.req.text() : ""),
      address: callers.address(c),
    });
    return c.json(result, 200, JSON_UTF8);
  });
}
