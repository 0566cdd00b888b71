import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, before, describe, test } from "node:test";
import OpenAI, { toFile } from "openai";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { connect } from "./support/webrtc.ts";

const APP_KEY = "sk-perch-test-app-key";
const LIMITED_KEY = "sk-perch-test-limited-key";
const METERED_KEY = "sk-perch-test-metered-key";
const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");

describe("Compatible API: chat", () => {
  let server: TestServer;
  let primary: FakeUpstream;
  let backup: FakeUpstream;
  let deviceToken: string;
  let sideControlToken: string;
  let app: OpenAI;
  let device: OpenAI;

  const client = (apiKey: string, o: Partial<ConstructorParameters<typeof OpenAI>[0]> = {}) =>
    new OpenAI({ apiKey, baseURL: `${server.url}/openai/v1`, maxRetries: 0, ...o });

  before(async () => {
    process.env.PRIMARY_KEY = "upstream-secret";
    primary = await startFakeUpstream();
    backup = await startFakeUpstream();
    server = await startTestServer({
      config: {
        providers: [
          { id: "primary", kind: "openai-compatible", base_url: primary.url, api_key_env: "PRIMARY_KEY", max_retries: 2, retry_backoff_ms: 1 },
          { id: "backup", kind: "openai-compatible", base_url: backup.url, max_retries: 0 },
          { id: "flaky", kind: "openai-compatible", base_url: primary.url, max_retries: 0 },
          { id: "slow", kind: "openai-compatible", base_url: primary.url, max_retries: 0, timeout_ms: 150 },
        ],
        models: [
          { id: "my-chat", kind: "chat", provider: "primary", upstream_model: "llama3.2" },
          { id: "other-chat", kind: "chat", provider: "backup", upstream_model: "qwen" },
          { id: "safe-chat", kind: "chat", provider: "flaky", upstream_model: "first", fallbacks: ["other-chat"] },
          { id: "slow-chat", kind: "chat", provider: "slow", upstream_model: "sloth" },
          { id: "cloud-tts", kind: "speech", provider: "primary", upstream_model: "gpt-4o-mini-tts" },
          { id: "cloud-whisper", kind: "transcription", provider: "primary", upstream_model: "whisper-large" },
          { id: "vision-chat", kind: "chat", provider: "primary", upstream_model: "llava", input: ["image"] },
        ],
        agents: [
          {
            id: "helper",
            model: "my-chat",
            instructions: "You are the assistant of a small device.",
            tools: ["device_status", "device_runtime", "device_telemetry", "contacts_list"],
            max_steps: 4,
          },
          { id: "terse", model: "my-chat", max_tokens: 50 },
        ],
        api_keys: [
          { name: "app", sha256: sha256(APP_KEY), models: ["*"] },
          { name: "limited", sha256: sha256(LIMITED_KEY), models: ["other-chat"] },
          { name: "metered", sha256: sha256(METERED_KEY), rate_limit: 2 },
        ],
      },
    });
    const peer = server.client();
    await peer.login();
    deviceToken = peer.accessToken!;
    await peer.putStatus({ volume: 33, battery_percent: 81 });
    const phone = server.client();
    await phone.login({ deviceToken: (await peer.createDeviceToken()).token });
    sideControlToken = phone.accessToken!;
    app = client(APP_KEY);
    device = client(deviceToken);
  });

  after(async () => {
    await server?.stop();
    await primary?.close();
    await backup?.close();
  });

  test("models.list: chat models and agents the caller may use, nothing about providers", async () => {
    const ids = [];
    for await (const m of app.models.list()) {
      ids.push(m.id);
      assert.equal(m.object, "model");
      assert.equal(m.owned_by, "perch");
      assert.equal(typeof m.created, "number");
      assert.deepEqual(Object.keys(m).sort(), ["created", "id", "object", "owned_by"]);
    }
    assert.deepEqual(ids.filter((id) => id !== "tts-1" && id !== "whisper-1").sort(), [
      "cloud-tts",
      "cloud-whisper",
      "helper",
      "my-chat",
      "other-chat",
      "safe-chat",
      "slow-chat",
      "terse",
      "vision-chat",
    ]);
    assert.ok(ids.includes("tts-1"));
    const limited = [];
    for await (const m of client(LIMITED_KEY).models.list()) limited.push(m.id);
    assert.deepEqual(limited, ["other-chat"]);
  });

  test("chat, non-streaming: the provider's answer, usage and finish reason under the requested model id", async () => {
    const before = primary.received.length;
    const r = await app.chat.completions.create({
      model: "my-chat",
      messages: [
        { role: "system", content: "Be brief." },
        { role: "user", content: "Hi" },
      ],
      temperature: 0,
      top_p: 0.5,
      max_completion_tokens: 20,
      stop: ["\n"],
      seed: 7,
      presence_penalty: 0.1,
      frequency_penalty: 0.2,
      response_format: { type: "json_object" },
      user: "u-1",
      n: 1,
      metadata: { trace: "x" },
    });
    assert.match(r.id, /^chatcmpl-/);
    assert.equal(r.object, "chat.completion");
    assert.equal(r.model, "my-chat");
    assert.equal(r.choices[0]?.message.content, "Hello from llama3.2");
    assert.equal(r.choices[0]?.message.refusal, null);
    assert.equal(r.choices[0]?.finish_reason, "stop");
    assert.deepEqual(r.usage, { prompt_tokens: 7, completion_tokens: 3, total_tokens: 10 });
    const sent = primary.received[before]!;
    assert.equal(sent.headers.authorization, "Bearer upstream-secret");
    assert.equal(sent.body.model, "llama3.2");
    assert.equal(sent.body.temperature, 0);
    assert.equal(sent.body.top_p, 0.5);
    assert.equal(sent.body.max_completion_tokens, 20);
    assert.deepEqual(sent.body.stop, ["\n"]);
    assert.equal(sent.body.seed, 7);
    assert.equal(sent.body.presence_penalty, 0.1);
    assert.equal(sent.body.frequency_penalty, 0.2);
    assert.deepEqual(sent.body.response_format, { type: "json_object" });
    assert.equal(sent.body.user, "u-1");
    assert.deepEqual(sent.body.metadata, { trace: "x" });
  });

  test("finish_reason is the provider's (length)", async () => {
    primary.reply({ content: "cut", finish_reason: "length" });
    const r = await device.chat.completions.create({ model: "my-chat", messages: [{ role: "user", content: "Hi" }], max_tokens: 1 });
    assert.equal(r.choices[0]?.finish_reason, "length");
  });

  test("chat, streaming (pass-through): the provider's chunks relayed as they came (role first, deltas, finish reason, [DONE]), renamed to the requested model id", async () => {
    primary.reply({ chunks: ["Hel", "lo", " there"] });
    const stream = await device.chat.completions.create({ model: "my-chat", messages: [{ role: "user", content: "Hi" }], stream: true });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    assert.equal(chunks[0]?.choices[0]?.delta.role, "assistant");
    assert.equal(chunks.map((c) => c.choices[0]?.delta.content ?? "").join(""), "Hello there");
    assert.equal(chunks.at(-1)?.choices[0]?.finish_reason, "stop");
    // Perch's own work on the relayed bytes: the upstream model's name (llama3.2) replaced.
    assert.equal(primary.received.at(-1)?.body.model, "llama3.2");
    assert.ok(chunks.every((c) => c.model === "my-chat" && c.object === "chat.completion.chunk"));
    assert.ok(chunks.every((c) => !("usage" in c) || c.usage === undefined));
  });

  test("stream_options.include_usage (pass-through): asked of the provider, and its usage chunks relayed", async () => {
    primary.reply({ chunks: ["a", "b"], usage: { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 } });
    const stream = await app.chat.completions.create({
      model: "my-chat",
      messages: [{ role: "user", content: "Hi" }],
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    const last = chunks.at(-1)!;
    assert.deepEqual(last.choices, []);
    assert.deepEqual(last.usage, { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 });
    assert.ok(chunks.slice(0, -1).every((c) => c.usage === null));
    assert.equal(primary.received.at(-1)?.body.stream_options.include_usage, true);
  });

  test("tool calls of a plain model are passed through, streaming and not", async () => {
    const tools = [{ type: "function" as const, function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } } }];
    const call = { id: "call_1", name: "get_weather", arguments: '{"city":"Paris"}' };
    primary.reply({ tool_calls: [call] });
    const r = await app.chat.completions.create({
      model: "my-chat",
      messages: [{ role: "user", content: "Weather?" }],
      tools,
      tool_choice: "auto",
      parallel_tool_calls: false,
    });
    assert.equal(r.choices[0]?.finish_reason, "tool_calls");
    assert.deepEqual(r.choices[0]?.message.tool_calls, [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } }]);
    const sent = primary.received.at(-1)!.body;
    assert.deepEqual(sent.tools, tools);
    assert.equal(sent.tool_choice, "auto");
    assert.equal(sent.parallel_tool_calls, false);

    primary.reply({ tool_calls: [call] });
    const stream = await app.chat.completions.create({ model: "my-chat", messages: [{ role: "user", content: "Weather?" }], tools, stream: true });
    let name = "";
    let args = "";
    let finish: string | null | undefined;
    for await (const chunk of stream) {
      for (const d of chunk.choices[0]?.delta.tool_calls ?? []) {
        name += d.function?.name ?? "";
        args += d.function?.arguments ?? "";
      }
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(name, "get_weather");
    assert.equal(args, '{"city":"Paris"}');
    assert.equal(finish, "tool_calls");

    // The tool's result goes back as a tool message.
    const r2 = await app.chat.completions.create({
      model: "my-chat",
      messages: [
        { role: "user", content: "Weather?" },
        { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: "{}" } }] },
        { role: "tool", tool_call_id: "call_1", content: "sunny" },
      ],
      tools,
    });
    assert.equal(r2.choices[0]?.finish_reason, "stop");
    assert.equal(primary.received.at(-1)!.body.messages[2].content, "sunny");
  });

  test("retry on 429 (and 5xx) before the first byte", async () => {
    const before = primary.received.length;
    primary.reply({ status: 429, error: { message: "slow down" }, retryAfter: "0" }, { status: 503, error: { message: "busy" } }, { content: "third time" });
    const r = await app.chat.completions.create({ model: "my-chat", messages: [{ role: "user", content: "Hi" }] });
    assert.equal(r.choices[0]?.message.content, "third time");
    assert.equal(primary.received.length - before, 3);

    primary.reply({ status: 429, error: { message: "slow down" } }, { chunks: ["ok"] });
    const stream = await app.chat.completions.create({ model: "my-chat", messages: [{ role: "user", content: "Hi" }], stream: true });
    let text = "";
    for await (const c of stream) text += c.choices[0]?.delta.content ?? "";
    assert.equal(text, "ok");
  });

  test("fallback: when the first provider fails, the next model answers", async () => {
    primary.reply({ status: 500, error: { message: "down" } });
    const r = await app.chat.completions.create({ model: "safe-chat", messages: [{ role: "user", content: "Hi" }] });
    assert.equal(r.choices[0]?.message.content, "Hello from qwen");
    assert.equal(r.model, "safe-chat");

    primary.reply({ status: 502 });
    const stream = await app.chat.completions.create({ model: "safe-chat", messages: [{ role: "user", content: "Hi" }], stream: true });
    let text = "";
    for await (const c of stream) text += c.choices[0]?.delta.content ?? "";
    assert.equal(text, "Hello from qwen");
  });

  test("provider failures: retries exhausted → 502 api_error; the provider's own 400 → 400 with its message", async () => {
    primary.reply({ status: 500 }, { status: 500 }, { status: 500 });
    await assert.rejects(app.chat.completions.create({ model: "my-chat", messages: [{ role: "user", content: "Hi" }] }), (err: any) => {
      assert.equal(err.status, 502);
      assert.equal(err.error.type, "api_error");
      return true;
    });
    primary.reply({ status: 400, error: { message: "context too long", param: "messages", code: "context_length_exceeded" } });
    await assert.rejects(app.chat.completions.create({ model: "my-chat", messages: [{ role: "user", content: "Hi" }] }), (err: any) => {
      assert.equal(err.status, 400);
      assert.equal(err.error.message, "context too long");
      assert.equal(err.error.code, "context_length_exceeded");
      assert.equal(err.error.param, "messages");
      return true;
    });
  });

  // Bounded well below the provider's 60 s idle timeout, which would close the call too: only the cancellation closes it in time.
  test("client disconnect cancels the upstream call: the provider sees its connection closed", { timeout: 30_000 }, async () => {
    primary.reply({ hang: true });
    const controller = new AbortController();
    const stream = await app.chat.completions.create(
      { model: "my-chat", messages: [{ role: "user", content: "Tell me a long story" }], stream: true },
      { signal: controller.signal },
    );
    // This request's own upstream call: it must be the one that is cancelled.
    const call = primary.received.at(-1)!;
    assert.equal(call.body.messages[0].content, "Tell me a long story");
    for await (const chunk of stream) {
      assert.equal(chunk.choices[0]?.delta.role, "assistant");
      controller.abort();
    }
    await call.aborted;
  });

  test("a slow stream is relayed as it is produced", async () => {
    // The provider sends each piece only once the client has received the one before: a relay that
    // buffered would never deliver the first, and the test would time out.
    const received: Array<() => void> = [];
    const arrived = (i: number) => new Promise<void>((resolve) => (received[i] = resolve));
    const waits = [arrived(0), arrived(1), arrived(2)];
    primary.reply({ chunks: ["one ", "two ", "three"], gate: (i) => waits[i - 1]! });
    const stream = await app.chat.completions.create({ model: "my-chat", messages: [{ role: "user", content: "count" }], stream: true });
    const pieces: string[] = [];
    for await (const c of stream) {
      const content = c.choices[0]?.delta.content;
      if (!content) continue;
      received[pieces.length]?.();
      pieces.push(content);
    }
    assert.deepEqual(pieces, ["one ", "two ", "three"]);
  });

  test("an upstream failure after streaming started becomes one error event", async () => {
    primary.reply({ hang: true });
    const stream = await app.chat.completions.create({ model: "my-chat", messages: [{ role: "user", content: "Hi" }], stream: true });
    const call = primary.received.at(-1)!;
    let seen = 0;
    await assert.rejects(
      (async () => {
        for await (const _ of stream) {
          seen++;
          // Kill the provider's side mid-stream.
          if (seen === 1) (primary as any).server.closeAllConnections();
        }
      })(),
      (err: any) => {
        assert.match(String(err.message), /the provider's stream failed/);
        return true;
      },
    );
    await call.aborted;
  });

  test("an upstream stream that ends with no finish and no [DONE] ends with an error event after the content it sent", async () => {
    primary.reply({ chunks: ["Once upon ", "a time"], after: "close" });
    const stream = await app.chat.completions.create({ model: "my-chat", messages: [{ role: "user", content: "Hi" }], stream: true });
    let content = "";
    await assert.rejects(
      (async () => {
        for await (const c of stream) content += c.choices[0]?.delta.content ?? "";
      })(),
      (err: any) => {
        assert.match(String(err.message), /the provider's stream ended early/);
        return true;
      },
    );
    assert.equal(content, "Once upon a time");
  });

  // Bounded well below the provider's 60 s idle timeout, which would close the call too.
  test("agent: a step the provider breaks (an invalid tool call) ends the stream with an error event and closes the provider's call", {
    timeout: 30_000,
  }, async () => {
    primary.reply({ tool_calls: [{ id: "call_x", name: "x".repeat(300), arguments: "{}" }], after: "hold" });
    const stream = await device.chat.completions.create({ model: "helper", messages: [{ role: "user", content: "Hi" }], stream: true });
    const call = primary.received.at(-1)!;
    await assert.rejects(
      (async () => {
        for await (const _ of stream);
      })(),
      (err: any) => {
        assert.match(String(err.message), /invalid tool call: a tool name is over 256 characters/);
        return true;
      },
    );
    // The client is still connected: the agent left the provider's stream, and leaving it closes the call.
    await call.aborted;
  });

  test("image parts only for models configured to accept them", async () => {
    const messages = [{ role: "user" as const, content: [{ type: "image_url" as const, image_url: { url: "data:image/png;base64,AAAA" } }] }];
    const r = await app.chat.completions.create({ model: "vision-chat", messages });
    assert.equal(r.choices[0]?.message.content, "Hello from llava");
    await assert.rejects(app.chat.completions.create({ model: "my-chat", messages }), (err: any) => {
      assert.equal(err.status, 400);
      assert.equal(err.error.param, "messages[0].content[0].type");
      return true;
    });
  });

  test("agent: the upstream asks for device_status, Perch runs it for the calling device, the upstream answers", async () => {
    primary.reply({ tool_calls: [{ id: "call_s", name: "device_status", arguments: "{}" }] }, { content: "Your battery is at 81 %." });
    const before = primary.received.length;
    const r = await device.chat.completions.create({ model: "helper", messages: [{ role: "user", content: "How is my battery?" }] });
    assert.equal(r.choices[0]?.message.content, "Your battery is at 81 %.");
    assert.equal(r.model, "helper");
    assert.deepEqual(r.usage, { prompt_tokens: 14, completion_tokens: 6, total_tokens: 20 });
    const [first, second] = primary.received.slice(before);
    assert.equal(first!.body.model, "llama3.2");
    assert.equal(first!.body.messages[0].role, "system");
    assert.equal(first!.body.messages[0].content, "You are the assistant of a small device.");
    assert.deepEqual(
      first!.body.tools.map((t: any) => t.function.name),
      ["device_status", "device_runtime", "device_telemetry", "contacts_list"],
    );
    const toolMessage = second!.body.messages.at(-1);
    assert.equal(toolMessage.role, "tool");
    assert.equal(toolMessage.tool_call_id, "call_s");
    const status = JSON.parse(toolMessage.content);
    assert.equal(status.volume, 33);
    assert.equal(status.battery_percent, 81);
  });

  test("agent, streaming: tools run between steps and the final answer streams", async () => {
    primary.reply({ tool_calls: [{ id: "call_r", name: "device_runtime", arguments: "{}" }] }, { chunks: ["You are ", "offline."] });
    const before = primary.received.length;
    const stream = await device.chat.completions.create({
      model: "helper",
      messages: [{ role: "user", content: "Am I online?" }],
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    assert.equal(chunks[0]?.choices[0]?.delta.role, "assistant");
    assert.equal(chunks.map((c) => c.choices[0]?.delta.content ?? "").join(""), "You are offline.");
    assert.equal(chunks.at(-2)?.choices[0]?.finish_reason, "stop");
    assert.ok(chunks.at(-1)!.usage!.total_tokens > 0);
    assert.ok(chunks.every((c) => c.model === "helper"));
    const toolMessage = primary.received[before + 1]!.body.messages.at(-1);
    assert.deepEqual(JSON.parse(toolMessage.content), { online: false });
  });

  test("agent: the loop is bounded by max_steps (the last step offers no tools)", async () => {
    const call = { id: "c", name: "contacts_list", arguments: "{}" };
    primary.reply({ tool_calls: [call] }, { tool_calls: [call] }, { tool_calls: [call] }, { content: "done" });
    const before = primary.received.length;
    const r = await device.chat.completions.create({ model: "helper", messages: [{ role: "user", content: "loop" }] });
    assert.equal(r.choices[0]?.message.content, "done");
    const sent = primary.received.slice(before);
    assert.equal(sent.length, 4);
    assert.equal(sent[3]!.body.tools, undefined);
    assert.deepEqual(JSON.parse(sent[1]!.body.messages.at(-1).content), []);
  });

  test("agent max_tokens: sent to the model when the request gives none or more; a request asking for fewer keeps its own", async () => {
    const sent = async (extra: Record<string, number>) => {
      primary.reply({ content: "ok" });
      await device.chat.completions.create({ model: "terse", messages: [{ role: "user", content: "hi" }], ...extra });
      const body = primary.received.at(-1)!.body;
      return { max_tokens: body.max_tokens, max_completion_tokens: body.max_completion_tokens };
    };
    assert.deepEqual(await sent({}), { max_tokens: 50, max_completion_tokens: undefined });
    assert.deepEqual(await sent({ max_tokens: 500 }), { max_tokens: 50, max_completion_tokens: undefined });
    assert.deepEqual(await sent({ max_completion_tokens: 500 }), { max_tokens: 50, max_completion_tokens: undefined });
    assert.deepEqual(await sent({ max_tokens: 20 }), { max_tokens: 20, max_completion_tokens: undefined });
  });

  test("agent with an API key: device tools are withheld and refused", async () => {
    primary.reply({ tool_calls: [{ id: "x", name: "device_status", arguments: "{}" }] }, { content: "I cannot see a device." });
    const before = primary.received.length;
    const r = await app.chat.completions.create({ model: "helper", messages: [{ role: "user", content: "battery?" }] });
    assert.equal(r.choices[0]?.message.content, "I cannot see a device.");
    const sent = primary.received.slice(before);
    assert.equal(sent[0]!.body.tools, undefined);
    // The model asked anyway: only a refusal came back, no device data.
    assert.equal(sent.length, 2);
    assert.match(JSON.parse(sent[1]!.body.messages.at(-1).content).error, /not available/);
  });

  test("agent: client tools → 400 param tools", async () => {
    await assert.rejects(
      device.chat.completions.create({
        model: "helper",
        messages: [{ role: "user", content: "x" }],
        tools: [{ type: "function", function: { name: "f" } }],
      }),
      (err: any) => err.status === 400 && err.error.param === "tools",
    );
  });

  test("device tools act on the calling device only", async () => {
    const other = server.client();
    await other.login();
    await other.putStatus({ volume: 99 });
    primary.reply({ tool_calls: [{ id: "s", name: "device_status", arguments: "{}" }] }, { content: "ok" });
    const before = primary.received.length;
    await client(other.accessToken!).chat.completions.create({ model: "helper", messages: [{ role: "user", content: "status" }] });
    assert.equal(JSON.parse(primary.received[before + 1]!.body.messages.at(-1).content).volume, 99);
    // The same agent called by the first device reads that device's status (volume 33), not the last caller's.
    primary.reply({ tool_calls: [{ id: "s", name: "device_status", arguments: "{}" }] }, { content: "ok" });
    const again = primary.received.length;
    await device.chat.completions.create({ model: "helper", messages: [{ role: "user", content: "status" }] });
    assert.equal(JSON.parse(primary.received[again + 1]!.body.messages.at(-1).content).volume, 33);
  });

  test("authentication: none, wrong key, Side Control bearer, model allow-list", async () => {
    const res = await fetch(`${server.url}/openai/v1/models`);
    assert.equal(res.status, 401);
    assert.ok(res.headers.get("x-request-id"));
    assert.deepEqual((await res.json()).error.code, "invalid_api_key");

    await assert.rejects(client("sk-wrong").models.list(), (err: any) => {
      assert.equal(err.status, 401);
      assert.deepEqual(Object.keys(err.error).sort(), ["code", "message", "param", "type"]);
      assert.equal(err.error.type, "invalid_request_error");
      assert.equal(err.error.code, "invalid_api_key");
      assert.equal(err.error.param, null);
      return true;
    });
    await assert.rejects(client(sideControlToken).models.list(), (err: any) => {
      assert.equal(err.status, 403);
      assert.equal(err.error.type, "permission_error");
      return true;
    });
    const limited = client(LIMITED_KEY);
    const r = await limited.chat.completions.create({ model: "other-chat", messages: [{ role: "user", content: "Hi" }] });
    assert.equal(r.model, "other-chat");
    await assert.rejects(limited.chat.completions.create({ model: "my-chat", messages: [{ role: "user", content: "Hi" }] }), (err: any) => {
      assert.equal(err.status, 404);
      assert.equal(err.error.code, "model_not_found");
      assert.equal(err.error.param, "model");
      return true;
    });
  });

  test("a provider that does not answer in time → 504 api_error", async () => {
    primary.reply({ hang: true });
    await assert.rejects(app.chat.completions.create({ model: "slow-chat", messages: [{ role: "user", content: "Hi" }] }), (err: any) => {
      assert.equal(err.status, 504);
      assert.equal(err.error.type, "api_error");
      return true;
    });
  });

  test("an API key's rate limit → 429 rate_limit_error with Retry-After", async () => {
    const metered = client(METERED_KEY);
    await metered.models.list();
    await metered.models.list();
    await assert.rejects(metered.models.list(), (err: any) => {
      assert.equal(err.status, 429);
      assert.equal(err.error.type, "rate_limit_error");
      assert.ok(Number(err.headers.get("retry-after")) >= 1);
      return true;
    });
  });

  test("a request on a device's connection (no bearer) runs as that device: its agent tools act on it", async () => {
    // A real device on its WebRTC connection; the Compatible API is its stream 2, mounted at /v1.
    const conn = await connect(server);
    try {
      const put = await conn.http(1, "PUT", "/me/status", { body: '{"volume":44}', headers: { "content-type": "application/json" } });
      assert.equal(put.status, 200);
      primary.reply({ tool_calls: [{ id: "s", name: "device_status", arguments: "{}" }] }, { content: "ok" });
      const before = primary.received.length;
      const body = JSON.stringify({ model: "helper", messages: [{ role: "user", content: "status?" }] });
      const res = await conn.http(2, "POST", "/v1/chat/completions", { body, headers: { "content-type": "application/json" } });
      assert.equal(res.status, 200, res.body.toString());
      assert.equal(res.json<{ choices: Array<{ message: { content: string } }> }>().choices[0]!.message.content, "ok");
      // The tool read the connection's device (volume 44), not another device (33, the bearer device of these tests).
      assert.equal(JSON.parse(primary.received[before + 1]!.body.messages.at(-1).content).volume, 44);
    } finally {
      conn.close();
    }
  });

  test("upstream speech and transcription models: the request relayed with the upstream model, the answer's bytes back", async () => {
    const speech = await app.audio.speech.create({ model: "cloud-tts", input: "Hello", voice: "coral", instructions: "cheerful", response_format: "mp3" });
    assert.equal(speech.headers.get("content-type"), "audio/mpeg");
    const bytes = Buffer.from(await speech.arrayBuffer());
    assert.equal(bytes.subarray(0, 3).toString(), "ID3");
    const sent = JSON.parse(bytes.subarray(3).toString());
    assert.equal(sent.model, "gpt-4o-mini-tts");
    assert.equal(sent.voice, "coral");
    assert.equal(sent.instructions, "cheerful");

    const wav = Buffer.concat([Buffer.from("RIFF\0\0\0\0WAVEfmt "), Buffer.alloc(64)]);
    const t = await app.audio.transcriptions.create({ model: "cloud-whisper", file: await toFile(wav, "a.wav", { type: "audio/wav" }), language: "de" });
    assert.equal(t.text, "upstream heard you");
    const upload = primary.audio.at(-1)!;
    assert.equal(upload.path, "/v1/audio/transcriptions");
    assert.match(upload.contentType, /^multipart\/form-data; boundary=/);
    const text = upload.body.toString("latin1");
    assert.match(text, /name="model"\r\n\r\nwhisper-large\r\n/);
    assert.match(text, /name="language"\r\n\r\nde\r\n/);
    assert.ok(upload.body.includes(wav));
  });

  test("unknown model → 404 model_not_found", async () => {
    await assert.rejects(app.chat.completions.create({ model: "gpt-9", messages: [{ role: "user", content: "Hi" }] }), (err: any) => {
      assert.equal(err.status, 404);
      assert.equal(err.error.code, "model_not_found");
      assert.equal(err.error.param, "model");
      return true;
    });
  });

  test("every parameter the contract does not accept → 400 naming it", async () => {
    const base = { model: "my-chat", messages: [{ role: "user", content: "Hi" }] };
    const cases: Array<[Record<string, unknown>, string]> = [
      [{ logprobs: true }, "logprobs"],
      [{ top_logprobs: 2 }, "top_logprobs"],
      [{ logit_bias: { "1": 1 } }, "logit_bias"],
      [{ n: 2 }, "n"],
      [{ functions: [] }, "functions"],
      [{ function_call: "auto" }, "function_call"],
      [{ modalities: ["audio"] }, "modalities"],
      [{ audio: { voice: "alloy" } }, "audio"],
      [{ prediction: {} }, "prediction"],
      [{ store: true }, "store"],
      [{ service_tier: "auto" }, "service_tier"],
      [{ reasoning_effort: "low" }, "reasoning_effort"],
      [{ web_search_options: {} }, "web_search_options"],
      [{ temperature: 3 }, "temperature"],
      [{ top_p: 2 }, "top_p"],
      [{ max_tokens: 0 }, "max_tokens"],
      [{ max_tokens: 5, max_completion_tokens: 5 }, "max_tokens"],
      [{ stop: ["a", "b", "c", "d", "e"] }, "stop"],
      [{ presence_penalty: 3 }, "presence_penalty"],
      [{ frequency_penalty: -3 }, "frequency_penalty"],
      [{ seed: 1.5 }, "seed"],
      [{ response_format: { type: "xml" } }, "response_format.type"],
      [{ stream_options: { include_usage: true } }, "stream_options"],
      [{ stream_options: { include_obfuscation: true }, stream: true }, "stream_options.include_obfuscation"],
      [{ tool_choice: "auto" }, "tool_choice"],
      [{ tools: [{ type: "custom", custom: {} }] }, "tools[0].type"],
      [{ messages: [{ role: "function", content: "x", name: "f" }] }, "messages[0].role"],
      [{ messages: [{ role: "user", content: "x", audio: {} }] }, "messages[0].audio"],
      [{ messages: [{ role: "user", content: [{ type: "file", file: {} }] }] }, "messages[0].content[0].type"],
      [{ messages: [] }, "messages"],
      [{ model: "" }, "model"],
    ];
    for (const [extra, param] of cases) {
      const res = await fetch(`${server.url}/openai/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${APP_KEY}`, "content-type": "application/json" },
        body: JSON.stringify({ ...base, ...extra }),
      });
      const body = await res.json();
      assert.equal(res.status, 400, `${JSON.stringify(extra)}: ${JSON.stringify(body)}`);
      assert.equal(body.error.param, param, `${JSON.stringify(extra)}: ${JSON.stringify(body)}`);
      assert.equal(body.error.type, "invalid_request_error");
    }
  });

  test("malformed JSON → 400 in the envelope; query strings are ignored", async () => {
    const res = await fetch(`${server.url}/openai/v1/chat/completions?api-version=2024-02-01`, {
      method: "POST",
      headers: { authorization: `Bearer ${APP_KEY}`, "content-type": "application/json" },
      body: "{not json",
    });
    assert.equal(res.status, 400);
    assert.equal((await res.json()).error.type, "invalid_request_error");
    const models = await fetch(`${server.url}/openai/v1/models?api-version=2024-02-01`, { headers: { authorization: `Bearer ${APP_KEY}` } });
    assert.equal(models.status, 200);
  });

  test("404, 405 and 413 in OpenAI's envelope, with X-Request-ID", async () => {
    const auth = { authorization: `Bearer ${APP_KEY}` };
    const notFound = await fetch(`${server.url}/openai/v1/embeddings`, { method: "POST", headers: auth });
    assert.equal(notFound.status, 404);
    assert.ok(notFound.headers.get("x-request-id"));
    const nf = await notFound.json();
    assert.deepEqual(Object.keys(nf.error).sort(), ["code", "message", "param", "type"]);
    assert.equal(nf.error.type, "invalid_request_error");

    const wrong = await fetch(`${server.url}/openai/v1/chat/completions`, { headers: auth });
    assert.equal(wrong.status, 405);
    assert.equal(wrong.headers.get("allow"), "POST");
    assert.equal((await wrong.json()).error.type, "invalid_request_error");
    const wrongModels = await fetch(`${server.url}/openai/v1/models`, { method: "DELETE", headers: auth });
    assert.equal(wrongModels.status, 405);
    assert.equal(wrongModels.headers.get("allow"), "GET");
    await wrongModels.body?.cancel();

    const big = await fetch(`${server.url}/openai/v1/chat/completions`, {
      method: "POST",
      headers: { ...auth, "content-type": "application/json" },
      body: "x".repeat(32 * 1024 * 1024 + 1),
    });
    assert.equal(big.status, 413);
    assert.ok(big.headers.get("x-request-id"));
    assert.equal((await big.json()).error.type, "invalid_request_error");

    // A body over the Public API's 64 KiB limit is fine here.
    const long = await app.chat.completions.create({ model: "my-chat", messages: [{ role: "user", content: "y".repeat(200_000) }] });
    assert.equal(long.choices[0]?.finish_reason, "stop");
  });

  test("metrics: per route and per model requests, latency, tokens and errors", async () => {
    const text = await (await fetch(`${server.url}/metrics`)).text();
    assert.match(text, /perch_ai_requests_total\{route="\/chat\/completions",model="my-chat",status="200"\} \d+/);
    assert.match(text, /perch_ai_tokens_total\{model="my-chat",kind="prompt"\} \d+/);
    assert.match(text, /perch_ai_errors_total\{route="\/chat\/completions",model="my-chat",type="api_error"\} \d+/);
    assert.match(text, /perch_ai_request_duration_seconds_count\{route="\/chat\/completions",model="helper"\} \d+/);
  });
});
