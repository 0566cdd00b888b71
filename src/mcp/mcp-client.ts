import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js";
import { ErrorCode, McpError, ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";
import { AjvJsonSchemaValidator } from "@modelcontextprotocol/sdk/validation/ajv-provider.js";
import { z } from "zod";
import { buildInfo } from "../build-info.ts";
import { withRequestAbort } from "./bounded-fetch.ts";
import { acceptTools, MAX_TOOLS, type OfferedTool } from "./bounds.ts";
import { failed, fromCallResult, type ToolOutcome } from "./results.ts";

/** Pages of `tools/list` followed at most (a server that hands out cursors forever stops here). */
const MAX_PAGES = 16;

/** Checked by hand, tool by tool (`bounds.ts`): the SDK's schema would refuse a whole list for one bad tool. */
const ListPage = z.looseObject({ tools: z.unknown(), nextCursor: z.string().max(1024).optional() });
const AnyResult = z.looseObject({});
/** One for every client: each would build its own Ajv otherwise (tens of KB per device session). */
const validator = new AjvJsonSchemaValidator();

export interface McpToolClientOptions {
  /** Connecting and listing wait at most this long. */
  timeoutMs: number;
  /** Tools were ignored (out of the contract's bounds); called once per listing with the reasons. */
  onIgnored(reasons: string[]): void;
  /** The list changed (after a listing); errors of a listing triggered by `list_changed`. */
  onListed?(tools: readonly OfferedTool[]): void;
  onListFailed?(err: Error): void;
}

/**
 * Perch as an MCP client (the SDK's `Client`, capabilities none): initialize, `tools/list` with
 * cursors, listing again on `notifications/tools/list_changed`, and calls with a timeout and an
 * abort signal (which sends `notifications/cancelled`). Requests the server sends to Perch
 * (sampling, roots, elicitation) find no handler: the SDK answers −32601.
 */
export class McpToolClient {
  readonly client: Client;
  private listed: readonly OfferedTool[] = [];
  private listing: Promise<void> | undefined;
  private again = false;
  private readonly o: McpToolClientOptions;

  constructor(o: McpToolClientOptions) {
    this.o = o;
    this.client = new Client({ name: "perch", version: buildInfo().version }, { capabilities: {}, jsonSchemaValidator: validator });
    this.client.setNotificationHandler(ToolListChangedNotificationSchema, () => {
      this.list().catch((err: Error) => this.o.onListFailed?.(err));
    });
  }

  /** Connects over `transport` (initialize within the timeout) and lists the tools. */
  async connect(transport: Transport): Promise<void> {
    await this.client.connect(transport, { timeout: this.o.timeoutMs });
    await this.list();
  }

  /** The tools offered now (within the bounds). */
  get tools(): readonly OfferedTool[] {
    return this.listed;
  }

  /** Lists again; a change announced while a listing runs gets one more listing after it. */
  list(): Promise<void> {
    if (this.listing) {
      this.again = true;
      return this.listing;
    }
    this.listing = (async () => {
      try {
        do {
          this.again = false;
          this.listed = await this.listAll();
          this.o.onListed?.(this.listed);
        } while (this.again);
      } finally {
        this.listing = undefined;
      }
    })();
    return this.listing;
  }

  private async listAll(): Promise<OfferedTool[]> {
    const tools: OfferedTool[] = [];
    const ignored: string[] = [];
    const cursors = new Set<string>();
    let cursor: string | undefined;
    for (let page = 0; page < MAX_PAGES && tools.length < MAX_TOOLS; page++) {
      const res = await withRequestAbort(() =>
        this.client.request({ method: "tools/list", params: cursor === undefined ? {} : { cursor } }, ListPage, {
          timeout: this.o.timeoutMs,
        }),
      );
      ignored.push(...acceptTools(res.tools, tools));
      cursor = res.nextCursor;
      if (cursor === undefined || cursors.has(cursor)) break;
      cursors.add(cursor);
    }
    if (cursor !== undefined && tools.length >= MAX_TOOLS) ignored.push(`more than ${MAX_TOOLS} tools`);
    if (ignored.length) this.o.onIgnored([...new Set(ignored)]);
    return tools;
  }

  /** Calls `name`; a timeout, an abort, an error answer or `isError` all come back as a failed outcome. */
  async call(name: string, args: Record<string, unknown>, o: { timeoutMs: number; signal: AbortSignal }): Promise<ToolOutcome> {
    try {
      const result = await withRequestAbort(() =>
        this.client.request({ method: "tools/call", params: { name, arguments: args } }, AnyResult, {
          timeout: o.timeoutMs,
          signal: o.signal,
        }),
      );
      return fromCallResult(result);
    } catch (err) {
      if (err instanceof McpError && err.code === ErrorCode.RequestTimeout && !o.signal.aborted) {
        return failed(`the tool ${name} did not answer within ${o.timeoutMs} ms`, "timeout");
      }
      // An error answer is the tool's; anything else (a network failure, a closed session) means the server is not there.
      const reached = err instanceof McpError && err.code !== ErrorCode.ConnectionClosed;
      return failed(`the tool ${name} failed: ${(err as Error).message}`, "error", !reached);
    }
  }

  close(): Promise<void> {
    return this.client.close();
  }
}
