/**
 * A realtime provider that sends what nobody bounded (issue: "a realtime provider must never hold
 * the node"), fast: the realtime activity (src/voice/realtime/activity.ts) in process on a fake clock, the provider a real WebSocket server
 * (the fake realtime model, or a bare one for reconnect storms) whose events the test writes.
 */
import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import { Registry } from "prom-client";
import { type WebSocket, WebSocketServer } from "ws";
import type { ToolKit } from "../src/ai/agents/toolbox.ts";
import { loadResampler } from "../src/audio/resampler.ts";
import { loadConfig } from "../src/config/config.ts";
import { VoiceMetrics } from "../src/voice/metrics.ts";
import { OpusCodec } from "../src/voice/opus.ts";
import { type VoiceEvent, VoiceEvents } from "../src/voice/peer-events.ts";
import { MAX_USER_TRANSCRIPT_CHARS, RealtimeActivity } from "../src/voice/realtime/activity.ts";
import { AudioQueue, BLOCK_BYTES } from "../src/voice/realtime/audio-queue.ts";
import { BACKOFF_MAX_MS, SESSION_PROVEN_MS } from "../src/voice/realtime/link.ts";
import { MAX_REPLY_ITEMS } from "../src/voice/realtime/turn.ts";
import { type FakeRealtime, type FakeSession, realtimeAgent, startFakeRealtime } from "./support/fake-realtime.ts";
import { FakeClock, settle } from "./support/fake-voice.ts";

type Line = { level: string; details: Record<string, unknown>; message: string };

