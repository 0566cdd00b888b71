import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js";
import pino from "pino";
import { Registry } from "prom-client";
import { MAX_RESPONSE_BYTES } from "../src/mcp/bounded-fetch.ts";
import { ToolMetrics } from "../src/mcp/metrics.ts";
import { cutOutcome } from "../src/mcp/results.ts";
import { McpServers } from "../src/mcp/servers.ts";
import { SdkHttpServer } from "./support/mcp.ts";
import { eventually } from "./support/webrtc.ts";

/**
 * The configured MCP servers of a node (`McpServers`), in process, against real MCP servers (the
 * official SDK over Streamable HTTP): the bounds on what they send, and noticing one gone away.
 */
describe("MCP servers: bounds and presence", () => {
  const open: Array<{ stop(): Promise<void> } | McpServers> = [];
  after(async () => {
    for (const o of open.reverse()) await ("tried" in o ? o.close() : o.stop());
  });

  const servers = async (configs: Array<{ id: string; url: string; timeout_ms?: number; ping_interval_ms?: number }>) => {
    let log = "";
    const registry = new Registry();
    const s = new McpServers(
      configs.map((c) => ({ headers_env: {}, timeout_ms: 5_000, ping_interval_ms: 10_000, ...c })),
      {
        env: {},
        logger: pino(
          { level: "info" },
          {
            write: (line: string) => {
              log += line;
            },
          },
        ),
        metrics: new ToolMetrics(registry),
      },
    );
    open.push(s);
    await s.tried();
    return {
      s,
      up: async (id: string) =>
        /perch_mcp_servers_up\{server="(\w+)"\} (\d)/.exec((await registry.metrics()).split("\n").find((l) => l.includes(`"${id}"`)) ?? "")?.[2],
      log: () => log,
    };
  };
  const call = (s: McpServers, id: string, name: string, args: Record<string, unknown> = {}, timeoutMs = 5_000) =>
    s.call(id, name, args, { timeoutMs, signal: new AbortController().signal });

  /** A server whose `big` tool answers `bytes` of text (and `small` a little). */
  const bigAnswers = (bytes: number) => () => {
    const mcp = new McpServer({ name: "big", version: "1.0.0" });
    mcp.registerTool("big", { description: "A very long answer.", inputSchema: {} }, async () => ({ content: [{ type: "text", text: "x".repeat(bytes) }] }));
    mcp.registerTool("small", { description: "A short answer.", inputSchema: {} }, async () => ({ content: [{ type: "text", text: "small" }] }));
    return mcp;
  };

  for (const json of [false, true]) {
    test(`a tool result over 4 MiB (${json ? "a JSON answer" : "an event stream"}): that call fails, not read further; the server stays up and answers the next`, async () => {
      const server = await new SdkHttpServer(bigAnswers(50 * 1024 * 1024), { json }).start();
      open.push(server);
      const { s, up } = await servers([{ id: "big", url: server.url }]);
      assert.equal(await up("big"), "1");
      const outcome = await call(s, "big", "big");
      assert.equal(outcome.isError, true);
      assert.equal(outcome.unreachable, undefined);
      assert.match(outcome.text, new RegExp(`response is over ${MAX_RESPONSE_BYTES} bytes`));
      assert.ok(outcome.text.length < 1_000);
      assert.equal((await call(s, "big", "small")).text, "small");
      assert.equal(await up("big"), "1");
    });
  }

  test("a result just under 4 MiB is read whole (and cut for the model later, by the agent's tool_result_max_chars)", async () => {
    const server = await new SdkHttpServer(bigAnswers(4 * 1024 * 1024 - 1024)).start();
    open.push(server);
    const { s } = await servers([{ id: "under", url: server.url }]);
    const outcome = await call(s, "under", "big");
    assert.equal(outcome.isError, false);
    assert.equal(outcome.text.length, 4 * 1024 * 1024 - 1024);
    const cut = cutOutcome(outcome, 65_536);
    assert.equal(cut.text, `${"x".repeat(65_536)}\n[the tool's result was cut: the first 65536 of its ${4 * 1024 * 1024 - 1024} characters]`);
  });

  test("a tools/list over 4 MiB: the server's tools are absent (logged) until a later list succeeds", async () => {
    let huge = true;
    const schema = { type: "object", description: "s".repeat(15 * 1024) };
    const server = await new SdkHttpServer(() => {
      const s = new Server({ name: "lister", version: "1.0.0" }, { capabilities: { tools: {} } });
      s.setRequestHandler(ListToolsRequestSchema, async () => ({
        tools: Array.from({ length: huge ? 300 : 2 }, (_, i) => ({ name: `t${i}`, description: "a tool", inputSchema: schema })),
      }));
      s.setRequestHandler(CallToolRequestSchema, async () => ({ content: [{ type: "text", text: "ok" }] }));
      return s;
    }).start();
    open.push(server);
    const { s, up, log } = await servers([{ id: "lister", url: server.url }]);
    assert.deepEqual(s.tools("lister"), []);
    assert.equal(await up("lister"), "0");
    assert.match(log(), /MCP server away: its tools are absent/);
    assert.match(log(), /response is over 4194304 bytes/);
    huge = false;
    // Tried again with back-off (1 s first).
    await eventually(() => s.tools("lister").length === 2, 10_000, "the tools listed again");
    assert.equal(await up("lister"), "1");
  });

  test("a server that went away is noticed with no call made (MCP ping): its tools absent, perch_mcp_servers_up 0; back, they return", async () => {
    const server = await new SdkHttpServer(bigAnswers(10)).start();
    open.push(server);
    const { s, up } = await servers([{ id: "gone", url: server.url, ping_interval_ms: 200 }]);
    assert.deepEqual(
      s.tools("gone").map((t) => t.name),
      ["big", "small"],
    );
    await eventually(() => server.methods.includes("ping"), 5_000, "a ping");
    const port = server.port;
    await server.stop();
    await eventually(() => s.tools("gone").length === 0, 5_000, "the tools absent");
    assert.equal(await up("gone"), "0");
    await server.start(port);
    await eventually(() => s.tools("gone").length === 2, 10_000, "the tools back");
    assert.equal(await up("gone"), "1");
  });

  test("a server that stops answering (the connection taken, no answer) is away once a ping waits its timeout", async () => {
    const server = await new SdkHttpServer(bigAnswers(10)).start();
    open.push(server);
    const { s, up } = await servers([{ id: "mute", url: server.url, ping_interval_ms: 200, timeout_ms: 300 }]);
    assert.equal(s.tools("mute").length, 2);
    server.hang = true;
    await eventually(() => s.tools("mute").length === 0, 5_000, "the tools absent");
    assert.equal(await up("mute"), "0");
  });

  test("calls that time out or are cancelled end their HTTP requests: the server's sockets are freed, the server still answers", async () => {
    const server = await new SdkHttpServer(() => {
      const mcp = new McpServer({ name: "slow", version: "1.0.0" });
      // Takes the call and never answers.
      mcp.registerTool("never", { description: "Never answers.", inputSchema: {} }, () => new Promise(() => {}));
      mcp.registerTool("small", { description: "A short answer.", inputSchema: {} }, async () => ({ content: [{ type: "text", text: "small" }] }));
      return mcp;
    }).start();
    open.push(server);
    const { s } = await servers([{ id: "slow", url: server.url, timeout_ms: 5_000 }]);
    const timedOut = await Promise.all(Array.from({ length: 20 }, () => call(s, "slow", "never", {}, 150)));
    for (const o of timedOut) assert.equal(o.result, "timeout");
    const aborts = Array.from({ length: 10 }, () => new AbortController());
    const cancelled = Promise.all(aborts.map((a) => s.call("slow", "never", {}, { timeoutMs: 5_000, signal: a.signal })));
    await eventually(() => server.methods.filter((m) => m === "tools/call").length >= 30, 5_000, "the cancelled calls taken");
    for (const a of aborts) a.abort(new Error("barge-in"));
    for (const o of await cancelled) assert.equal(o.isError, true);
    // 30 calls the server never answered: their requests are ended, not left holding a socket each.
    let open_ = Number.POSITIVE_INFINITY;
    await eventually(
      async () => {
        open_ = await server.connections();
        return open_ <= 4;
      },
      10_000,
      "the calls' sockets freed",
    ).catch(() => assert.fail(`${open_} sockets still open after 30 calls ended`));
    assert.equal((await call(s, "slow", "small")).text, "small");
  });

  test("cutOutcome: within the bound the outcome itself; beyond, cut on a character boundary with a note", () => {
    const small = { text: "short", isError: false, images: [], result: "ok" as const };
    assert.equal(cutOutcome(small, 5), small);
    const pairs = cutOutcome({ ...small, text: "😀".repeat(10) }, 5);
    assert.equal(pairs.text, `😀😀\n[the tool's result was cut: the first 4 of its 20 characters]`);
    const failed = cutOutcome({ text: "e".repeat(10), isError: true, images: [], result: "error" }, 3);
    assert.equal(failed.isError, true);
    assert.match(failed.text, /^eee\n\[the tool's result was cut/);
  });
});
