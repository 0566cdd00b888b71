import type { IncomingMessage, ServerResponse } from "node:http";
import type { OpenAPIHono } from "@hono/zod-openapi";
import type { Principal } from "../domain/principal.ts";
import type { ConnectionContext } from "./connection.ts";
import type { Exchange } from "./exchange.ts";

/** What the server hands the app with each request (all absent when the app is called with a bare `Request`). */
export interface AppBindings {
  /** The Node request and response, from `@hono/node-server`. */
  incoming?: IncomingMessage;
  outgoing?: ServerResponse;
  /** The connection's context when the caller passes it directly (`app.fetch(request, { connection })`). */
  connection?: ConnectionContext;
  /** The request as the exchange knows it (exchange.ts). */
  exchange?: Exchange;
  /** A chunked body the body limit read whole (`bodyWithinLimit`). */
  body?: Buffer;
}

export interface AppEnv {
  Bindings: AppBindings;
  Variables: { principal: Principal; requestId: string; clientAddress: string };
}

export type App = OpenAPIHono<AppEnv>;
