import type { Who } from "../domain/usage-meter.ts";

/** Who asks for a generation: a device (its session or its connection) or an application (an operator API key). */
export type Caller = { kind: "device"; publicKey: string } | { kind: "application"; name: string; models: readonly string[] };

/** Whether `caller` may use the model or agent `id`. */
export function mayUse(caller: Caller, id: string): boolean {
  return caller.kind === "device" || caller.models.includes("*") || caller.models.includes(id);
}

/** One key per caller, for sharing the embedded engines fairly among callers. */
export function callerKey(caller: Caller): string {
  return caller.kind === "device" ? `device:${caller.publicKey}` : `application:${caller.name}`;
}

/** The caller as usage is counted and limited (usage.md §1): a device by its key, an application by its API key's name. */
export function usageWho(caller: Caller): Who {
  return caller.kind === "device" ? { id: `device:${caller.publicKey}`, device: caller.publicKey } : { id: `api_key:${caller.name}`, apiKey: caller.name };
}
