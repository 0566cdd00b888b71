import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import pino from "pino";
import { Registry } from "prom-client";
import { z } from "zod";
import { Toolbox, toolMessageText } from "../src/ai/agents/toolbox.ts";
import { loadConfig } from "../src/config/config.ts";
import { acceptTools, type OfferedTool } from "../src/mcp/bounds.ts";
import { ToolMetrics } from "../src/mcp/metrics.ts";
import { fromCallResult } from "../src/mcp/results.ts";
import { McpServers } from "../src/mcp/servers.ts";
import type { VoiceEvents } from "../src/voice/peer-events.ts";
import { toolEvents } from "../src/voice/tool-events.ts";
import { SdkHttpServer } from "./support/mcp.ts";
import { startTestNode } from "./support/server.ts";

/** In process, no network: what the tool results and the voice events carry. */
describe("tools, fast", () => {
  test("tool.call and tool.result events: arguments as JSON (or their text), the result's text cut at 4 KiB on a character boundary", () => {
    const sent: Array<[string, string, string]> = [];
    const events = { done: (stream: string, label: string, text: string) => sent.push([stream, label, text]) } as unknown as VoiceEvents;
    const observer = toolEvents(events, "out-7");
    observer.called("device.set_volume", '{"level":3}');
    observer.called("device.x", "not json");
    observer.finished("device.set_volume", { text: "é".repeat(3000), isError: false, images: [], result: "ok" });
    assert.deepEqual(sent[0], ["out-7", "tool.call", '{"name":"device.set_volume","arguments":{"level":3}}']);
    assert.deepEqual(JSON.parse(sent[1]![2]), { name: "device.x", arguments: "not json" });
    const result = JSON.parse(sent[2]![2]) as { text: string; is_error: boolean };
    assert.equal(sent[2]![1], "tool.result");
    assert.equal(result.is_error, false);
    assert.equal(Buffer.byteLength(result.text), 4096);
    assert.equal(result.text, "é".repeat(2048));
  });

  test("call results: text joined, images kept aside, other items named, isError a failed call; images a model cannot take are noted", () => {
    const r = fromCallResult({
      content: [
        { type: "text", text: "one" },
        { type: "image", data: "AAAA", mimeType: "image/png" },
        { type: "audio", data: "BBBB", mimeType: "audio/wav" },
        { type: "text", text: "two" },
      ],
    });
    assert.equal(r.text, "one\n[audio content omitted]\ntwo");
    assert.deepEqual(r.images, [{ mimeType: "image/png", data: "AAAA" }]);
    assert.equal(toolMessageText(r, true), "one\n[audio content omitted]\ntwo");
    assert.match(toolMessageText(r, false), /\[1 image\(s\) omitted: this model does not take images\]$/);
    const failed = fromCallResult({ content: [{ type: "text", text: "no such room" }], isError: true });
    assert.equal(failed.result, "error");
    assert.equal(toolMessageText(failed, false), '{"error":"no such room"}');
    assert.equal(fromCallResult("garbage").text, "");
  });

  test("bounds: 128 tools at most, and across pages", () => {
    const into: OfferedTool[] = [];
    const page = (from: number, n: number) => Array.from({ length: n }, (_, i) => ({ name: `t${from + i}`, inputSchema: { type: "object" } }));
    assert.deepEqual(acceptTools(page(0, 100), into), []);
    assert.deepEqual(acceptTools(page(100, 100), into), ["more than 128 tools"]);
    assert.equal(into.length, 128);
    assert.equal(into.at(-1)!.name, "t127");
    assert.deepEqual(acceptTools({}, into), ["tools is not an array"]);
  });
});

/** The configured MCP server `home` at `url`, as a node connects it, with its tool metrics. */
function homeServers(url: string): { metrics: ToolMetrics; servers: McpServers } {
  const metrics = new ToolMetrics(new Registry());
  const servers = new McpServers([{ id: "home", url, headers_env: {}, timeout_ms: 5_000, ping_interval_ms: 10_000 }], {
    env: {},
    logger: pino({ level: "silent" }),
    metrics,
  });
  return { metrics, servers };
}

