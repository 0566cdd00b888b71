import type { Logger } from "pino";
import type { Registry } from "prom-client";
import type { AgentConfig, Config, ModelConfig } from "../../config/config.ts";
import { toolPattern } from "../../config/config.ts";
import type { Domain } from "../../domain/index.ts";
import type { OfferedTool } from "../../mcp/bounds.ts";
import type { DeviceToolSession } from "../../mcp/device.ts";
import { ToolMetrics } from "../../mcp/metrics.ts";
import { cutOutcome, failed, type ToolOutcome } from "../../mcp/results.ts";
import { McpServers } from "../../mcp/servers.ts";
import type { ToolCall } from "../../protocol/compat.ts";
import { type Caller, usageWho } from "../caller.ts";
import { BUILTIN_TOOLS, type BuiltinName, runBuiltin } from "./builtin-tools.ts";

export interface ToolDefinition {
  type: "function";
  function: { name: string; description: string; parameters: Record<string, unknown> };
}

/** Sees each tool call of a run as it starts and ends (the voice turn's `tool.call` / `tool.result` events). */
export interface ToolObserver {
  /** Awaited before the tools of a step run; a rejection ends the run and no tool runs (a voice reply prepared ahead and then discarded). */
  ready?(): Promise<void>;
  called(name: string, argumentsText: string): void;
  finished(name: string, outcome: ToolOutcome): void;
}

type Target = { source: "builtin"; name: BuiltinName } | { source: "device"; name: string } | { source: "server"; server: string; name: string };

export interface ToolboxOptions {
  domain: Domain;
  servers: McpServers;
  /** The tools the device with this key offers over its connection on this node. */
  devices: (publicKey: string) => DeviceToolSession | undefined;
  metrics: ToolMetrics;
  providers: Config["providers"];
  models: Config["models"];
}

/**
 * The node's toolbox from the configuration: its MCP servers are connected now (and again with
 * back-off while away); `devices` finds a connected device's tool session on this node.
 */
export function startToolbox(
  config: Config,
  o: { domain: Domain; env: NodeJS.ProcessEnv; logger: Logger; registry: Registry; devices: ToolboxOptions["devices"] },
): Toolbox {
  const metrics = new ToolMetrics(o.registry);
  const servers = new McpServers(config.mcp_servers, { env: o.env, logger: o.logger.child({ component: "tools" }), metrics });
  return new Toolbox({ domain: o.domain, servers, devices: o.devices, metrics, providers: config.providers, models: config.models });
}

const APPLICATION_REFUSAL = "device tools are not available to this caller: it is an application, not a device";

/** `*` as a wildcard within a tool name. */
function nameMatcher(pattern: string): (name: string) => boolean {
  if (!pattern.includes("*")) return (name) => name === pattern;
  const re = new RegExp(
    `^${pattern
      .split("*")
      .map((p) => p.replace(/[.-]/g, "\\$&"))
      .join(".*")}$`,
  );
  return (name) => re.test(name);
}

/**
 * Every tool an agent may reach: the built-ins, the calling device's own tools (service 3, on this
 * node) and the configured MCP servers', chosen by the agent's `tools` patterns.
 */
export class Toolbox {
  readonly o: ToolboxOptions;

  constructor(o: ToolboxOptions) {
    this.o = o;
  }

  close(): Promise<void> {
    return this.o.servers.close();
  }

  /** The tools of one agent run, for this caller and model. */
  forRun(agent: AgentConfig, model: ModelConfig, caller: Caller): ToolKit {
    return new ToolKit(this, agent, caller, this.dotted(model), model.input.includes("image"));
  }

  /** Whether every provider the model may be answered by (its fallbacks too) takes dots in tool names. */
  private dotted(model: ModelConfig): boolean {
    const chain = [model.id, ...model.fallbacks];
    return chain.every((id) => {
      const m = this.o.models.find((x) => x.id === id);
      const p = this.o.providers.find((x) => x.id === m?.provider);
      return p?.dotted_tool_names ?? (p?.kind === "openai-compatible" || p?.kind === "google");
    });
  }
}

/** The tools of one run: offered afresh at each step (a device's list may change), called by the names offered. */
export class ToolKit {
  private readonly box: Toolbox;
  private readonly agent: AgentConfig;
  private readonly caller: Caller;
  private readonly dotted: boolean;
  /** Whether the model takes images (tool results' images reach it; otherwise they are dropped with a note). */
  readonly images: boolean;
  private offered = new Map<string, Target>();

  constructor(box: Toolbox, agent: AgentConfig, caller: Caller, dotted: boolean, images: boolean) {
    this.box = box;
    this.agent = agent;
    this.caller = caller;
    this.dotted = dotted;
    this.images = images;
  }

  private wireName(source: string, name: string): string {
    return this.dotted ? `${source}.${name}` : `${source}__${name.replaceAll(".", "__")}`;
  }

