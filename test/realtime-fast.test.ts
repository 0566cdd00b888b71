import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { ConfigError, loadConfig } from "../src/config/config.ts";
import { errorOf, parseServerEvent } from "../src/voice/realtime/events.ts";
import { historyItems, realtimeUrl, sessionUpdate } from "../src/voice/realtime/wire.ts";
import { startTestNode, type TestNode } from "./support/server.ts";

const providers = [
  { id: "openai", kind: "openai", api_key_env: "OPENAI_API_KEY" },
  { id: "rt", kind: "openai-compatible", base_url: "http://rt-box:9000/v1" },
  { id: "claude", kind: "anthropic", api_key_env: "ANTHROPIC_KEY" },
];
const models = [
  { id: "live", kind: "realtime", provider: "openai", upstream_model: "gpt-realtime" },
  { id: "box", kind: "realtime", provider: "rt", upstream_model: "some-realtime" },
  { id: "chat", kind: "chat", provider: "openai", upstream_model: "gpt-4.1-mini" },
];
const talker = { id: "talker", model: "live", instructions: "Be brief.", voice: "marin", tools: ["device.*"], turn_detection: "semantic_vad" };

function refused(input: Record<string, unknown>, field: string): void {
  assert.throws(
    () => loadConfig({}, input as never),
    (err: unknown) => err instanceof ConfigError && err.message.includes(`at ${field}:`),
    `expected a refusal naming ${field}`,
  );
}

describe("realtime models in the configuration (voice.md §6)", () => {
  test("the contract's example loads", () => {
    const c = loadConfig({}, { providers, models, agents: [talker], voice: { agent: "talker" } } as never);
    assert.equal(c.models[0]!.kind, "realtime");
    assert.equal(c.agents[0]!.turn_detection, "semantic_vad");
  });
  test("refused: a realtime model on another provider kind, with fallbacks; realtime fields on a chat agent; memory without a chat model", () => {
    refused({ providers, models: [...models, { id: "x", kind: "realtime", provider: "claude", upstream_model: "x" }] }, "models.3.provider");
    refused({ providers, models: [models[0], { ...models[1], fallbacks: ["live"] }] }, "models.1.fallbacks");
    refused({ providers, models, agents: [{ id: "a", model: "chat", turn_detection: "node" }] }, "agents.0.turn_detection");
    refused({ providers, models, agents: [{ id: "a", model: "chat", input_transcription: false }] }, "agents.0.input_transcription");
    refused({ providers, models, agents: [{ ...talker, turn_detection: "push_to_talk" }] }, "agents.0.turn_detection");
    refused({ providers, models, agents: [{ ...talker, memory: { enabled: true } }] }, "agents.0.memory.model");
    loadConfig({}, { providers, models, agents: [{ ...talker, memory: { enabled: true, model: "chat" } }] } as never);
  });
});

describe("the realtime wire (GA events)", () => {
  const base = { instructions: "Be brief.", voice: "marin", transcription: "gpt-4o-mini-transcribe" as const, tools: [] };
  test("session.update: turn detection as the agent says, interrupt_response false with barge-in off, node is null", () => {
    const td = (u: Record<string, unknown>) => (u.session as { audio: { input: { turn_detection: unknown } } }).audio.input.turn_detection;
    assert.deepEqual(td(sessionUpdate({ ...base, turnDetection: "server_vad", bargeIn: true }, "e1")), { type: "server_vad" });
    assert.deepEqual(td(sessionUpdate({ ...base, turnDetection: "semantic_vad", bargeIn: false }, "e1")), { type: "semantic_vad", interrupt_response: false });
    assert.equal(td(sessionUpdate({ ...base, turnDetection: "node", bargeIn: true }, "e1")), null);
    const none = sessionUpdate({ ...base, transcription: false, turnDetection: "server_vad", bargeIn: true }, "e1");
    assert.equal((none.session as { audio: { input: { transcription: unknown } } }).audio.input.transcription, null);
  });
  test("URLs: https to wss, http to ws, the model as a query", () => {
    assert.equal(realtimeUrl("https://api.openai.com/v1", "gpt-realtime"), "wss://api.openai.com/v1/realtime?model=gpt-realtime");
    assert.equal(realtimeUrl("http://rt-box:9000/v1/", "a b"), "ws://rt-box:9000/v1/realtime?model=a+b");
  });
  test("history as text items: user input_text, assistant output_text", () => {
    assert.deepEqual(
      historyItems([
        { role: "user", content: "Hi." },
        { role: "assistant", content: "Hello." },
        { role: "user", content: "" },
      ]).map((e) => e.item),
      [
        { type: "message", role: "user", content: [{ type: "input_text", text: "Hi." }] },
        { type: "message", role: "assistant", content: [{ type: "output_text", text: "Hello." }] },
      ],
    );
  });
});

