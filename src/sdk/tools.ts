import { McpServer, type RegisteredTool } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";
import { buildInfo } from "../build-info.ts";
import { LineTransport } from "../mcp/line-transport.ts";
import type { StreamSocket } from "../protocol/stream-socket.ts";

/** One function a device offers its agent (tools.md §1). */
export interface DeviceTool {
  /** `^[a-zA-Z0-9_.-]{1,64}$`; the model sees it as `device.<name>`. */
  name: string;
  description: string;
  /** A JSON Schema object for the arguments (at most 16 KiB); the arguments are checked against it before `handler` runs. */
  inputSchema: Record<string, unknown>;
  /** Runs the call: a string is the result's text; a thrown error is a failed call (`isError`) with its message. */
  handler: (args: Record<string, unknown>, signal: AbortSignal) => Promise<string | CallToolResult> | string | CallToolResult;
}

/**
 * A device's tools offered to Perch over service stream 3: the SDK's `McpServer` on the device
 * side, framed one JSON-RPC message per line. Adding or removing a tool later announces
 * `notifications/tools/list_changed`, and Perch lists again.
 */
export class OfferedTools {
  readonly server: McpServer;
  private readonly registered = new Map<string, RegisteredTool>();

  constructor(tools: readonly DeviceTool[]) {
    this.server = new McpServer({ name: "perch-device", version: buildInfo().version }, { capabilities: { tools: { listChanged: true } } });
    for (const t of tools) this.add(t);
  }

  /** Serves on `stream` (an open service 3 stream). */
  async serve(stream: StreamSocket): Promise<void> {
    await this.server.connect(new LineTransport(stream));
  }

  add(tool: DeviceTool): void {
    const registered = this.server.registerTool(
      tool.name,
      { description: tool.description, inputSchema: z.fromJSONSchema(tool.inputSchema as z.core.JSONSchema.JSONSchema) as z.ZodObject },
      async (args: Record<string, unknown>, extra): Promise<CallToolResult> => {
        try {
          const result = await tool.handler(args, extra.signal);
          return typeof result === "string" ? { content: [{ type: "text", text: result }] } : result;
        } catch (err) {
          return { content: [{ type: "text", text: (err as Error).message }], isError: true };
        }
      },
    );
    this.registered.set(tool.name, registered);
  }

  remove(name: string): void {
    this.registered.get(name)?.remove();
    this.registered.delete(name);
  }

  close(): Promise<void> {
    return this.server.close();
  }
}
