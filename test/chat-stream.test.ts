import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { type ChatEvent, type ChatPiece, ChatStream, RawChatPiece } from "../src/ai/chat-stream.ts";
import { ChunkWriter } from "../src/ai/chunks.ts";
import { JsonThread } from "../src/ai/json-thread.ts";
import { OpenAIProvider } from "../src/ai/providers/openai.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";

/** A provider's stream read each way, in process, against the fake provider on loopback. */
describe("chat stream: typed inside, bytes at the edge", () => {
  let upstream: FakeUpstream;
  let provider: OpenAIProvider;
  const o = { signal: new AbortController().signal, publicModel: "public-chat" };
  const request = { model: "up", messages: [{ role: "user" as const, content: "hi" }], stream: true, stream_options: { include_usage: true } };

  before(async () => {
    upstream = await startFakeUpstream();
    provider = new OpenAIProvider({ baseUrl: upstream.url, apiKey: undefined, timeoutMs: 600_000, json: new JsonThread() });
  });
  after(() => upstream.close());

  test("a pass-through's pieces carry the provider's bytes (model renamed), and read as typed chunks only when asked", async () => {
    upstream.reply({ chunks: ["Hel", "lo"], usage: { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 } });
    const stream = await provider.stream(request, o);
    const pieces: ChatPiece[] = [];
    for await (const p of stream.pieces()) pieces.push(p);
    const text = Buffer.concat(pieces.map((p) => p.raw!)).toString("utf8");
    assert.ok(text.endsWith("data: [DONE]\n\n"));
    assert.doesNotMatch(text, /"model":"up"/);
    const events = pieces.flatMap((p) => p.events);
    const chunks = events.flatMap((e) => (e.type === "chunk" ? [e.chunk] : []));
    assert.equal(chunks.map((c) => c.choices[0]?.delta.content ?? "").join(""), "Hello");
    assert.ok(chunks.every((c) => c.model === "public-chat"));
    assert.deepEqual(events.at(-1), { type: "done" });
    assert.deepEqual(stream.stats.usage, { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 });
  });

  test("sse() hands on the pass-through's own bytes, not a copy; read once", async () => {
    const raw = Buffer.from('data: {"id":"x","choices":[]}\n\ndata: [DONE]\n\n');
    const stream = new ChatStream(pieces([new RawChatPiece(raw)]));
    const out: Uint8Array[] = [];
    for await (const b of stream.sse()) out.push(b);
    assert.equal(out.length, 1);
    assert.equal(out[0], raw);
    assert.throws(() => stream.events(), /read once/);
  });

  test("Perch's own events are encoded once, at the edge, and read back the same", async () => {
    const w = new ChunkWriter("agent", true);
    const written: ChatEvent[] = [w.delta({ content: "a" }), ...w.finish("stop", { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 })];
    const bytes: Uint8Array[] = [];
    for await (const b of new ChatStream(pieces([{ events: written }])).sse()) bytes.push(b);
    assert.deepEqual(new RawChatPiece(Buffer.concat(bytes)).events, written);
  });

  test("leaving events() early ends the source (the provider's call)", async () => {
    upstream.reply({ chunks: ["a", "b", "c"], after: "hold" });
    const stream = await provider.stream(request, o);
    for await (const e of stream.events()) {
      if (e.type === "chunk") break;
    }
    await upstream.received.at(-1)!.aborted;
  });
});

async function* pieces(list: ChatPiece[]): AsyncGenerator<ChatPiece> {
  yield* list;
}
