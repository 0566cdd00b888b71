import http from "node:http";
import type { AddressInfo } from "node:net";
import type { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { z } from "zod";
import type { StreamSocket } from "../../src/protocol/stream-socket.ts";

/**
 * A real MCP server over stateless Streamable HTTP on 127.0.0.1 (the SDK's transport), each request
 * served by a server `build` makes (the SDK's `McpServer` or its low-level `Server`); answers as
 * an event stream, or as JSON with `json`. `hang`: requests are taken and never answered.
 */
export class SdkHttpServer {
  url = "";
  port = 0;
  hang = false;
  /** Requests by JSON-RPC method. */
  readonly methods: string[] = [];
  private server: http.Server | undefined;
  private readonly build: (req: http.IncomingMessage) => McpServer | Server;
  private readonly json: boolean;

  /** `build` makes the server of one request (it may look at the request). */
  constructor(build: (req: http.IncomingMessage) => McpServer | Server, o: { json?: boolean } = {}) {
    this.build = build;
    this.json = o.json ?? false;
  }

  async start(port = 0): Promise<this> {
    this.server = http.createServer((req, res) => void this.handle(req, res));
    await new Promise<void>((resolve) => this.server!.listen(port, "127.0.0.1", resolve));
    this.port = (this.server.address() as AddressInfo).port;
    this.url = `http://127.0.0.1:${this.port}/mcp`;
    return this;
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : undefined;
    if (body?.method) this.methods.push(body.method);
    if (this.hang) return;
    const mcp = this.build(req);
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: this.json });
    res.on("close", () => {
      void transport.close();
      void mcp.close();
    });
    await mcp.connect(transport);
    await transport.handleRequest(req, res, body);
  }

  /** TCP connections open now (from any client). */
  connections(): Promise<number> {
    return new Promise((resolve, reject) => this.server!.getConnections((err, n) => (err ? reject(err) : resolve(n))));
  }

  async stop(): Promise<void> {
    const s = this.server;
    this.server = undefined;
    if (!s) return;
    s.closeAllConnections();
    await new Promise((resolve) => s.close(resolve));
  }
}

/** A real MCP server (the SDK's `McpServer`, stateless Streamable HTTP) on 127.0.0.1 offering `today`, `alerts` and `history`. */
export class WeatherServer extends SdkHttpServer {
  /** The `Authorization` header of each request. */
  readonly authorizations: Array<string | undefined>;
  readonly calls: Array<{ name: string; args: unknown }>;

  constructor() {
    const authorizations: Array<string | undefined> = [];
    const calls: Array<{ name: string; args: unknown }> = [];
    super((req) => {
      authorizations.push(req.headers.authorization);
      const mcp = new McpServer({ name: "weather", version: "1.0.0" });
      mcp.registerTool("today", { description: "Today's weather in a city.", inputSchema: { city: z.string() } }, async ({ city }) => {
        calls.push({ name: "today", args: { city } });
        return { content: [{ type: "text", text: `Sunny and 21 °C in ${city}.` }] };
      });
      mcp.registerTool("alerts", { description: "Weather alerts.", inputSchema: {} }, async () => ({ content: [{ type: "text", text: "none" }] }));
      mcp.registerTool("history", { description: "The weather of each past day: a long text.", inputSchema: { days: z.number() } }, async ({ days }) => ({
        content: [{ type: "text", text: "sunny;".repeat(days) }],
      }));
      return mcp;
    });
    this.authorizations = authorizations;
    this.calls = calls;
  }
}

/**
 * A device's service stream 3 driven by hand (no SDK): the test reads Perch's JSON-RPC lines and
 * writes whatever it likes back, well-formed or not.
 */
export class RawToolStream {
  readonly received: any[] = [];
  private buffer = "";
  private waiters: Array<() => void> = [];
  closed = false;
  readonly stream: StreamSocket;

  constructor(stream: StreamSocket) {
    this.stream = stream;
    stream.on("data", (c: Buffer) => {
      this.buffer += c.toString();
      let nl = this.buffer.indexOf("\n");
      while (nl !== -1) {
        this.received.push(JSON.parse(this.buffer.slice(0, nl)));
        this.buffer = this.buffer.slice(nl + 1);
        nl = this.buffer.indexOf("\n");
      }
      for (const w of this.waiters.splice(0)) w();
    });
    stream.on("close", () => {
      this.closed = true;
      for (const w of this.waiters.splice(0)) w();
    });
    stream.on("error", () => {});
  }

  /** The next message from Perch matching `pick` (waits for it). */
  async next(pick: (m: any) => boolean, ms = 10_000): Promise<any> {
    const until = Date.now() + ms;
    for (;;) {
      const found = this.received.find(pick);
      if (found) {
        this.received.splice(this.received.indexOf(found), 1);
        return found;
      }
      if (this.closed) throw new Error("the stream closed");
      if (Date.now() > until) throw new Error("no such message from Perch");
      await new Promise<void>((resolve) => {
        this.waiters.push(resolve);
        setTimeout(resolve, 100);
      });
    }
  }

  request(method: string): Promise<any> {
    return this.next((m) => m.method === method && m.id !== undefined);
  }

  send(message: unknown): void {
    this.write(`${JSON.stringify(message)}\n`);
  }

  write(text: string | Buffer): void {
    this.stream.write(text);
  }

  /** Answers `initialize` (with the tools capability) and takes `notifications/initialized`. */
  async initialize(): Promise<void> {
    const init = await this.request("initialize");
    this.send({
      jsonrpc: "2.0",
      id: init.id,
      result: { protocolVersion: init.params.protocolVersion, capabilities: { tools: { listChanged: true } }, serverInfo: { name: "raw", version: "0" } },
    });
    await this.next((m) => m.method === "notifications/initialized");
  }

  /** Answers the next `tools/list` with `tools` (and `nextCursor`). */
  async list(tools: unknown[], nextCursor?: string): Promise<any> {
    const req = await this.request("tools/list");
    this.send({ jsonrpc: "2.0", id: req.id, result: { tools, ...(nextCursor ? { nextCursor } : {}) } });
    return req;
  }

  /** Resolves once the stream is closed (by Perch). */
  async whenClosed(ms = 10_000): Promise<void> {
    const until = Date.now() + ms;
    while (!this.closed) {
      if (Date.now() > until) throw new Error("the stream stayed open");
      await new Promise((r) => setTimeout(r, 25));
    }
  }
}

export const tool = (name: string, extra: Record<string, unknown> = {}) => ({
  name,
  description: `the ${name} tool`,
  inputSchema: { type: "object", properties: {} },
  ...extra,
});
