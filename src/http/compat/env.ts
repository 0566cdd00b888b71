import type { Caller } from "../../ai/caller.ts";
import type { AppEnv } from "../env.ts";

export interface CompatEnv {
  Bindings: AppEnv["Bindings"];
  Variables: AppEnv["Variables"] & { caller: Caller };
}
