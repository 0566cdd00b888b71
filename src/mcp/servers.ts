import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ErrorCode, McpError } from "@modelcontextprotocol/sdk/types.js";
import type { Logger } from "pino";
import type { McpServerConfig } from "../config/config.ts";
import { boundedFetch, withRequestAbort } from "./bounded-fetch.ts";
import type { OfferedTool } from "./bounds.ts";
import { McpToolClient } from "./mcp-client.ts";
import type { ToolMetrics } from "./metrics.ts";
import { failed, type ToolOutcome } from "./results.ts";

const FIRST_RETRY_MS = 1_000;
const MAX_RETRY_MS = 60_000;
/** A ping waits at most this (or the server's `timeout_ms`, when shorter): with the interval's 20 s at most, away is noticed within 30 s. */
const MAX_PING_WAIT_MS = 10_000;

/**
 * One configured MCP server over Streamable HTTP (the SDK's client transport, each response read
 * up to 4 MiB). Connected at start-up and, whenever it fails, again with back-off; while it is
 * away its tools are absent. Away is a failed connect, list, ping (every `ping_interval_ms`, so
 * that a server gone quiet is noticed with no call made) or a call that could not reach it.
 */
class McpServerLink {
  readonly config: McpServerConfig;
  private mcp: McpToolClient | undefined;
  private up = false;
  private closed = false;
  private retryMs = FIRST_RETRY_MS;
  private timer: NodeJS.Timeout | undefined;
  private pinger: NodeJS.Timeout | undefined;
  private pinging = false;
  private readonly headers: Record<string, string>;
  private readonly logger: Logger;
  private readonly metrics: ToolMetrics;
  /** Resolves after the first attempt to connect, whatever its outcome (tests and start-up wait on it). */
  readonly firstAttempt: Promise<void>;

  constructor(config: McpServerConfig, o: { env: NodeJS.ProcessEnv; logger: Logger; metrics: ToolMetrics }) {
    this.config = config;
    this.logger = o.logger.child({ mcp_server: config.id });
    this.metrics = o.metrics;
    this.headers = {};
    for (const [header, variable] of Object.entries(config.headers_env)) {
      const value = o.env[variable];
      if (value === undefined || value === "") this.logger.warn({ header, variable }, "the environment variable of an MCP server header is not set");
      else this.headers[header] = value;
    }
    this.metrics.serverUp(config.id, false);
    this.firstAttempt = this.connect();
  }

  get tools(): readonly OfferedTool[] {
    return this.up && this.mcp ? this.mcp.tools : [];
  }

  private async connect(): Promise<void> {
    if (this.closed) return;
    const mcp = new McpToolClient({
      timeoutMs: this.config.timeout_ms,
      onIgnored: (reasons) => this.logger.warn({ reasons: reasons.slice(0, 8) }, "MCP server tools beyond the bounds are ignored"),
      onListFailed: (err) => this.away(mcp, err),
    });
    mcp.client.onerror = () => {};
    this.mcp = mcp;
    try {
      await mcp.connect(new StreamableHTTPClientTransport(new URL(this.config.url), { requestInit: { headers: this.headers }, fetch: boundedFetch() }));
      if (this.closed || this.mcp !== mcp) {
        await mcp.close().catch(() => {});
        return;
      }
      this.up = true;
      this.retryMs = FIRST_RETRY_MS;
      this.metrics.serverUp(this.config.id, true);
      this.logger.info({ tools: mcp.tools.length }, "MCP server connected");
      this.pinger = setInterval(() => void this.ping(mcp), this.config.ping_interval_ms);
      this.pinger.unref();
    } catch (err) {
      this.away(mcp, err as Error);
    }
  }

  /** Asks the server whether it is there; no answer in time, or no server, is away. An error answer is a server that is there. */
  private async ping(mcp: McpToolClient): Promise<void> {
    if (this.pinging) return;
    this.pinging = true;
    try {
      await withRequestAbort(() => mcp.client.ping({ timeout: Math.min(this.config.timeout_ms, MAX_PING_WAIT_MS) }));
    } catch (err) {
      const there = err instanceof McpError && err.code !== ErrorCode.ConnectionClosed && err.code !== ErrorCode.RequestTimeout;
      if (!there) this.away(mcp, err as Error);
    } finally {
      this.pinging = false;
    }
  }

  /** The server failed: its tools are absent until a later attempt connects again. */
  private away(mcp: McpToolClient, err: Error): void {
    if (this.closed || this.mcp !== mcp) return;
    this.up = false;
    this.mcp = undefined;
    if (this.pinger) clearInterval(this.pinger);
    this.pinger = undefined;
    this.metrics.serverUp(this.config.id, false);
    void mcp.close().catch(() => {});
    const wait = this.retryMs / 2 + Math.random() * (this.retryMs / 2);
    this.retryMs = Math.min(MAX_RETRY_MS, this.retryMs * 2);
    this.logger.warn({ err: err.message, retry_ms: Math.round(wait) }, "MCP server away: its tools are absent");
    this.timer = setTimeout(() => void this.connect(), wait);
    this.timer.unref();
  }

  async call(name: string, args: Record<string, unknown>, o: { timeoutMs: number; signal: AbortSignal }): Promise<ToolOutcome> {
    const mcp = this.mcp;
    if (!this.up || !mcp) return failed(`the MCP server ${this.config.id} is away`, "error", true);
    const outcome = await mcp.call(name, args, { ...o, timeoutMs: Math.min(o.timeoutMs, this.config.timeout_ms) });
    if (!outcome.unreachable || o.signal.aborted) return outcome;
    this.away(mcp, new Error(outcome.text));
    return { ...outcome, text: `the MCP server ${this.config.id} is away: ${outcome.text}` };
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    if (this.pinger) clearInterval(this.pinger);
    this.up = false;
    await this.mcp?.close().catch(() => {});
    this.mcp = undefined;
  }
}

/** The configured MCP servers (`mcp_servers`) of this node. */
export class McpServers {
  private readonly links = new Map<string, McpServerLink>();

  constructor(configs: readonly McpServerConfig[], o: { env: NodeJS.ProcessEnv; logger: Logger; metrics: ToolMetrics }) {
    for (const c of configs) this.links.set(c.id, new McpServerLink(c, o));
  }

  /** Resolves once every server has been tried once. */
  async tried(): Promise<void> {
    await Promise.all([...this.links.values()].map((l) => l.firstAttempt));
  }

  /** The tools server `id` offers now; none while it is away. */
  tools(id: string): readonly OfferedTool[] {
    return this.links.get(id)?.tools ?? [];
  }

  call(id: string, name: string, args: Record<string, unknown>, o: { timeoutMs: number; signal: AbortSignal }): Promise<ToolOutcome> {
    const link = this.links.get(id);
    return link ? link.call(name, args, o) : Promise.resolve(failed(`no MCP server ${id}`));
  }

  async close(): Promise<void> {
    await Promise.all([...this.links.values()].map((l) => l.close()));
  }
}
