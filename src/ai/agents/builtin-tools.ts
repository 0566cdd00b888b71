import type { AGENT_TOOLS } from "../../config/config.ts";
import type { Domain } from "../../domain/index.ts";
import { failed, type ToolOutcome } from "../../mcp/results.ts";
import { TELEMETRY_FIELDS, type TelemetryField } from "../../protocol/public.ts";

/** A built-in tool: it runs on the server, always on behalf of the calling device. */
interface BuiltinTool {
  description: string;
  parameters: Record<string, unknown>;
  run(domain: Domain, device: string, args: Record<string, unknown>): Promise<unknown>;
}

export type BuiltinName = (typeof AGENT_TOOLS)[number];

const NO_PARAMETERS = { type: "object", properties: {}, additionalProperties: false };
const MAX_CONTACTS = 200;

export const BUILTIN_TOOLS: Record<BuiltinName, BuiltinTool> = {
  device_status: {
    description: "The calling device's status document: volume, battery, charging, location and labels it last reported.",
    parameters: NO_PARAMETERS,
    run: (domain, device) => domain.peers.status(device),
  },
  device_runtime: {
    description: "Whether the calling device is connected now, when it was last seen, and its traffic counters.",
    parameters: NO_PARAMETERS,
    run: (domain, device) => domain.peers.runtime(device),
  },
  device_telemetry: {
    description: "The latest value of each telemetry field of the calling device (battery, GNSS, network, system).",
    parameters: {
      type: "object",
      properties: { fields: { type: "array", items: { type: "string", enum: TELEMETRY_FIELDS }, description: "Only these fields; all when omitted" } },
      additionalProperties: false,
    },
    run: (domain, device, args) => {
      const fields = Array.isArray(args.fields) ? args.fields.filter((f): f is TelemetryField => TELEMETRY_FIELDS.includes(f as TelemetryField)) : undefined;
      return domain.telemetry.latest(device, fields);
    },
  },
  contacts_list: {
    description: "The calling device's contacts (name, display name, phone number).",
    parameters: NO_PARAMETERS,
    run: async (domain, device) => (await domain.contacts.list(device, undefined, MAX_CONTACTS)).items,
  },
};

/** Runs a built-in tool for `device`; its result (or error) as JSON text. */
export async function runBuiltin(domain: Domain, name: BuiltinName, device: string, args: Record<string, unknown>): Promise<ToolOutcome> {
  try {
    return { text: JSON.stringify(await BUILTIN_TOOLS[name].run(domain, device, args)), isError: false, images: [], result: "ok" };
  } catch (err) {
    return failed((err as Error).message);
  }
}
