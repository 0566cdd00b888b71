import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import pino from "pino";
import { SERVICE } from "../src/protocol/channel.ts";
import type { PerchConnection } from "../src/sdk/webrtc.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { RawToolStream, tool } from "./support/mcp.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { connect, eventually, within } from "./support/webrtc.ts";

/** Hostile devices on service stream 3: each is bounded as tools.md §1 says; the node and the other devices go on. */
describe("tools: hostile devices", () => {
  let server: TestServer;
  let model: FakeUpstream;
  let log = "";
  /** A well-behaved device beside the hostile ones, asked after each of them. */
  let good: PerchConnection;
  const goodCalls: unknown[] = [];

  const raw = async () => {
    const conn = await connect(server);
    return { conn, stream: new RawToolStream(await conn.openStream(SERVICE.TOOLS)) };
  };
  /** A raw device that has answered initialize and listed `offered`, once Perch has taken them. */
  const listed = async (offered: unknown[], expected = offered.length) => {
    const r = await raw();
    await r.stream.initialize();
    await r.stream.list(offered);
    await eventually(() => tools(r.conn).length === expected, 5000, "listed");
    return r;
  };
  const tools = (conn: PerchConnection) => server.transport!.deviceTools(conn.publicKey)?.tools.map((t) => t.name) ?? [];
  const ask = (conn: PerchConnection, agent = "talker") =>
    conn.http(2, "POST", "/v1/chat/completions", {
      body: JSON.stringify({ model: agent, messages: [{ role: "user", content: "go" }] }),
      headers: { "content-type": "application/json" },
    });

  /** The good device still has its tool, and a call to it still runs. */
  const goodStillWorks = async () => {
    model.reply({ tool_calls: [{ id: "g", name: "device.beep", arguments: "{}" }] }, { content: "beeped" });
    const res = await ask(good);
    assert.equal(res.status, 200);
    assert.equal(res.json<any>().choices[0].message.content, "beeped");
    assert.equal(goodCalls.length > 0, true);
  };

  before(async () => {
    model = await startFakeUpstream();
    const logger = pino(
      { level: "info" },
      {
        write: (line: string) => {
          log += line;
        },
      },
    );
    server = await startTestServer({
      logger,
      config: {
        providers: [{ id: "fake", kind: "openai-compatible", base_url: model.url, max_retries: 0 }],
        models: [{ id: "my-chat", kind: "chat", provider: "fake", upstream_model: "m" }],
        agents: [
          { id: "talker", model: "my-chat", tools: ["device.*"], tool_timeout_ms: 600 },
          { id: "patient", model: "my-chat", tools: ["device.*"], tool_timeout_ms: 60_000 },
        ],
      },
    });
    good = await connect(server);
    await good.offerTools([
      {
        name: "beep",
        description: "Beeps.",
        inputSchema: { type: "object", properties: {} },
        handler: () => {
          goodCalls.push(1);
          return "beep";
        },
      },
    ]);
    await eventually(() => tools(good).length === 1, 5000, "the good device's tools");
  });

  after(async () => {
    good?.close();
    await server?.stop();
    await model?.close();
  });

  test("10,000 tools: the first 128 are kept, the rest ignored with one warning", async () => {
    const { conn, stream } = await raw();
    try {
      await stream.initialize();
      await stream.list(Array.from({ length: 10_000 }, (_, i) => tool(`t${i}`)));
      await eventually(() => tools(conn).length === 128, 5000, "128 tools");
      assert.deepEqual(tools(conn).slice(0, 3), ["t0", "t1", "t2"]);
      assert.equal(log.match(/device tools beyond the bounds are ignored/g)?.length, 1);
      // Listing again with the same list does not warn again.
      stream.send({ jsonrpc: "2.0", method: "notifications/tools/list_changed" });
      await stream.list(Array.from({ length: 200 }, (_, i) => tool(`u${i}`)));
      await eventually(() => tools(conn)[0] === "u0", 5000, "the second list");
      assert.equal(log.match(/device tools beyond the bounds are ignored/g)?.length, 1);
      await goodStillWorks();
    } finally {
      conn.close();
    }
  });

  test("invalid tools are ignored one by one: a schema that is not an object, bad names, long descriptions, names that collide", async () => {
    const { conn, stream } = await raw();
    try {
      await stream.initialize();
      await stream.list([
        tool("string_schema", { inputSchema: { type: "string" } }),
        tool("no_schema", { inputSchema: "nope" }),
        tool("array_schema", { inputSchema: [] }),
        tool("huge_schema", { inputSchema: { type: "object", description: "x".repeat(17 * 1024) } }),
        tool("bad name!"),
        tool("n".repeat(65)),
        tool("wordy", { description: "w".repeat(1025) }),
        tool("ok.one"),
        tool("ok.one", { description: "the same name again" }),
        "not a tool",
        tool("ok-two"),
      ]);
      await eventually(() => tools(conn).length === 2, 5000, "the valid tools");
      assert.deepEqual(tools(conn), ["ok.one", "ok-two"]);
      assert.equal(server.transport!.deviceTools(conn.publicKey)!.tools[0]!.description, "the ok.one tool");
      // The model sees exactly those.
      const before = model.received.length;
      assert.equal((await ask(conn)).status, 200);
      assert.deepEqual(
        model.received[before]!.body.tools.map((t: any) => t.function.name),
        ["device.ok.one", "device.ok-two"],
      );
    } finally {
      conn.close();
    }
  });

  test("cursors are followed; a cursor handed out again ends the listing", async () => {
    const { conn, stream } = await raw();
    try {
      await stream.initialize();
      await stream.list([tool("p1")], "c1");
      const second = await stream.list([tool("p2")], "c2");
      assert.deepEqual(second.params, { cursor: "c1" });
      const third = await stream.list([tool("p3")], "c1");
      assert.deepEqual(third.params, { cursor: "c2" });
      await eventually(() => tools(conn).length === 3, 5000, "three pages");
      assert.deepEqual(tools(conn), ["p1", "p2", "p3"]);
    } finally {
      conn.close();
    }
  });

  for (const [what, send] of [
    // Just over the 1 MiB bound: the device must still flush what it wrote before a ping gets through.
    ["a line over 1 MiB", (s: RawToolStream) => s.write(Buffer.alloc(1024 * 1024 + 64 * 1024, 0x61))],
    ["invalid JSON", (s: RawToolStream) => s.write("{this is not json\n")],
    ["a JSON line that is not JSON-RPC", (s: RawToolStream) => s.write('{"hello":"world"}\n')],
  ] as const) {
    test(`${what}: the stream is closed, the device loses its tools, its connection and the node go on`, async () => {
      const { conn, stream } = await listed([tool("mine")]);
      try {
        send(stream);
        await stream.whenClosed();
        await eventually(() => tools(conn).length === 0, 5000, "tools gone");
        // The connection stays: a ping goes through (once the device's own side has given up the stream it was still writing).
        assert.equal(server.transport!.connection(conn.publicKey)?.active, true);
        await eventually(() => conn.ping().catch(() => undefined), 10_000, "a ping");
        await goodStillWorks();
      } finally {
        conn.close();
      }
    });
  }

  test("a device that never answers initialize: its stream is closed after 5 s, it has no tools", async () => {
    const { conn, stream } = await raw();
    try {
      await stream.request("initialize");
      await stream.whenClosed(10_000);
      assert.deepEqual(tools(conn), []);
      // The connection outlives its tool stream: still active on the node, and it answers a ping.
      assert.equal(server.transport!.connection(conn.publicKey)?.active, true);
      await within(conn.ping(), 5_000, "a ping after the tool stream closed");
    } finally {
      conn.close();
    }
  });

  test("a device that never answers a call: the call fails as a tool error after tool_timeout_ms, the device is told it is cancelled", async () => {
    const { conn, stream } = await listed([tool("slow")]);
    try {
      model.reply({ tool_calls: [{ id: "s", name: "device.slow", arguments: "{}" }] }, { content: "it timed out" });
      const before = model.received.length;
      const started = performance.now();
      const res = await ask(conn);
      const elapsed = performance.now() - started;
      assert.equal(res.status, 200);
      // The configured 600 ms, measured: not the message built from it (ten times longer would be 6 s).
      assert.ok(elapsed >= 600 && elapsed < 4_000, `the call gave up after ${Math.round(elapsed)} ms`);
      assert.equal(res.json<any>().choices[0].message.content, "it timed out");
      const call = await stream.request("tools/call");
      assert.equal(call.params.name, "slow");
      const cancelled = await stream.next((m) => m.method === "notifications/cancelled");
      assert.equal(cancelled.params.requestId, call.id);
      assert.match(JSON.parse(model.received[before + 1]!.body.messages.at(-1).content).error, /did not answer within 600 ms/);
      assert.match(await (await fetch(`${server.url}/metrics`)).text(), /perch_tool_calls_total\{source="device",result="timeout"\} 1/);
      // An answer arriving after the timeout changes nothing.
      stream.send({ jsonrpc: "2.0", id: call.id, result: { content: [{ type: "text", text: "late" }] } });
      // The node keeps the stream and the tool; the connection answers.
      await within(conn.ping(), 5_000, "a ping after the late answer");
      assert.equal(stream.closed, false);
      assert.deepEqual(tools(conn), ["slow"]);
    } finally {
      conn.close();
    }
  });

  test("a caller that goes away cancels the device's call (notifications/cancelled)", async () => {
    const { conn, stream } = await listed([tool("slow")]);
    try {
      model.reply({ tool_calls: [{ id: "s", name: "device.slow", arguments: "{}" }] }, { content: "never read" });
      const http = await conn.openStream(SERVICE.COMPATIBLE_API);
      const body = JSON.stringify({ model: "patient", messages: [{ role: "user", content: "go" }] });
      http.write(
        `POST /v1/chat/completions HTTP/1.1\r\nHost: perch\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
      );
      const call = await stream.request("tools/call");
      http.destroy();
      const cancelled = await stream.next((m) => m.method === "notifications/cancelled");
      assert.equal(cancelled.params.requestId, call.id);
    } finally {
      conn.close();
    }
  });

  test("requests from the device to Perch (sampling, roots, elicitation) are answered −32601", async () => {
    const { conn, stream } = await listed([tool("x")]);
    try {
      for (const [id, method] of [
        [101, "sampling/createMessage"],
        [102, "roots/list"],
        [103, "elicitation/create"],
      ] as const) {
        stream.send({ jsonrpc: "2.0", id, method, params: {} });
        const answer = await stream.next((m) => m.id === id);
        assert.equal(answer.error.code, -32601, method);
      }
      assert.deepEqual(tools(conn), ["x"]);
    } finally {
      conn.close();
    }
  });
});
