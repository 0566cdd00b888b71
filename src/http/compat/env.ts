import type { Caller } from "../../ai/caller.ts";
import type { AppEnv } from "../env.ts";

export interface CompatEnv {
  Variables: AppEnv["Variables"] & { caller: Caller };
}
