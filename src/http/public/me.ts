import { createRoute, z } from "@hono/zod-openapi";
import type { Domain } from "../../domain/index.ts";
import type { PrimaryPrincipal } from "../../domain/principal.ts";
import { DeviceToken, PeerSelf, PeerStatus, Runtime, SideControlSessionList, UsageView } from "../../protocol/public.ts";
import type { App } from "../env.ts";
import { invalid } from "../errors.ts";
import { JSON_UTF8, writeJson } from "../json.ts";
import { requireJson } from "../middleware.ts";
import { type NativeRoute, nativeRoute } from "../native.ts";
import type { Callers } from "../principal.ts";
import { jsonBodyLimit } from "./limits.ts";
import { bearerSecurity, errors, json, jsonBody, noContent } from "./responses.ts";

/** The `/me*` routes: a primary session acting on its own peer. Returns its native routes (`GET /me/status`). */
export function registerMeRoutes(app: App, domain: Domain, callers: Callers): NativeRoute[] {
  const primary = callers.require("primary");
  const route = <P extends string, M extends "get" | "put" | "post" | "delete">(method: M, path: P) => ({
    method,
    path,
    tags: ["me"],
    security: bearerSecurity,
    middleware: [jsonBodyLimit, primary],
  });
  const authErrors = errors(401, 403, 503);
  const self = (c: { get(key: "principal"): unknown }) => (c.get("principal") as PrimaryPrincipal).publicKey;

  app.openapi(
    createRoute({
      ...route("get", "/me"),
      summary: "The caller's registration",
      responses: { 200: json(PeerSelf, "The caller"), ...authErrors, ...errors(404) },
    }),
    async (c) => c.json(await domain.peers.self(self(c)), 200, JSON_UTF8),
  );

  // The route devices poll most, served on Node's request and response (native.ts): its only
  // handler, declared from its route object like its siblings. The document as stored, unparsed.
  const status = nativeRoute(
    createRoute({
      ...route("get", "/me/status"),
      summary: "The caller's status document ({} when none)",
      responses: { 200: json(PeerStatus, "Status"), ...authErrors },
    }),
    (x) => domain.peers.statusText((x.principal as PrimaryPrincipal).publicKey).then((text) => writeJson(x, 200, text)),
  );

  app.openapi(
    createRoute({
      ...route("put", "/me/status"),
      middleware: [jsonBodyLimit, primary, requireJson],
      summary: "Replace the caller's status document",
      request: { body: jsonBody(PeerStatus) },
      responses: { 200: json(PeerStatus, "The stored status"), ...authErrors, ...errors(400, 413, 415) },
    }),
    async (c) => c.json(await domain.peers.putStatus(self(c), c.req.valid("json")), 200, JSON_UTF8),
    invalid("INVALID_STATUS"),
  );

  app.openapi(
    createRoute({
      ...route("get", "/me/runtime"),
      summary: "Whether and where the caller is connected",
      responses: { 200: json(Runtime, "Runtime"), ...authErrors },
    }),
    async (c) => c.json(await domain.peers.runtime(self(c)), 200, JSON_UTF8),
  );

  app.openapi(
    createRoute({
      ...route("get", "/me/usage"),
      summary: "What the caller used today and this month (UTC), against its limits, and whether a limit refuses its work now",
      responses: { 200: json(UsageView, "Usage"), ...authErrors },
    }),
    async (c) => c.json(await domain.usage.view(self(c)), 200, JSON_UTF8),
  );

  app.openapi(
    createRoute({
      ...route("post", "/me/side-control/device-tokens"),
      summary: "Issue a single-use device token (5 minutes) for a Side Control login",
      responses: { 201: json(DeviceToken, "A new device token"), ...authErrors, ...errors(409, 429) },
    }),
    async (c) => c.json(await domain.sideControl.createDeviceToken(self(c)), 201, JSON_UTF8),
  );

  app.openapi(
    createRoute({
      ...route("delete", "/me/side-control/device-tokens/{tokenId}"),
      summary: "Withdraw an unused device token",
      request: { params: z.object({ tokenId: z.string() }) },
      responses: { 204: noContent, ...authErrors, ...errors(404) },
    }),
    async (c) => {
      await domain.sideControl.revokeDeviceToken(self(c), c.req.valid("param").tokenId);
      return c.body(null, 204);
    },
  );

  app.openapi(
    createRoute({
      ...route("get", "/me/side-control/sessions"),
      summary: "Live Side Control sessions aimed at the caller, newest first",
      responses: { 200: json(SideControlSessionList, "Sessions"), ...authErrors },
    }),
    async (c) => c.json(await domain.sideControl.listSessions(self(c)), 200, JSON_UTF8),
  );

  app.openapi(
    createRoute({
      ...route("delete", "/me/side-control/sessions/{sessionId}"),
      summary: "Revoke a Side Control session at once",
      request: { params: z.object({ sessionId: z.string() }) },
      responses: { 204: noContent, ...authErrors, ...errors(404) },
    }),
    async (c) => {
      await domain.sideControl.revokeSession(self(c), c.req.valid("param").sessionId);
      return c.body(null, 204);
    },
  );

  return [status];
}
