import type { AgentConfig } from "../../config/config.ts";
import type { Domain } from "../../domain/index.ts";
import { TELEMETRY_FIELDS, type TelemetryField } from "../../protocol/public.ts";
import type { Caller } from "../caller.ts";

/** A tool an agent runs on the server, always on behalf of the calling device. */
interface DeviceTool {
  description: string;
  parameters: Record<string, unknown>;
  run(domain: Domain, device: string, args: Record<string, unknown>): Promise<unknown>;
}

const NO_PARAMETERS = { type: "object", properties: {}, additionalProperties: false };
const MAX_CONTACTS = 200;

const DEVICE_TOOLS: Record<AgentConfig["tools"][number], DeviceTool> = {
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

export interface ToolDefinition {
  type: "function";
  function: { name: string; description: string; parameters: Record<string, unknown> };
}

/**
 * The tools of `agent` that `caller` can use. Device tools need a calling device: for an
 * application (API key) they are withheld from the model, and refused if it calls one anyway.
 */
export function agentTools(agent: AgentConfig, caller: Caller): ToolDefinition[] {
  if (caller.kind !== "device") return [];
  return agent.tools.map((name) => ({
    type: "function",
    function: { name, description: DEVICE_TOOLS[name].description, parameters: DEVICE_TOOLS[name].parameters },
  }));
}

/** Runs one tool call; the result (or the error) is what the model reads, as JSON text. */
export async function runTool(domain: Domain, agent: AgentConfig, caller: Caller, name: string, argumentsText: string): Promise<string> {
  const tool = (agent.tools as string[]).includes(name) ? DEVICE_TOOLS[name as AgentConfig["tools"][number]] : undefined;
  if (!tool) return JSON.stringify({ error: `no tool named ${name}` });
  if (caller.kind !== "device") return JSON.stringify({ error: "device tools are not available to this caller: it is an application, not a device" });
  let args: Record<string, unknown> = {};
  try {
    const parsed = argumentsText.trim() ? JSON.parse(argumentsText) : {};
    if (parsed && typeof parsed === "object" && !Array.isArray(parsed)) args = parsed as Record<string, unknown>;
  } catch {
    return JSON.stringify({ error: "the arguments are not JSON" });
  }
  try {
    return JSON.stringify(await tool.run(domain, caller.publicKey, args));
  } catch (err) {
    return JSON.stringify({ error: (err as Error).message });
  }
}