  /** The definitions to offer the model now. Device tools need a calling device; an application gets none. */
  definitions(): ToolDefinition[] {
    const out: ToolDefinition[] = [];
    const offered = new Map<string, Target>();
    const add = (wire: string, target: Target, description: string, parameters: Record<string, unknown>) => {
      if (offered.has(wire)) return; // two names that map to one (a.b and a__b without dots): the first stays
      offered.set(wire, target);
      out.push({ type: "function", function: { name: wire, description, parameters } });
    };
    const device = this.caller.kind === "device" ? this.box.o.devices(this.caller.publicKey) : undefined;
    for (const entry of this.agent.tools) {
      const builtin = BUILTIN_TOOLS[entry as BuiltinName];
      if (builtin) {
        if (this.caller.kind === "device") add(entry, { source: "builtin", name: entry as BuiltinName }, builtin.description, builtin.parameters);
        continue;
      }
      const p = toolPattern(entry);
      if (!p) continue;
      const matches = nameMatcher(p.name);
      const tools: readonly OfferedTool[] = p.source === "device" ? (device?.tools ?? []) : this.box.o.servers.tools(p.source);
      for (const t of tools) {
        if (!matches(t.name)) continue;
        const target: Target = p.source === "device" ? { source: "device", name: t.name } : { source: "server", server: p.source, name: t.name };
        add(this.wireName(p.source, t.name), target, t.description, t.inputSchema);
      }
    }
    this.offered = offered;
    return out;
  }

  /**
   * A tool's name as the configuration and the events say it (`device.set_volume`, `home.light_on`),
   * for a name offered to the model, which may be its provider's form (`device__set_volume`).
   */
  displayName(wire: string): string {
    const t = this.offered.get(wire);
    if (!t) return wire;
    return t.source === "builtin" ? t.name : `${t.source === "server" ? t.server : "device"}.${t.name}`;
  }

  /** Runs one call the model made, by a name offered at the last `definitions()`. Never rejects. */
  async run(call: ToolCall, signal: AbortSignal): Promise<ToolOutcome> {
    const name = call.function.name;
    const target = this.offered.get(name);
    if (!target) {
      const deviceTool = (this.agent.tools.includes(name) && name in BUILTIN_TOOLS) || /^device(\.|__)/.test(name);
      return failed(deviceTool && this.caller.kind !== "device" ? APPLICATION_REFUSAL : `no tool named ${name}`);
    }
    const source = target.source === "server" ? target.server : target.source;
    // Bounded before anything parses them (tools.md §2): a model's huge arguments cost nothing.
    const max = this.agent.tool_arguments_max_chars;
    if (call.function.arguments.length > max) {
      const outcome = failed(`the arguments are over ${max} characters (${call.function.arguments.length}): the call was not run`);
      this.box.o.metrics.call(source, outcome.result, 0);
      return outcome;
    }
    // A limit reached refuses the call before it runs (usage.md §2); each call run is counted.
    const meter = this.box.o.domain.usage.meter;
    const who = usageWho(this.caller);
    const limit = await meter.limitedNow(who, this.agent.id, { requests: false }).catch(() => undefined);
    if (limit) return failed(`the ${limit.per === "day" ? "daily" : "monthly"} ${limit.counter} limit is reached: the tool was not run`);
    meter.record(who, this.agent.id, { tool_calls: 1 });
    const started = performance.now();
    const outcome = await this.dispatch(target, call.function.arguments, signal);
    this.box.o.metrics.call(source, outcome.result, (performance.now() - started) / 1000);
    return target.source === "builtin" ? outcome : cutOutcome(outcome, this.agent.tool_result_max_chars);
  }

  private async dispatch(target: Target, argumentsText: string, signal: AbortSignal): Promise<ToolOutcome> {
    if (this.caller.kind !== "device" && target.source !== "server") {
      return failed(APPLICATION_REFUSAL);
    }
    let args: Record<string, unknown>;
    try {
      const parsed: unknown = argumentsText.trim() ? JSON.parse(argumentsText) : {};
      if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) return failed("the arguments are not a JSON object");
      args = parsed as Record<string, unknown>;
    } catch {
      return failed("the arguments are not JSON");
    }
    const o = { timeoutMs: this.agent.tool_timeout_ms, signal };
    if (target.source === "server") return this.box.o.servers.call(target.server, target.name, args, o);
    const device = (this.caller as Extract<Caller, { kind: "device" }>).publicKey;
    if (target.source === "builtin") return runBuiltin(this.box.o.domain, target.name, device, args);
    const session = this.box.o.devices(device);
    if (!session) return failed("the device is no longer connected", "error", true);
    return session.call(target.name, args, o);
  }
}

/** What the model reads for an outcome: the text, or `{"error": …}` for a failed call; images it cannot take are named. */
export function toolMessageText(outcome: ToolOutcome, imagesAccepted: boolean): string {
  let text = outcome.text;
  if (outcome.images.length && !imagesAccepted) text += `${text ? "\n" : ""}[${outcome.images.length} image(s) omitted: this model does not take images]`;
  return outcome.isError ? JSON.stringify({ error: text }) : text;
}
