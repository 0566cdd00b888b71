import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { create, toBinary } from "@bufbuild/protobuf";
import OpenAI from "openai";
import { RpcMethod, ServerPutInfoRequestSchema } from "../src/protocol/gen/rpc_pb.ts";
import { PerchClient } from "../src/sdk/client.ts";
import { perchJson } from "./support/cli.ts";
import { offerListed, volumeTool } from "./support/device-tools.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { WeatherServer } from "./support/mcp.ts";
import { STORES, startTestServer, type TestServer } from "./support/server.ts";
import { connect, eventually } from "./support/webrtc.ts";

const APP_KEY = "sk-perch-test-tools-app";
const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");

/** A device offering `set_volume` (and recording what its handler got). */
async function volumeDevice(server: TestServer) {
  const conn = await connect(server);
  const { tool, got, level } = volumeTool();
  const offered = await offerListed(server, conn, [tool]);
  return { conn, got, offered, level };
}

const toolNames = (body: Record<string, any>) => (body.tools ?? []).map((t: any) => t.function.name).sort();

describe("agents with tools: the device's own and MCP servers'", () => {
  let server: TestServer;
  let model: FakeUpstream;
  let weather: WeatherServer;
  let app: OpenAI;

  before(async () => {
    process.env.WEATHER_TOKEN = "Bearer weather-secret";
    model = await startFakeUpstream();
    weather = await new WeatherServer().start();
    server = await startTestServer({
      config: {
        providers: [
          { id: "fake", kind: "openai-compatible", base_url: model.url, max_retries: 0 },
          { id: "strict", kind: "openai-compatible", base_url: model.url, max_retries: 0, dotted_tool_names: false },
        ],
        models: [
          { id: "my-chat", kind: "chat", provider: "fake", upstream_model: "m" },
          { id: "strict-chat", kind: "chat", provider: "strict", upstream_model: "s" },
          { id: "vision-chat", kind: "chat", provider: "fake", upstream_model: "v", input: ["image"] },
        ],
        mcp_servers: [{ id: "weather", url: weather.url, headers_env: { Authorization: "WEATHER_TOKEN" }, timeout_ms: 2000 }],
        agents: [
          { id: "talker", model: "my-chat", tools: ["device_status", "device.*"] },
          { id: "strict-talker", model: "strict-chat", tools: ["device.set_volume"] },
          { id: "looker", model: "vision-chat", tools: ["device.*"] },
          { id: "forecaster", model: "my-chat", tools: ["weather.*"] },
          { id: "today-only", model: "my-chat", tools: ["weather.to*"] },
          { id: "brief", model: "my-chat", tools: ["weather.history", "device.*"], tool_result_max_chars: 100 },
        ],
        api_keys: [{ name: "app", sha256: sha256(APP_KEY) }],
      },
    });
    app = new OpenAI({ apiKey: APP_KEY, baseURL: `${server.url}/openai/v1`, maxRetries: 0 });
  });

  after(async () => {
    await server?.stop();
    await model?.close();
    await weather?.stop();
  });

  test("the model calls device.set_volume {level: 3}: the device's handler runs with exactly that, the result reaches the model (stream 2 and bearer)", async () => {
    const { conn, got } = await volumeDevice(server);
    try {
      model.reply({ tool_calls: [{ id: "v1", name: "device.set_volume", arguments: '{"level": 3}' }] }, { content: "Done: volume 3." });
      const before = model.received.length;
      const body = JSON.stringify({ model: "talker", messages: [{ role: "user", content: "Turn the volume down to three." }] });
      const res = await conn.http(2, "POST", "/v1/chat/completions", { body, headers: { "content-type": "application/json" } });
      assert.equal(res.status, 200, res.body.toString());
      assert.equal(res.json<any>().choices[0].message.content, "Done: volume 3.");
      assert.deepEqual(got, [{ level: 3 }]);
      const [first, second] = model.received.slice(before);
      assert.deepEqual(toolNames(first!.body), ["device.set_volume", "device_status"]);
      const offered = first!.body.tools.find((t: any) => t.function.name === "device.set_volume");
      assert.equal(offered.function.description, "Sets the speaker volume (0-10).");
      assert.equal(offered.function.parameters.type, "object");
      const toolMessage = second!.body.messages.at(-1);
      assert.equal(toolMessage.role, "tool");
      assert.equal(toolMessage.tool_call_id, "v1");
      assert.equal(toolMessage.content, "The volume is now 3.");

      // The same device through a primary session (bearer) over TCP, streaming.
      const peer = new PerchClient({ baseUrl: server.url, keyPair: conn.keyPair });
      await peer.login();
      const asDevice = new OpenAI({ apiKey: peer.accessToken!, baseURL: `${server.url}/openai/v1`, maxRetries: 0 });
      model.reply({ tool_calls: [{ id: "v2", name: "device.set_volume", arguments: '{"level": 7}' }] }, { chunks: ["Volume ", "7."] });
      const stream = await asDevice.chat.completions.create({ model: "talker", messages: [{ role: "user", content: "Seven." }], stream: true });
      let text = "";
      for await (const c of stream) text += c.choices[0]?.delta.content ?? "";
      assert.equal(text, "Volume 7.");
      assert.deepEqual(got, [{ level: 3 }, { level: 7 }]);
      assert.equal(model.received.at(-1)!.body.messages.at(-1).content, "The volume is now 7.");
      const metrics = await (await fetch(`${server.url}/metrics`)).text();
      assert.match(metrics, /perch_tool_calls_total\{source="device",result="ok"\} 2/);
      assert.match(metrics, /perch_tool_call_seconds_count\{source="device"\} 2/);
    } finally {
      conn.close();
    }
  });

  test("a provider that forbids dots gets device__set_volume, and Perch maps the call back", async () => {
    const { conn, got } = await volumeDevice(server);
    try {
      model.reply({ tool_calls: [{ id: "u", name: "device__set_volume", arguments: '{"level": 2}' }] }, { content: "ok" });
      const before = model.received.length;
      const body = JSON.stringify({ model: "strict-talker", messages: [{ role: "user", content: "two" }] });
      const res = await conn.http(2, "POST", "/v1/chat/completions", { body, headers: { "content-type": "application/json" } });
      assert.equal(res.status, 200);
      assert.deepEqual(toolNames(model.received[before]!.body), ["device__set_volume"]);
      assert.deepEqual(got, [{ level: 2 }]);
      // A voice turn's tool events name the tool as configured, not in the provider's form.
      model.reply({ tool_calls: [{ id: "v", name: "device__set_volume", arguments: '{"level": 4}' }] }, { content: "ok" });
      const seen: string[] = [];
      await server.chat.chat(
        { kind: "device", publicKey: conn.publicKey },
        { model: "strict-talker", messages: [{ role: "user", content: "four" }] } as never,
        new AbortController().signal,
        {
          called: (name) => seen.push(`called ${name}`),
          finished: (name) => seen.push(`finished ${name}`),
        },
      );
      assert.deepEqual(seen, ["called device.set_volume", "finished device.set_volume"]);
      assert.deepEqual(got, [{ level: 2 }, { level: 4 }]);
    } finally {
      conn.close();
    }
  });

  test("a tool's image reaches a model that takes images, and is noted as omitted for one that does not; isError is a failed call", async () => {
    const conn = await connect(server);
    try {
      await conn.offerTools([
        {
          name: "take_photo",
          description: "Takes a photo.",
          inputSchema: { type: "object", properties: {} },
          handler: () => ({
            content: [
              { type: "text", text: "a photo of the room" },
              { type: "image", data: "iVBORw0K", mimeType: "image/png" },
            ],
          }),
        },
        {
          name: "fail",
          description: "Fails.",
          inputSchema: { type: "object", properties: {} },
          handler: () => {
            throw new Error("the lens is covered");
          },
        },
      ]);
      await eventually(() => server.transport!.deviceTools(conn.publicKey)?.tools.length === 2, 5000, "listed");
      const ask = (model: string) =>
        conn.http(2, "POST", "/v1/chat/completions", {
          body: JSON.stringify({ model, messages: [{ role: "user", content: "look" }] }),
          headers: { "content-type": "application/json" },
        });
      model.reply({ tool_calls: [{ id: "p", name: "device.take_photo", arguments: "{}" }] }, { content: "I see a room." });
      let before = model.received.length;
      assert.equal((await ask("looker")).status, 200);
      const messages = model.received[before + 1]!.body.messages;
      assert.equal(messages.at(-2).content, "a photo of the room");
      assert.deepEqual(messages.at(-1).content[1], { type: "image_url", image_url: { url: "data:image/png;base64,iVBORw0K" } });
      model.reply(
        {
          tool_calls: [
            { id: "p", name: "device.take_photo", arguments: "{}" },
            { id: "f", name: "device.fail", arguments: "{}" },
          ],
        },
        { content: "ok" },
      );
      before = model.received.length;
      assert.equal((await ask("talker")).status, 200);
      const [photo, failure] = model.received[before + 1]!.body.messages.slice(-2);
      assert.equal(photo.content, "a photo of the room\n[1 image(s) omitted: this model does not take images]");
      assert.deepEqual(JSON.parse(failure.content), { error: "the lens is covered" });
    } finally {
      conn.close();
    }
  });

  test("list_changed: a tool the device adds is in the next model request", async () => {
    const { conn, offered } = await volumeDevice(server);
    try {
      offered.add({
        name: "play_sound",
        description: "Plays a sound.",
        inputSchema: { type: "object", properties: { name: { type: "string" } } },
        handler: () => "playing",
      });
      await eventually(() => server.transport!.deviceTools(conn.publicKey)?.tools.length === 2, 5000, "the list again");
      const before = model.received.length;
      const body = JSON.stringify({ model: "talker", messages: [{ role: "user", content: "hi" }] });
      const res = await conn.http(2, "POST", "/v1/chat/completions", { body, headers: { "content-type": "application/json" } });
      assert.equal(res.status, 200);
      assert.deepEqual(toolNames(model.received[before]!.body), ["device.play_sound", "device.set_volume", "device_status"]);
      offered.remove("play_sound");
      await eventually(() => server.transport!.deviceTools(conn.publicKey)?.tools.length === 1, 5000, "the tool gone");
    } finally {
      conn.close();
    }
  });

  test("an API-key caller's agent with device.* gets no device tools; device A's caller never gets device B's tools", async () => {
    const b = await volumeDevice(server);
    const a = await connect(server);
    try {
      model.reply({ tool_calls: [{ id: "x", name: "device.set_volume", arguments: '{"level": 0}' }] }, { content: "no device" });
      let before = model.received.length;
      const r = await app.chat.completions.create({ model: "talker", messages: [{ role: "user", content: "mute" }] });
      assert.equal(r.choices[0]?.message.content, "no device");
      assert.equal(model.received[before]!.body.tools, undefined);
      assert.match(JSON.parse(model.received[before + 1]!.body.messages.at(-1).content).error, /not available to this caller/);

      // Device A (no tools of its own) asks: B's tools are neither offered nor reachable by name.
      model.reply({ tool_calls: [{ id: "y", name: "device.set_volume", arguments: '{"level": 0}' }] }, { content: "nothing" });
      before = model.received.length;
      const body = JSON.stringify({ model: "talker", messages: [{ role: "user", content: "mute" }] });
      const res = await a.http(2, "POST", "/v1/chat/completions", { body, headers: { "content-type": "application/json" } });
      assert.equal(res.status, 200);
      assert.deepEqual(toolNames(model.received[before]!.body), ["device_status"]);
      assert.match(JSON.parse(model.received[before + 1]!.body.messages.at(-1).content).error, /no tool named/);
      assert.deepEqual(b.got, []);
      assert.equal(b.level(), 5);
    } finally {
      a.close();
      b.conn.close();
    }
  });

  test("a configured MCP server: weather.* sees and calls weather.today (headers from the environment); others never see it", async () => {
    await eventually(async () => /perch_mcp_servers_up\{server="weather"\} 1/.test(await (await fetch(`${server.url}/metrics`)).text()), 10_000, "weather up");
    model.reply({ tool_calls: [{ id: "w", name: "weather.today", arguments: '{"city":"Lisbon"}' }] }, { content: "Sunny." });
    let before = model.received.length;
    const r = await app.chat.completions.create({ model: "forecaster", messages: [{ role: "user", content: "Weather in Lisbon?" }] });
    assert.equal(r.choices[0]?.message.content, "Sunny.");
    assert.deepEqual(toolNames(model.received[before]!.body), ["weather.alerts", "weather.history", "weather.today"]);
    assert.equal(model.received[before + 1]!.body.messages.at(-1).content, "Sunny and 21 °C in Lisbon.");
    assert.deepEqual(weather.calls.at(-1), { name: "today", args: { city: "Lisbon" } });
    assert.ok(weather.authorizations.length > 0 && weather.authorizations.every((a) => a === "Bearer weather-secret"));

    before = model.received.length;
    await app.chat.completions.create({ model: "today-only", messages: [{ role: "user", content: "?" }] });
    assert.deepEqual(toolNames(model.received[before]!.body), ["weather.today"]);
    before = model.received.length;
    await app.chat.completions.create({ model: "talker", messages: [{ role: "user", content: "?" }] });
    assert.equal(model.received[before]!.body.tools, undefined);
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    assert.match(metrics, /perch_tool_calls_total\{source="weather",result="ok"\} 1/);
  });

  test("tool results reach the model cut to the agent's tool_result_max_chars, with a note: an MCP server's and a device's", async () => {
    await eventually(async () => /perch_mcp_servers_up\{server="weather"\} 1/.test(await (await fetch(`${server.url}/metrics`)).text()), 10_000, "weather up");
    const conn = await connect(server);
    try {
      await conn.offerTools([
        { name: "log", description: "The device's log.", inputSchema: { type: "object", properties: {} }, handler: () => "line;".repeat(1000) },
      ]);
      await eventually(() => server.transport!.deviceTools(conn.publicKey)?.tools.length === 1, 5000, "listed");
      model.reply(
        {
          tool_calls: [
            { id: "h", name: "weather.history", arguments: '{"days": 1000}' },
            { id: "l", name: "device.log", arguments: "{}" },
          ],
        },
        { content: "Long." },
      );
      const before = model.received.length;
      const body = JSON.stringify({ model: "brief", messages: [{ role: "user", content: "everything" }] });
      const res = await conn.http(2, "POST", "/v1/chat/completions", { body, headers: { "content-type": "application/json" } });
      assert.equal(res.status, 200, res.body.toString());
      const [history, log] = model.received[before + 1]!.body.messages.slice(-2);
      assert.equal(history.content, `${"sunny;".repeat(16)}sunn\n[the tool's result was cut: the first 100 of its 6000 characters]`);
      assert.equal(log.content, `${"line;".repeat(20)}\n[the tool's result was cut: the first 100 of its 5000 characters]`);
    } finally {
      conn.close();
    }
  });

  test("the MCP server going away mid-run: its tools are absent, the agent still answers; it comes back", async () => {
    await eventually(async () => /perch_mcp_servers_up\{server="weather"\} 1/.test(await (await fetch(`${server.url}/metrics`)).text()), 10_000, "weather up");
    const port = weather.port;
    // The model's first request stops the server; the call it asks for finds nobody.
    model.reply({ tool_calls: [{ id: "w2", name: "weather.today", arguments: '{"city":"Porto"}' }] }, { content: "I cannot reach the weather service." });
    const stopping = new Promise<void>((resolve) => {
      const check = setInterval(() => {
        if (model.received.length > count) {
          clearInterval(check);
          void weather.stop().then(resolve);
        }
      }, 1);
    });
    const count = model.received.length;
    const before = count;
    const pending = app.chat.completions.create({ model: "forecaster", messages: [{ role: "user", content: "Porto?" }] });
    await stopping;
    const r = await pending;
    assert.equal(r.choices[0]?.message.content, "I cannot reach the weather service.");
    const second = model.received[before + 1]!.body;
    assert.match(JSON.parse(second.messages.at(-1).content).error, /the MCP server weather is away/);
    assert.equal(second.tools, undefined);
    assert.match(await (await fetch(`${server.url}/metrics`)).text(), /perch_mcp_servers_up\{server="weather"\} 0/);
    // Back on the same port: connected again (back-off), its tools offered again.
    await weather.start(port);
    await eventually(
      async () => /perch_mcp_servers_up\{server="weather"\} 1/.test(await (await fetch(`${server.url}/metrics`)).text()),
      15_000,
      "weather back",
    );
  });
});

