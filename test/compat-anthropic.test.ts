import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import OpenAI from "openai";
import { startTestNode, type TestNode } from "./support/server.ts";

const KEY = "sk-perch-anthropic-test";

/** A provider speaking Anthropic's Messages API, as a real HTTP server with scripted answers. */
function anthropicServer(received: any[]) {
  return http.createServer((req, res) => {
    let text = "";
    req.on("data", (c) => (text += c));
    req.on("end", () => {
      const body = JSON.parse(text);
      received.push({ body, headers: req.headers });
      const lastUser = body.messages.at(-1);
      const wantsTool = body.tools?.length && lastUser.content.every((p: any) => p.type === "text");
      if (!body.stream) {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(
          JSON.stringify({
            id: "msg_1",
            type: "message",
            role: "assistant",
            model: body.model,
            content: wantsTool ? [{ type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Oslo" } }] : [{ type: "text", text: "Hej!" }],
            stop_reason: wantsTool ? "tool_use" : "end_turn",
            stop_sequence: null,
            usage: { input_tokens: 11, output_tokens: 2 },
          }),
        );
        return;
      }
      res.writeHead(200, { "content-type": "text/event-stream" });
      const send = (event: string, data: unknown) => res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
      send("message_start", {
        type: "message_start",
        message: {
          id: "msg_2",
          type: "message",
          role: "assistant",
          model: body.model,
          content: [],
          stop_reason: null,
          usage: { input_tokens: 11, output_tokens: 0 },
        },
      });
      send("content_block_start", { type: "content_block_start", index: 0, content_block: { type: "text", text: "" } });
      for (const piece of ["Hej", " då"]) send("content_block_delta", { type: "content_block_delta", index: 0, delta: { type: "text_delta", text: piece } });
      send("content_block_stop", { type: "content_block_stop", index: 0 });
      send("message_delta", { type: "message_delta", delta: { stop_reason: "end_turn", stop_sequence: null }, usage: { output_tokens: 3 } });
      send("message_stop", { type: "message_stop" });
      res.end();
    });
  });
}

describe("Compatible API: an anthropic provider through the AI SDK", () => {
  let server: TestNode;
  let upstream: http.Server;
  const received: any[] = [];
  let openai: OpenAI;

  before(async () => {
    upstream = anthropicServer(received);
    await new Promise<void>((r) => upstream.listen(0, "127.0.0.1", r));
    process.env.PERCH_TEST_ANTHROPIC_KEY = "anthropic-secret";
    server = await startTestNode({
      config: {
        providers: [
          {
            id: "claude",
            kind: "anthropic",
            base_url: `http://127.0.0.1:${(upstream.address() as AddressInfo).port}/v1`,
            api_key_env: "PERCH_TEST_ANTHROPIC_KEY",
            max_retries: 0,
          },
        ],
        models: [
          { id: "claude-chat", kind: "chat", provider: "claude", upstream_model: "test-model" },
          { id: "strict-claude", kind: "chat", provider: "claude", upstream_model: "claude-future-9" },
        ],
        api_keys: [{ name: "a", sha256: createHash("sha256").update(KEY).digest("hex") }],
      },
    });
    openai = new OpenAI({ apiKey: KEY, baseURL: `${server.url}/openai/v1`, maxRetries: 0, fetch: server.fetch });
  });
  after(async () => {
    await server?.stop();
    upstream?.close();
  });

  test("non-streaming: parameters translated, answer and usage in OpenAI's shape", async () => {
    const r = await openai.chat.completions.create({
      model: "claude-chat",
      messages: [
        { role: "system", content: "Be brief." },
        { role: "user", content: "Hello" },
      ],
      temperature: 0,
      max_tokens: 50,
      stop: ["END"],
    });
    assert.equal(r.model, "claude-chat");
    assert.equal(r.choices[0]?.message.content, "Hej!");
    assert.equal(r.choices[0]?.finish_reason, "stop");
    assert.deepEqual(r.usage, { prompt_tokens: 11, completion_tokens: 2, total_tokens: 13 });
    const sent = received.at(-1);
    assert.equal(sent.headers["x-api-key"], "anthropic-secret");
    assert.equal(sent.body.model, "test-model");
    assert.equal(sent.body.temperature, 0);
    assert.equal(sent.body.max_tokens, 50);
    assert.deepEqual(sent.body.stop_sequences, ["END"]);
    assert.match(JSON.stringify(sent.body.system), /Be brief/);
  });

  test("a parameter the provider package would drop for the model → 400 naming it, never silently ignored", async () => {
    for (const stream of [false, true]) {
      await assert.rejects(
        openai.chat.completions.create({ model: "strict-claude", messages: [{ role: "user", content: "Hello" }], temperature: 0.5, stream }),
        (err: any) => {
          assert.equal(err.status, 400);
          assert.equal(err.error.param, "temperature");
          return true;
        },
      );
    }
  });

  test("tool calls come back as OpenAI tool_calls", async () => {
    const r = await openai.chat.completions.create({
      model: "claude-chat",
      messages: [{ role: "user", content: "Weather in Oslo?" }],
      tools: [{ type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } } }],
    });
    assert.equal(r.choices[0]?.finish_reason, "tool_calls");
    const call = r.choices[0]?.message.tool_calls?.[0];
    assert.equal(call?.type === "function" && call.function.name, "get_weather");
    assert.deepEqual(JSON.parse(call?.type === "function" ? call.function.arguments : "{}"), { city: "Oslo" });
  });

  test("streaming with include_usage", async () => {
    const stream = await openai.chat.completions.create({
      model: "claude-chat",
      messages: [{ role: "user", content: "Hello" }],
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    assert.equal(chunks[0]?.choices[0]?.delta.role, "assistant");
    assert.equal(chunks.map((c) => c.choices[0]?.delta.content ?? "").join(""), "Hej då");
    assert.equal(chunks.at(-2)?.choices[0]?.finish_reason, "stop");
    assert.deepEqual(chunks.at(-1)?.usage, { prompt_tokens: 11, completion_tokens: 3, total_tokens: 14 });
  });
});