describe("a model's tool arguments are bounded before anything parses them (tools.md §2)", () => {
  test("arguments over the agent's tool_arguments_max_chars: not parsed, not run, a tool error saying so; within it the call runs", async () => {
    const server = await new SdkHttpServer(() => {
      const mcp = new McpServer({ name: "echo", version: "1.0.0" });
      mcp.registerTool("echo", { description: "Echoes.", inputSchema: { text: z.string() } }, async ({ text }) => ({ content: [{ type: "text", text }] }));
      return mcp;
    }).start();
    const node = await startTestNode();
    const { metrics, servers } = homeServers(server.url);
    try {
      await servers.tried();
      const config = loadConfig({}, {
        providers: [{ id: "p", kind: "openai-compatible", base_url: "http://127.0.0.1:9/v1" }],
        models: [{ id: "m", kind: "chat", provider: "p", upstream_model: "m" }],
        mcp_servers: [{ id: "home", url: server.url }],
        agents: [{ id: "a", model: "m", tools: ["home.*"], tool_arguments_max_chars: 100 }],
      } as never);
      // A server tool for an application caller (the node's domain counts the call).
      const box = new Toolbox({ domain: node.domain, servers, devices: () => undefined, metrics, providers: config.providers, models: config.models });
      const kit = box.forRun(config.agents[0]!, config.models[0]!, { kind: "application", name: "k", models: [] });
      assert.deepEqual(
        kit.definitions().map((d) => d.function.name),
        ["home.echo"],
      );
      const run = (args: string) => kit.run({ id: "c1", type: "function", function: { name: "home.echo", arguments: args } }, new AbortController().signal);
      const calls = () => server.methods.filter((m) => m === "tools/call").length;
      const ok = await run(JSON.stringify({ text: "x".repeat(80) }));
      assert.equal(ok.isError, false);
      assert.equal(calls(), 1);
      // Over the bound, and not even JSON: refused by its length, never parsed.
      const huge = `{"text":"${"y".repeat(150)}`;
      const refused = await run(huge);
      assert.equal(refused.isError, true);
      assert.match(refused.text, /arguments are over 100 characters \(159\): the call was not run/);
      assert.equal(calls(), 1, "the server got no call");
      // The voice turn's tool.call event shows long arguments as text cut at 4 KiB, unparsed.
      const sent: string[] = [];
      toolEvents({ done: (_s: string, _l: string, text: string) => sent.push(text) } as unknown as VoiceEvents, "out-1").called(
        "home.echo",
        JSON.stringify({ text: "z".repeat(1_000_000) }),
      );
      const shown = JSON.parse(sent[0]!) as { arguments: unknown };
      assert.equal(typeof shown.arguments, "string");
      assert.equal((shown.arguments as string).length, 4096);
    } finally {
      await servers.close();
      await server.stop();
      await node.stop();
    }
  });
});

describe("the agent's tool gate, in process", () => {
  test("only what the agent's patterns name is offered and run; a name not offered, or a device's tool for an application, is refused and reaches nobody", async () => {
    const server = await new SdkHttpServer(() => {
      const mcp = new McpServer({ name: "home", version: "1.0.0" });
      mcp.registerTool("echo", { description: "Echoes.", inputSchema: { text: z.string() } }, async ({ text }) => ({ content: [{ type: "text", text }] }));
      mcp.registerTool("secret", { description: "Not for this agent.", inputSchema: {} }, async () => ({ content: [{ type: "text", text: "leaked" }] }));
      return mcp;
    }).start();
    const node = await startTestNode();
    const { metrics, servers } = homeServers(server.url);
    // The calling device's own tools, as its session on this node lists them (the device is outside).
    const deviceCalls: string[] = [];
    const deviceTools: OfferedTool[] = ["set_volume", "set_light", "reboot"].map((name) => ({ name, description: name, inputSchema: { type: "object" } }));
    const session = {
      tools: deviceTools,
      call: async (name: string) => {
        deviceCalls.push(name);
        return { text: "done", isError: false, images: [], result: "ok" as const };
      },
    };
    try {
      await servers.tried();
      const config = loadConfig({}, {
        providers: [{ id: "p", kind: "openai-compatible", base_url: "http://127.0.0.1:9/v1" }],
        models: [{ id: "m", kind: "chat", provider: "p", upstream_model: "m" }],
        mcp_servers: [{ id: "home", url: server.url }],
        agents: [{ id: "a", model: "m", tools: ["device.set_*", "home.echo", "device_status"] }],
      } as never);
      const box = new Toolbox({ domain: node.domain, servers, devices: () => session as never, metrics, providers: config.providers, models: config.models });
      const run = (kit: ReturnType<Toolbox["forRun"]>, name: string, args = "{}") =>
        kit.run({ id: "c", type: "function", function: { name, arguments: args } }, new AbortController().signal);
      const serverCalls = () => server.methods.filter((m) => m === "tools/call").length;

      const device = box.forRun(config.agents[0]!, config.models[0]!, { kind: "device", publicKey: "device-key" });
      assert.deepEqual(
        device.definitions().map((d) => d.function.name),
        ["device.set_volume", "device.set_light", "home.echo", "device_status"],
      );
      assert.equal((await run(device, "device.set_volume")).isError, false);
      assert.deepEqual(deviceCalls, ["set_volume"]);
      for (const name of ["device.reboot", "home.secret", "device.set_volume2"]) {
        const refused = await run(device, name);
        assert.equal(refused.isError, true, name);
        assert.match(refused.text, new RegExp(`no tool named ${name.replace(".", "\\.")}`));
      }
      assert.deepEqual(deviceCalls, ["set_volume"], "the device got no call it was not offered");
      assert.equal(serverCalls(), 0, "the server got no call");

      const application = box.forRun(config.agents[0]!, config.models[0]!, { kind: "application", name: "k", models: ["*"] });
      assert.deepEqual(
        application.definitions().map((d) => d.function.name),
        ["home.echo"],
      );
      for (const name of ["device.set_volume", "device_status"]) {
        const refused = await run(application, name);
        assert.equal(refused.isError, true, name);
        assert.match(refused.text, /device tools are not available to this caller: it is an application/);
      }
      assert.deepEqual(deviceCalls, ["set_volume"], "no device call for an application");
      assert.equal((await run(application, "home.echo", JSON.stringify({ text: "hi" }))).isError, false);
      assert.equal(serverCalls(), 1);
    } finally {
      await servers.close();
      await server.stop();
      await node.stop();
    }
  });
});