describe("perch peers tools", () => {
  for (const store of STORES) {
    test(`asks the node that holds the connection, over the ${store.name} store's bus`, async () => {
      const databaseUrl = await store.url();
      const server = await startTestServer({ config: { ...(databaseUrl ? { database_url: databaseUrl } : {}), node_name: "tools-node" } });
      try {
        const { conn } = await volumeDevice(server);
        try {
          const env = { PERCH_DATA_DIR: server.dataDir, PERCH_DATABASE_URL: databaseUrl ?? "" };
          const out = await perchJson<any>(["peers", "tools", conn.publicKey], env);
          assert.deepEqual(out, {
            public_key: conn.publicKey,
            online: true,
            node: "tools-node",
            tools: [{ name: "device.set_volume", description: "Sets the speaker volume (0-10)." }],
          });
          // peers list: who is connected now, by the name the device gave itself.
          await conn.call(
            RpcMethod.SERVER_INFO_PUT,
            toBinary(ServerPutInfoRequestSchema, create(ServerPutInfoRequestSchema, { value: { name: "Kitchen bear" } })),
          );
          const listed = await perchJson<any[]>(["peers", "list"], env);
          const self = listed.find((p) => p.public_key === conn.publicKey);
          assert.deepEqual([self?.name, self?.online], ["Kitchen bear", true]);
          const offline = await perchJson<any>(["peers", "tools", server.client().publicKey], env);
          assert.deepEqual(offline.tools, []);
          assert.equal(offline.online, false);
        } finally {
          conn.close();
        }
      } finally {
        await server.stop();
      }
    });
  }
});
