import type { Context } from "hono";
import type { Caller } from "../../ai/caller.ts";
import type { AppEnv } from "../env.ts";

export type CompatEnv = AppEnv;

/** The caller the surface's gate admitted (`CompatGate`), which runs before every route of the surface. */
export function callerOf(c: Context<CompatEnv>): Caller {
  const caller = c.env.exchange?.caller;
  if (!caller) throw new Error("the Compatible API's routes run behind its gate (compat/surface.ts)");
  return caller;
}