/** Resolves once `pred` holds (polled; the provider's events arrive over a real socket). */
async function until(pred: () => boolean, what: string, ms = 10_000): Promise<void> {
  const end = performance.now() + ms;
  while (!pred()) {
    if (performance.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

async function sessionOn(url: string, voice: Record<string, unknown> = {}) {
  const clock = new FakeClock();
  const config = loadConfig({}, { voice } as never);
  const events: VoiceEvent[] = [];
  const lines: Line[] = [];
  const session = new RealtimeActivity({
    agent: realtimeAgent(url),
    config: config.voice,
    events: new VoiceEvents({ sendEvent: (e: VoiceEvent) => void events.push(e) } as never),
    tools: { definitions: () => [], displayName: (n: string) => n } as unknown as ToolKit,
    toolEvents: () => ({ called() {}, finished() {} }),
    activity: undefined,
    resampler: await loadResampler(),
    encoder: new OpusCodec(24_000),
    metrics: new VoiceMetrics(new Registry(), () => 1),
    clock,
    send: () => true,
    log: (level, details, message) => void lines.push({ level, details, message }),
  });
  const of = (stream: string, label?: string) => events.filter((e) => e.streamId === stream && (label === undefined || e.label === label));
  return { session, clock, events, lines, of };
}

const wsUrl = (fake: FakeRealtime) => `${fake.url.replace(/^http/, "ws")}/realtime?model=m`;
const send = (s: FakeSession, e: Record<string, unknown>) => s.socket.send(JSON.stringify(e));

/** The fake's session once set up, and a turn whose response `resp` has begun. */
async function turnBegun(fake: FakeRealtime, before: number, resp = "resp_1"): Promise<FakeSession> {
  await fake.until(() => fake.sessions.slice(before).some((x) => x.session !== undefined), 10_000, "the session");
  const s = fake.sessions.slice(before).find((x) => x.session !== undefined)!;
  send(s, { type: "input_audio_buffer.speech_started", item_id: "in_1" });
  send(s, { type: "input_audio_buffer.speech_stopped", item_id: "in_1" });
  send(s, { type: "response.created", response: { id: resp } });
  return s;
}

describe("a hostile realtime provider (fast)", () => {
  let fake: FakeRealtime;
  after(async () => {
    await fake?.close();
  });

  test("a reply's audio with a new item id in every delta keeps at most MAX_REPLY_ITEMS items (a barge-in cuts only those)", async () => {
    fake ??= await startFakeRealtime();
    const { session, of } = await sessionOn(wsUrl(fake));
    try {
      const s = await turnBegun(fake, 0);
      const delta = Buffer.alloc(64, 1).toString("base64");
      for (let i = 0; i < 3_000; i++) send(s, { type: "response.output_audio.delta", response_id: "resp_1", item_id: `it_${i}`, delta });
      for (let i = 0; i < 3_000; i++) send(s, { type: "response.output_audio_transcript.delta", response_id: "resp_1", item_id: `tx_${i}`, delta: "a " });
      // Speech over the reply: its items are cut (deleted, none was heard).
      send(s, { type: "input_audio_buffer.speech_started", item_id: "in_2" });
      await until(() => of("out-1", "turn.metrics").length === 1, "turn 1's metrics", 30_000);
      session.close();
      await fake.until(() => s.closed, 10_000, "the session's close");
      const cuts = s.events.filter((e) => e.type === "conversation.item.delete" || e.type === "conversation.item.truncate");
      assert.ok(cuts.length > 0 && cuts.length <= MAX_REPLY_ITEMS, `${cuts.length} items cut`);
    } finally {
      session.close();
    }
  });

  test("the reply's audio waits in coalesced blocks: 60,000 tiny deltas are a few hundred blocks, taken in order", () => {
    const q = new AudioQueue<string>();
    const piece = Buffer.alloc(32);
    for (let i = 0; i < 60_000; i++) {
      piece.writeUInt16LE(i & 0xffff, 0);
      q.push(i < 30_000 ? "a" : "b", piece);
    }
    assert.equal(q.bytes, 60_000 * 32);
    let blocks = 0;
    let bytes = 0;
    let firstOfB: number | undefined;
    for (let b = q.shift(); b; b = q.shift()) {
      blocks++;
      assert.ok(b.bytes.length <= BLOCK_BYTES);
      if (b.tag === "b" && firstOfB === undefined) firstOfB = bytes;
      // The first sample of every 32-byte piece says which piece it is: the order is kept.
      assert.equal(b.bytes.readUInt16LE(0), (bytes / 32) & 0xffff);
      bytes += b.bytes.length;
    }
    assert.equal(bytes, 60_000 * 32);
    assert.equal(firstOfB, 30_000 * 32, "one item's audio per block");
    assert.ok(blocks <= Math.ceil((60_000 * 32) / BLOCK_BYTES) + 1, `${blocks} blocks`);
    assert.equal(q.bytes, 0);
  });

  test("a reply's transcript is cut at voice.max_reply_chars (deltas and done), the response cancelled; the history keeps the cut text", async () => {
    fake ??= await startFakeRealtime();
    const before = fake.sessions.length;
    const { session, clock, lines, of } = await sessionOn(wsUrl(fake), { max_reply_chars: 100 });
    try {
      const s = await turnBegun(fake, before);
      for (let i = 0; i < 200; i++) send(s, { type: "response.output_audio_transcript.delta", response_id: "resp_1", item_id: "it_1", delta: "0123456789" });
      await until(() => of("out-1", "turn.metrics").length === 1, "turn 1's metrics");
      await fake.until(() => s.events.some((e) => e.type === "response.cancel"), 5_000, "the response's cancel");
      const told = of("out-1", "assistant.text")
        .filter((e) => e.type === "delta")
        .map((e) => (e as { text: string }).text)
        .join("");
      assert.equal(told.length, 100);
      // What was heard of it (none of its audio came: nothing), never more than was told.
      const done = of("out-1", "assistant.text").find((e) => e.type === "done") as { text: string };
      assert.ok(told.startsWith(done.text));
      assert.equal(JSON.parse((of("out-1", "turn.metrics")[0] as { text: string }).text).reply_cut, true);

      // A second turn whose transcript comes whole, far too long: cut too.
      send(s, { type: "input_audio_buffer.speech_started", item_id: "in_2" });
      send(s, { type: "input_audio_buffer.speech_stopped", item_id: "in_2" });
      send(s, { type: "response.created", response: { id: "resp_2" } });
      send(s, { type: "response.output_audio_transcript.delta", response_id: "resp_2", item_id: "it_2", delta: "Hi." });
      send(s, { type: "response.output_audio_transcript.done", response_id: "resp_2", item_id: "it_2", transcript: "x".repeat(1_000_000) });
      // The user's transcript too: told and kept up to its bound.
      send(s, { type: "conversation.item.input_audio_transcription.delta", item_id: "in_2", delta: "y".repeat(MAX_USER_TRANSCRIPT_CHARS * 2) });
      send(s, { type: "conversation.item.input_audio_transcription.completed", item_id: "in_2", transcript: "y".repeat(MAX_USER_TRANSCRIPT_CHARS * 2) });
      await until(() => of("out-2", "turn.metrics").length === 1, "turn 2's metrics");
      await until(() => of("in-2", "user.transcript").some((e) => e.type === "done"), "turn 2's transcript");
      assert.ok((of("out-2", "assistant.text").find((e) => e.type === "done") as { text: string }).text.length <= 100);
      const userDeltas = of("in-2", "user.transcript").filter((e) => e.type === "delta");
      assert.equal(userDeltas.map((e) => (e as { text: string }).text).join("").length, MAX_USER_TRANSCRIPT_CHARS);

      // The session drops: the new one is told a history whose texts are within their bounds.
      const sessions = fake.sessions.length;
      s.socket.terminate();
      // Reconnected at once (the fake clock's "at once").
      await until(() => lines.some((l) => l.message.startsWith("the realtime session failed")), "the session's failure");
      await clock.advance(0);
      await fake.until(() => fake.sessions.length > sessions && fake.sessions.at(-1)!.events.length >= 2, 10_000, "the reopened session's history");
      const history = fake.sessions
        .at(-1)!
        .events.filter((e) => e.type === "conversation.item.create")
        .map((e) => (e.item as { role: string; content: Array<{ text: string }> }).content[0]!.text);
      assert.ok(history.length >= 1, `${history.length} history items`);
      for (const text of history) assert.ok(text.length <= MAX_USER_TRANSCRIPT_CHARS, `a history text of ${text.length} characters`);
      assert.ok(history.filter((t) => t.startsWith("0123")).every((t) => t.length <= 100));
    } finally {
      session.close();
    }
  });

  test("an error event fails only the turn in progress; the session is kept; an error answering Perch's own cancel with no event id ends nothing", async () => {
    fake ??= await startFakeRealtime();
    const before = fake.sessions.length;
    const { session, of } = await sessionOn(wsUrl(fake));
    try {
      const s = await turnBegun(fake, before);
      send(s, { type: "error", error: { type: "server_error", code: "server_error", message: "The server had an error." } });
      await until(() => of("out-1", "turn.metrics").length === 1, "turn 1's end");
      const failedEos = of("out-1", "assistant.text").find((e) => e.type === "eos") as { error?: { code: string } };
      assert.equal(failedEos?.error?.code, "failed");
      // Turn 2 on the same session: a reply, then speech over it (Perch cancels), answered with an error without an event id.
      send(s, { type: "input_audio_buffer.speech_started", item_id: "in_2" });
      send(s, { type: "input_audio_buffer.speech_stopped", item_id: "in_2" });
      send(s, { type: "response.created", response: { id: "resp_2" } });
      send(s, { type: "response.output_audio_transcript.delta", response_id: "resp_2", item_id: "it_2", delta: "Well" });
      send(s, { type: "input_audio_buffer.speech_started", item_id: "in_3" });
      await fake.until(() => s.events.some((e) => e.type === "response.cancel"), 5_000, "Perch's cancel");
      send(s, {
        type: "error",
        error: { type: "invalid_request_error", code: "response_cancel_not_active", message: "Cancellation failed: no active response found", event_id: null },
      });
      send(s, { type: "input_audio_buffer.speech_stopped", item_id: "in_3" });
      send(s, { type: "response.created", response: { id: "resp_3" } });
      send(s, { type: "response.output_audio_transcript.delta", response_id: "resp_3", item_id: "it_3", delta: "Sure." });
      send(s, { type: "response.done", response: { id: "resp_3", status: "completed" } });
      await until(() => of("out-3", "turn.metrics").length === 1, "turn 3's end");
      assert.equal(JSON.parse((of("out-2", "turn.metrics")[0] as { text: string }).text).interrupted, true);
      for (const n of [2, 3]) {
        const failures = of(`out-${n}`).filter((e) => e.type === "eos" && (e as { error?: { code: string } }).error?.code === "failed");
        assert.deepEqual(failures, [], `turn ${n} did not fail`);
      }
      assert.equal((of("out-3", "assistant.text").find((e) => e.type === "done") as { text: string }).text, "Sure.");
      assert.equal(s.closed, false, "the session is kept");
      assert.equal(fake.sessions.length, before + 1, "no new session");
    } finally {
      session.close();
    }
  });

  test("a flood of error events is said once per turn, not once per event; the session is kept", async () => {
    fake ??= await startFakeRealtime();
    const before = fake.sessions.length;
    const { session, lines, of } = await sessionOn(wsUrl(fake));
    try {
      await fake.until(() => fake.sessions.slice(before).some((x) => x.session !== undefined), 10_000, "the session");
      const s = fake.sessions.slice(before).find((x) => x.session !== undefined)!;
      const error = { type: "error", error: { type: "server_error", code: "server_error", message: "The server had an error." } };
      // No turn going on: nothing fails, and the flood is not the log's (nor a megabyte of message).
      send(s, { type: "error", error: { type: "server_error", code: "server_error", message: "x".repeat(1_000_000) } });
      for (let i = 0; i < 2_000; i++) send(s, error);
      // Then a turn, and another flood during it: the turn fails once.
      send(s, { type: "input_audio_buffer.speech_started", item_id: "in_1" });
      send(s, { type: "input_audio_buffer.speech_stopped", item_id: "in_1" });
      send(s, { type: "response.created", response: { id: "resp_1" } });
      for (let i = 0; i < 2_000; i++) send(s, error);
      send(s, { type: "session.updated", session: {} });
      await until(() => of("out-1", "turn.metrics").length === 1, "turn 1's end");
      await until(() => s.events.length > 0 && lines.length > 0, "the lines");
      await settle();
      const warned = lines.filter((l) => l.level === "warn" && l.message === "the realtime model reported an error");
      assert.ok(warned.length >= 1 && warned.length <= 4, `${warned.length} warn lines for 4,000 error events`);
      assert.ok(
        warned.every((l) => String(l.details.reason).length <= 500),
        "the reason is bounded",
      );
      assert.equal(s.closed, false, "the session is kept");
    } finally {
      session.close();
    }
  });
});

describe("a provider that drops every session right after accepting it (fast)", () => {
  test("back-off grows to 10 s however often session.updated comes; said once per step; at once again after a session lived 30 s or answered", async () => {
    let connections = 0;
    let answer: ((ws: WebSocket) => void) | undefined;
    const wss = new WebSocketServer({ host: "127.0.0.1", port: 0, perMessageDeflate: false });
    wss.on("connection", (ws) => {
      connections++;
      ws.on("message", (data) => {
        const e = JSON.parse(data.toString()) as { type: string };
        if (e.type !== "session.update") return;
        ws.send(JSON.stringify({ type: "session.updated", session: {} }));
        if (answer) answer(ws);
        else setImmediate(() => ws.terminate());
      });
    });
    await new Promise((r) => wss.once("listening", r));
    const { port } = wss.address() as { port: number };
    const { session, clock, lines, of } = await sessionOn(`ws://127.0.0.1:${port}/v1/realtime?model=m`);
    const failures = () => lines.filter((l) => l.message.startsWith("the realtime session failed"));
    try {
      // Each failure's retry, the clock moved to it, until the back-off is at its longest for a while.
      let held: WebSocket | undefined;
      for (let i = 0; i < 10; i++) {
        await until(() => failures().length > i, `failure ${i + 1}`);
        // The session after the tenth failure stays.
        if (i === 9)
          answer = (ws) => {
            held = ws;
          };
        await clock.advance(Number(failures()[i]!.details.retry_in_ms));
      }
      const delays = failures().map((l) => l.details.retry_in_ms);
      assert.deepEqual(delays, [0, 500, 1_000, 2_000, 4_000, 8_000, BACKOFF_MAX_MS, BACKOFF_MAX_MS, BACKOFF_MAX_MS, BACKOFF_MAX_MS]);
      assert.deepEqual(
        failures().map((l) => l.level),
        ["warn", "warn", "warn", "warn", "warn", "warn", "warn", "debug", "debug", "debug"],
      );
      assert.ok(connections <= 11, `${connections} handshakes`);

      // A session that lives 30 s proves the provider works: its failure is retried at once.
      await until(() => held !== undefined, "a session that stays");
      await clock.advance(SESSION_PROVEN_MS);
      const n = failures().length;
      held!.terminate();
      await until(() => failures().length > n, "the lived session's failure");
      assert.equal(failures().at(-1)!.details.retry_in_ms, 0);
      assert.equal(failures().at(-1)!.level, "warn");

      // A session that answered a turn proves it too.
      held = undefined;
      await clock.advance(0);
      await until(() => held !== undefined, "the next session");
      const ws = held as unknown as WebSocket;
      ws.send(JSON.stringify({ type: "input_audio_buffer.speech_started", item_id: "in_1" }));
      ws.send(JSON.stringify({ type: "input_audio_buffer.speech_stopped", item_id: "in_1" }));
      ws.send(JSON.stringify({ type: "response.created", response: { id: "r1" } }));
      const delta = Buffer.alloc(960, 1).toString("base64");
      ws.send(JSON.stringify({ type: "response.output_audio.delta", response_id: "r1", item_id: "i1", delta }));
      ws.send(JSON.stringify({ type: "response.done", response: { id: "r1", status: "completed" } }));
      // The reply plays out on the fake clock.
      for (let i = 0; i < 50 && of("out-1", "turn.metrics").length === 0; i++) {
        await clock.advance(20);
        await settle();
      }
      assert.equal(of("out-1", "turn.metrics").length, 1, "the turn was answered");
      const m = failures().length;
      ws.terminate();
      await until(() => failures().length > m, "the answering session's failure");
      assert.equal(failures().at(-1)!.details.retry_in_ms, 0);
    } finally {
      session.close();
      for (const c of wss.clients) c.terminate();
      await new Promise((r) => wss.close(r));
    }
  });
});
