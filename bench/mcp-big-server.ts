// A real MCP server (the SDK's, stateless Streamable HTTP) in a process of its own, for `bench/mcp-bounds.ts`:
// its tool `big` answers 50 MB of text; `tools/list` answers 12 MB of tools. Prints its port.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const json = process.argv[2] === "json";
const big = "x".repeat(50 * 1024 * 1024);
const schema = { type: "object", description: "s".repeat(15 * 1024) };
const tools = Array.from({ length: 800 }, (_, i) => ({ name: `t${i}`, description: "a tool", inputSchema: schema }));

const server = http.createServer(async (req, res) => {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  const body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : undefined;
  const mcp = new Server({ name: "big", version: "1.0.0" }, { capabilities: { tools: {} } });
  mcp.setRequestHandler(ListToolsRequestSchema, async () => ({ tools }));
  mcp.setRequestHandler(CallToolRequestSchema, async () => ({ content: [{ type: "text", text: big }] }));
  const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: json });
  res.on("close", () => {
    void transport.close();
    void mcp.close();
  });
  await mcp.connect(transport);
  await transport.handleRequest(req, res, body);
});
server.listen(0, "127.0.0.1", () => process.stdout.write(`${(server.address() as AddressInfo).port}\n`));
