import type { Duplex } from "node:stream";
import type { Logger } from "pino";
import type { OfferedTool } from "./bounds.ts";
import { LineTransport } from "./line-transport.ts";
import { McpToolClient } from "./mcp-client.ts";
import type { ToolOutcome } from "./results.ts";

/** `initialize` must be answered within this (tools.md §1); listing is held to it too. */
export const DEVICE_INIT_TIMEOUT_MS = 5_000;

/**
 * A device's own tools: Perch's MCP client session over the device's service stream 3. It lives
 * as long as the stream; whatever the device does wrong closes the stream (the device loses its
 * tools), never more.
 */
export class DeviceToolSession {
  readonly publicKey: string;
  private readonly mcp: McpToolClient;
  private readonly transport: LineTransport;
  private readonly logger: Logger;
  private closed = false;
  private warned = false;

  constructor(stream: Duplex, o: { publicKey: string; logger: Logger }) {
    this.publicKey = o.publicKey;
    this.logger = o.logger;
    this.transport = new LineTransport(stream);
    this.mcp = new McpToolClient({
      timeoutMs: DEVICE_INIT_TIMEOUT_MS,
      onIgnored: (reasons) => {
        if (this.warned) return;
        this.warned = true;
        this.logger.warn({ peer: this.publicKey, reasons: reasons.slice(0, 8) }, "device tools beyond the bounds are ignored");
      },
      onListed: (tools) => this.logger.debug({ peer: this.publicKey, tools: tools.length }, "device tools listed"),
      onListFailed: (err) => {
        this.logger.info({ peer: this.publicKey, err: err.message }, "device tools could not be listed again; the stream is closed");
        void this.close();
      },
    });
    this.mcp.client.onclose = () => {
      this.closed = true;
      if (this.transport.violation) this.logger.warn({ peer: this.publicKey, reason: this.transport.violation }, "device tool stream closed");
    };
    // The SDK reports transport errors and stray messages here; the transport closes what must be closed.
    this.mcp.client.onerror = () => {};
  }

  /** Initializes and lists; a device that fails either has its stream closed. Never rejects. */
  async start(): Promise<void> {
    try {
      await this.mcp.connect(this.transport);
      this.logger.info({ peer: this.publicKey, tools: this.mcp.tools.length }, "device offers tools");
    } catch (err) {
      this.logger.info({ peer: this.publicKey, err: (err as Error).message }, "device tool session failed; the stream is closed");
      await this.close();
    }
  }

  /** The tools the device offers now; none once the session is closed. */
  get tools(): readonly OfferedTool[] {
    return this.closed ? [] : this.mcp.tools;
  }

  call(name: string, args: Record<string, unknown>, o: { timeoutMs: number; signal: AbortSignal }): Promise<ToolOutcome> {
    return this.mcp.call(name, args, o);
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.mcp.close().catch(() => {});
    await this.transport.close();
  }
}

/** Bus messages stay within 7,000 bytes: the summary keeps what fits, names first. */
const SUMMARY_BUDGET = 6_000;
const SUMMARY_DESCRIPTION = 120;

/** What `perch peers tools` prints: the device's tools now (names, descriptions cut short), or undefined without a session. */
export function toolSummary(session: DeviceToolSession | undefined): { tools: Array<{ name: string; description: string }>; more: number } | undefined {
  if (!session) return undefined;
  const tools: Array<{ name: string; description: string }> = [];
  let bytes = 0;
  for (const t of session.tools) {
    const entry = { name: t.name, description: t.description.length > SUMMARY_DESCRIPTION ? `${t.description.slice(0, SUMMARY_DESCRIPTION)}…` : t.description };
    bytes += Buffer.byteLength(JSON.stringify(entry)) + 1;
    if (bytes > SUMMARY_BUDGET) break;
    tools.push(entry);
  }
  return { tools, more: session.tools.length - tools.length };
}