describe("the realtime server events (one zod union, src/voice/realtime/events.ts)", () => {
  test("read by type, typed: the fields Perch reads, nothing else", () => {
    const e = parseServerEvent(JSON.stringify({ type: "response.output_audio.delta", response_id: "r1", item_id: "i1", delta: "AAAA", extra: { big: 1 } }));
    assert.deepEqual(e, { type: "response.output_audio.delta", response_id: "r1", item_id: "i1", delta: "AAAA" });
    const done = parseServerEvent(
      JSON.stringify({ type: "response.done", response: { id: "r1", status: "completed", usage: { input_tokens: 3, output_tokens: 5 } } }),
    );
    assert.equal(done?.type === "response.done" && done.response?.usage?.output_tokens, 5);
  });
  test("untrusted: a field of the wrong type reads as absent, the event stays; other types, non-objects and bad JSON are no events", () => {
    assert.deepEqual(parseServerEvent(JSON.stringify({ type: "response.output_audio.delta", response_id: 7, item_id: ["x"], delta: null })), {
      type: "response.output_audio.delta",
      response_id: undefined,
      item_id: undefined,
      delta: undefined,
    });
    const created = parseServerEvent(JSON.stringify({ type: "session.created", session: { expires_at: "soon" } }));
    assert.deepEqual(created, { type: "session.created", session: { expires_at: undefined } });
    assert.deepEqual(parseServerEvent(JSON.stringify({ type: "response.created", response: "r1" })), { type: "response.created", response: undefined });
    for (const frame of ['{"type":"rate_limits.updated"}', '{"type":42}', "[]", "null", '"error"', "{not json"])
      assert.equal(parseServerEvent(frame), undefined, frame);
  });
  test("an error's parts bounded (they reach the log and the device)", () => {
    const e = parseServerEvent(JSON.stringify({ type: "error", error: { type: "server_error", message: "m".repeat(10_000), event_id: "perch_setup_1" } }));
    assert.ok(e?.type === "error");
    const err = errorOf(e);
    assert.deepEqual([err.code, err.message.length, err.eventId], ["server_error", 500, "perch_setup_1"]);
  });
});

describe("the Compatible API and realtime models", () => {
  let server: TestNode;
  let token: string;
  before(async () => {
    server = await startTestNode({ config: { providers, models, agents: [talker, { id: "writer", model: "chat" }] } as never });
    const device = server.client();
    await device.login();
    token = device.accessToken!;
  });
  after(async () => {
    await server?.stop();
  });

  test("/models lists the realtime model and agent with their kind", async () => {
    const res = await server.fetch(`${server.url}/openai/v1/models`, { headers: { authorization: `Bearer ${token}` } });
    const { data } = (await res.json()) as { data: Array<{ id: string; kind?: string }> };
    const kinds = Object.fromEntries(data.map((m) => [m.id, m.kind]));
    assert.equal(kinds.live, "realtime");
    assert.equal(kinds.box, "realtime");
    assert.equal(kinds.talker, "realtime");
    assert.ok("chat" in kinds && kinds.chat === undefined);
    assert.ok("writer" in kinds && kinds.writer === undefined);
  });

  test("/chat/completions refuses a realtime model and an agent whose model is realtime: 400 model_not_supported", async () => {
    for (const model of ["live", "talker"]) {
      for (const stream of [false, true]) {
        const res = await server.fetch(`${server.url}/openai/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
          body: JSON.stringify({ model, stream, messages: [{ role: "user", content: "hi" }] }),
        });
        assert.equal(res.status, 400, model);
        const { error } = (await res.json()) as { error: { code: string; param: string; type: string } };
        assert.deepEqual([error.code, error.param, error.type], ["model_not_supported", "model", "invalid_request_error"]);
      }
    }
  });
});
