import type { OpenAPIHono } from "@hono/zod-openapi";
import type { Principal } from "../domain/principal.ts";

export interface AppEnv {
  Variables: { principal: Principal; requestId: string };
}

export type App = OpenAPIHono<AppEnv>;
