import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import pino from "pino";
import { generateKeyPair } from "../src/crypto/keys.ts";
import type { PerchConnection } from "../src/sdk/webrtc.ts";
import { offerListed, volumeTool } from "./support/device-tools.ts";
import { engines } from "./support/engines.ts";
import { type FakeRealtime, type FakeSession, type Script, startFakeRealtime } from "./support/fake-realtime.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { type EventLog, heardFor, spoken, voiceDevice } from "./support/voice.ts";
import { connect, eventually } from "./support/webrtc.ts";

const KEY = "sk-realtime-test-secret-0123456789";
process.env.PERCH_TEST_REALTIME_KEY = KEY;

type LogLine = { level: number; msg: string; [k: string]: unknown };

function realtimeConfig(url: string, agent: Record<string, unknown> = {}, voice: Record<string, unknown> = {}) {
  return {
    providers: [{ id: "rt", kind: "openai-compatible" as const, base_url: url, api_key_env: "PERCH_TEST_REALTIME_KEY", timeout_ms: 3_000 }],
    models: [{ id: "live", kind: "realtime" as const, provider: "rt", upstream_model: "gpt-realtime" }],
    agents: [{ id: "talker", model: "live", instructions: "Be brief.", voice: "marin", tools: ["device.*"], ...agent }],
    voice: { agent: "talker", store_transcripts: true, ...voice },
  };
}

const outline = (log: EventLog, stream: string) =>
  log.of(stream).map((s) => `${s.type} ${s.label}${s.kind ? ` ${s.kind}` : ""}${s.error ? ` ${s.error.code}` : ""}`);
const metricsOf = async (log: EventLog, n: number) =>
  JSON.parse((await log.wait((s) => s.stream === `out-${n}` && s.label === "turn.metrics", 30_000, `turn ${n}'s metrics`)).text!) as Record<string, unknown>;

/** RTP packets of the downlink the device has received. */
function packetsReceived(conn: PerchConnection): Promise<number> {
  return conn.audioPacketsReceived();
}

describe("speech-to-speech agents over a realtime model (voice.md §6)", () => {
  let fake: FakeRealtime;
  let server: TestServer;
  const lines: LogLine[] = [];
  let question: Int16Array;

  before(async () => {
    fake = await startFakeRealtime();
    question = await spoken("What is the weather like today?");
    const logger = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line) as LogLine) });
    server = await startTestServer({ config: realtimeConfig(fake.url), engines: engines(), logger });
  });
  after(async () => {
    await server?.stop();
    await fake?.close();
  });

  /** A device on real WebRTC and its own session at the fake (open, set up). */
  async function device(): Promise<{ conn: PerchConnection; log: EventLog; say: (pcm: Int16Array) => Promise<void>; s: FakeSession }> {
    const before = fake.sessions.length;
    const { conn, log } = await voiceDevice(server);
    const mic = await conn.microphone();
    await fake.until(() => fake.sessions.slice(before).some((x) => x.session !== undefined), 10_000, "the device's session");
    const s = fake.sessions.slice(before).find((x) => x.session !== undefined)!;
    return { conn, log, say: (pcm) => mic.say(pcm), s };
  }

  test("a spoken question reaches the model as 24 kHz appends; its audio is heard; events and Side Control entries follow", async () => {
    fake.transcript = "What is the weather like today?";
    fake.script({ kind: "reply", text: "It is sunny and warm today.", ms: 1_200 });
    const owner = server.client();
    await owner.login();
    const phone = server.client();
    await phone.login({ deviceToken: (await owner.createDeviceToken()).token });
    const sessionsBefore = fake.sessions.length;
    const { conn, log } = await voiceDevice(server, { keyPair: owner.keyPair });
    const mic = await conn.microphone();
    // The session opens with the conversation, before anything is said.
    await fake.until(() => fake.sessions.length > sessionsBefore && fake.sessions.at(-1)!.session !== undefined, 10_000, "the session");
    const s = fake.sessions.at(-1)!;
    assert.equal(s.headers.authorization, `Bearer ${KEY}`);
    assert.equal(s.url, "/v1/realtime?model=gpt-realtime");
    assert.deepEqual(s.events[0], {
      type: "session.update",
      event_id: s.events[0]!.event_id,
      session: {
        type: "realtime",
        instructions: "Be brief.",
        output_modalities: ["audio"],
        audio: {
          input: { format: { type: "audio/pcm", rate: 24_000 }, transcription: { model: "gpt-4o-mini-transcribe" }, turn_detection: { type: "server_vad" } },
          output: { format: { type: "audio/pcm", rate: 24_000 }, voice: "marin" },
        },
        tools: [],
      },
    });
    conn.speaker.mark();
    await mic.say(question);
    const m = await metricsOf(log, 1);
    // The reply (1.2 s) was heard: the device's last audible block comes after the server's last frame, later still
    // on a loaded machine (its receiving stack lags), so wait for 800 ms of it rather than a fixed time.
    const replyHeardMs = () => {
      const { firstAudibleAt, lastAudibleAt } = conn.speaker;
      return firstAudibleAt === undefined ? 0 : lastAudibleAt! - firstAudibleAt;
    };
    await eventually(() => replyHeardMs() >= 800, 10_000, "800 ms of the reply heard").catch(() => {});
    assert.ok(replyHeardMs() >= 800, `heard ${Math.round(replyHeardMs())} ms`);
    assert.deepEqual(m.engines, { realtime: "rt" });
    assert.equal(m.interrupted, false);
    assert.equal(typeof m.speech_to_audio, "number");
    assert.equal(typeof m.first_audio, "number");
    assert.deepEqual(
      outline(log, "in-1").filter((e) => !e.startsWith("TEXT_DELTA")),
      ["BOS user.audio AUDIO", "EOS user.audio AUDIO", "TEXT_DONE user.transcript"],
    );
    assert.deepEqual(
      outline(log, "out-1").filter((e) => !e.startsWith("TEXT_DELTA")),
      ["BOS assistant.text TEXT", "BOS assistant.audio AUDIO", "TEXT_DONE assistant.text", "EOS assistant.audio AUDIO", "TEXT_DONE turn.metrics"],
    );
    assert.equal(log.all.find((e) => e.stream === "out-1" && e.type === "TEXT_DONE" && e.label === "assistant.text")!.text, "It is sunny and warm today.");
    // Appends of 20–100 ms each, at 24 kHz: the question's speech, counted in appended samples, lasts as long as it was said.
    for (const a of s.appends) assert.ok(a.samples >= 480 && a.samples <= 2_400, `an append of ${a.samples} samples`);
    const turn = fake.turns.at(-1)!;
    const heardMs = turn.audioEndMs! - turn.audioStartMs!;
    const saidMs = (question.length / 48_000) * 1000;
    assert.ok(heardMs > saidMs * 0.8 && heardMs < saidMs * 1.2, `${Math.round(heardMs)} ms of speech heard at 24 kHz; ${Math.round(saidMs)} ms said`);
    // The device's Side Control sees the turn as stored entries.
    const list = await phone.request<{ items: Array<{ id: string }> }>("GET", "/side-control/conversations");
    const entries = await phone.request<{ items: Array<{ role: string; text: string; turn: number }> }>(
      "GET",
      `/side-control/conversations/${list.items[0]!.id}`,
    );
    assert.deepEqual(
      entries.items.map((e) => [e.turn, e.role, e.text]),
      [
        [1, "user", "What is the weather like today?"],
        [1, "assistant", "It is sunny and warm today."],
      ],
    );
    conn.close();
  });

  test("a function call runs this device's own tool with the model's arguments; the output goes back with its call_id, then response.create", async () => {
    // Another device offers a tool of its own: it is never offered to this conversation's model.
    const before = fake.sessions.length;
    const other = await connect(server);
    await fake.until(() => fake.sessions.slice(before).some((x) => x.session !== undefined), 10_000, "the other device's session");
    await other.offerTools([{ name: "unlock_door", description: "Unlocks the door.", inputSchema: { type: "object" }, handler: async () => "unlocked" }]);
    const { conn, log, say, s } = await device();
    const { tool, got } = volumeTool({ answer: () => "volume is 3" });
    await offerListed(server, conn, [tool]);
    fake.script({ kind: "call", name: "device.set_volume", arguments: '{"level":3}', after: { kind: "reply", text: "Done, the volume is three.", ms: 600 } });
    await say(question);
    await metricsOf(log, 1);
    assert.deepEqual(got, [{ level: 3 }]);
    // The session was told of the device's tools before the model answered; the other device's never.
    const updates = s.events.filter((e) => e.type === "session.update");
    const tools = (updates.at(-1)!.session as { tools: Array<{ name: string; type: string; parameters: unknown }> }).tools;
    assert.deepEqual(
      tools.map((t) => [t.type, t.name]),
      [["function", "device.set_volume"]],
    );
    assert.ok(!JSON.stringify(updates).includes("unlock_door"));
    const output = s.events.find((e) => e.type === "conversation.item.create" && (e.item as { type: string }).type === "function_call_output")!;
    const call = output.item as { call_id: string; output: string };
    assert.equal(call.output, "volume is 3");
    assert.match(call.call_id, /^call_/);
    assert.equal(s.events[s.events.indexOf(output) + 1]!.type, "response.create");
    assert.deepEqual(
      log
        .of("out-1")
        .filter((e) => e.label.startsWith("tool."))
        .map((e) => [e.label, JSON.parse(e.text!)]),
      [
        ["tool.call", { name: "device.set_volume", arguments: { level: 3 } }],
        ["tool.result", { name: "device.set_volume", is_error: false, text: "volume is 3" }],
      ],
    );
    assert.equal(log.all.find((e) => e.stream === "out-1" && e.type === "TEXT_DONE" && e.label === "assistant.text")!.text, "Done, the volume is three.");
    conn.close();
    other.close();
  });

  test("max_steps bounds a model that keeps calling tools, as for text agents: the last step offers none (tool_choice none) and a call in it is not run", async () => {
    const { conn, log, say, s } = await device();
    let runs = 0;
    await conn.offerTools([
      {
        name: "next_page",
        description: "Reads the next page.",
        inputSchema: { type: "object" },
        handler: async () => `page ${++runs}`,
      },
    ]);
    // A model that calls the tool at every step, the last one too (max_steps: 4, the default).
    let script: Script = { kind: "call", name: "device.next_page", arguments: "{}", after: { kind: "reply", text: "The end.", ms: 200 } };
    for (let i = 0; i < 4; i++) script = { kind: "call", name: "device.next_page", arguments: "{}", after: script };
    fake.script(script);
    await say(question);
    await metricsOf(log, 1);
    assert.equal(runs, 3, "steps 1 to 3 run their calls; step 4 offers no tools");
    const creates = s.events.filter((e) => e.type === "response.create");
    assert.equal(creates.length, 3);
    assert.deepEqual(
      creates.map((e) => (e.response as { tool_choice?: string } | undefined)?.tool_choice),
      [undefined, undefined, "none"],
    );
    conn.close();
  });

  test("barge-in: the device's audio stops within 250 ms of speech_started; the truncate carries what was sent; nothing sent -> item.delete", async () => {
    // Four times faster than real time, its response still in progress when the user speaks over it
    // however slow the machine (held: a cancel is then Perch's to send).
    fake.script({ kind: "reply", text: "Once upon a time there was a very long story that went on and on.", ms: 20_000, speed: 4, held: true });
    const stop = await spoken("Stop, stop.");
    const { conn, log, say, s } = await device();
    conn.speaker.mark();
    const packetsBefore = await packetsReceived(conn);
    const turns = fake.turns.length;
    await say(question);
    await log.wait((e) => e.stream === "out-1" && e.type === "BOS" && e.label === "assistant.audio", 30_000, "the reply's audio");
    await fake.until(() => conn.speaker.firstAudibleAt !== undefined && fake.turns[turns]?.firstDeltaAt !== undefined, 10_000, "the first audio heard");
    // How long audio takes from the model to the device's ear (Perch, WebRTC, the device's jitter buffer): the stop is timed net of it.
    const path = conn.speaker.firstAudibleAt! - fake.turns[turns]!.firstDeltaAt!;
    await heardFor(conn, 1_000);
    // The barge-in's own reply comes late enough not to be mistaken for the first one's audio.
    fake.script({ kind: "reply", text: "Alright.", ms: 500, audioDelayMs: 3_000 });
    const startedBefore = fake.started.length;
    // The downlink's packets as the device counts them, every 10 ms: when the last one came.
    const counts: Array<[number, number]> = [];
    const poll = setInterval(() => {
      void packetsReceived(conn).then((n) => counts.push([performance.now(), n]));
    }, 10);
    await say(stop);
    const end = await log.wait((e) => e.stream === "out-1" && e.type === "EOS" && e.label === "assistant.audio", 15_000, "the reply's end");
    assert.deepEqual(end.error, { code: "interrupted", message: "" });
    await fake.until(() => s.events.some((e) => e.type === "conversation.item.truncate"), 10_000, "the truncate");
    const startedAt = fake.started[startedBefore]!;
    await new Promise((r) => setTimeout(r, 500));
    clearInterval(poll);
    const last = counts.at(-1)![1];
    const lastPacketAt = counts.find(([, n]) => n === last)![0];
    const truncate = s.events.find((e) => e.type === "conversation.item.truncate")! as unknown as {
      item_id: string;
      content_index: number;
      audio_end_ms: number;
    };
    // What Perch sent of the reply: its 20 ms packets the device received.
    const heard = ((await packetsReceived(conn)) - packetsBefore) * 20;
    const stoppedAfter = lastPacketAt - path - startedAt;
    assert.ok(stoppedAfter <= 250, `audio went on ${Math.round(stoppedAfter)} ms after speech_started (the path takes ${Math.round(path)} ms)`);
    assert.equal(truncate.content_index, 0);
    assert.ok(Math.abs(truncate.audio_end_ms - heard) <= 20, `truncated at ${truncate.audio_end_ms} ms; the device received ${heard} ms`);
    // The fake's own detector had cancelled the response: Perch's cancel got an error, which is harmless.
    assert.ok(s.events.some((e) => e.type === "response.cancel"));
    assert.ok(!lines.some((l) => l.msg === "the realtime session failed; reconnecting"), "its error answer is no failure");
    const m1 = await metricsOf(log, 1);
    assert.equal(m1.interrupted, true);
    const spokenText = log.all.find((e) => e.stream === "out-1" && e.type === "TEXT_DONE" && e.label === "assistant.text")!.text!;
    assert.ok(spokenText.length < "Once upon a time there was a very long story that went on and on.".length, `heard: ${spokenText}`);
    await metricsOf(log, 2);
    assert.equal(log.of("out-2").find((e) => e.type === "EOS")?.error, undefined, "the barge-in's own turn is answered");
    conn.close();
  });

  test("nothing sent before the barge-in: conversation.item.delete, never a 0 ms truncate", async () => {
    // The reply's words begin, its audio only seconds later: the user speaks again before any is sent.
    fake.script({ kind: "reply", text: "Never heard at all.", ms: 2_000, audioDelayMs: 10_000 });
    const { conn, log, say, s } = await device();
    await say(question);
    await log.wait((e) => e.stream === "out-1" && e.type === "BOS" && e.label === "assistant.text", 30_000, "the reply's text");
    fake.script({ kind: "reply", text: "Okay.", ms: 400 });
    await say(await spoken("Never mind."));
    await metricsOf(log, 2);
    assert.ok(
      s.events.some((e) => e.type === "conversation.item.delete"),
      "the unheard item is deleted",
    );
    assert.ok(!s.events.some((e) => e.type === "conversation.item.truncate"), "no truncate: no audio of it was sent");
    assert.equal((await metricsOf(log, 1)).interrupted, true);
    assert.equal(log.all.find((e) => e.stream === "out-1" && e.type === "TEXT_DONE" && e.label === "assistant.text")!.text, "", "nothing was heard");
    assert.ok(!log.of("out-1").some((e) => e.label === "assistant.audio"));
    conn.close();
  });

  test("a barge-in cancels a running tool: its output never goes back", async () => {
    fake.script({ kind: "call", name: "device.slow", arguments: "{}", after: { kind: "reply", text: "Never heard.", ms: 3_000 } });
    const { conn, log, say, s } = await device();
    let release: (() => void) | undefined;
    await conn.offerTools([
      {
        name: "slow",
        description: "Takes its time.",
        inputSchema: { type: "object" },
        handler: () =>
          new Promise((resolve) => {
            release = () => resolve("done");
          }),
      },
    ]);
    await say(question);
    await log.wait((e) => e.stream === "out-1" && e.label === "tool.call", 30_000, "the tool call");
    fake.script({ kind: "reply", text: "Okay.", ms: 400 });
    await say(await spoken("Never mind."));
    await metricsOf(log, 2);
    release?.();
    assert.ok(!s.events.some((e) => e.type === "conversation.item.create"), "no function_call_output");
    assert.equal((await metricsOf(log, 1)).interrupted, true);
    assert.ok(!log.of("out-1").some((e) => e.label === "tool.result"));
    conn.close();
  });

  test("failures end at most the turn: a dropped socket, an error event (the session kept), a model that never answers, a refused upgrade; the next turn is answered (on a new session with history)", async () => {
    const { conn, log, say } = await device();
    let n = 0;
    // A good turn first: the history the new sessions must carry.
    fake.transcript = "Remember the number seven.";
    fake.script({ kind: "reply", text: "Seven it is.", ms: 300 });
    await say(question);
    await metricsOf(log, ++n);
    for (const [what, script] of [
      ["a socket dropped mid-reply", { kind: "reply", text: "Cut off here.", ms: 3_000, speed: 1, dropAfterDeltas: 3 }],
      ["an error event", { kind: "error", code: "server_error", message: "the model fell over" }],
      ["no response.created", { kind: "silent" }],
    ] as const) {
      const sessions = fake.sessions.length;
      fake.script(script);
      await say(question);
      const m = await metricsOf(log, ++n);
      const failedEvents = log.of(`out-${n}`).filter((e) => e.type === "EOS" && e.error?.code === "failed");
      assert.ok(failedEvents.length >= 1, `${what}: the turn failed with events (${JSON.stringify(outline(log, `out-${n}`))})`);
      assert.equal(m.interrupted, false);
      if (what === "an error event") {
        // Recoverable (voice.md §6): only the turn failed, the session is kept.
        assert.equal(fake.sessions.length, sessions, `${what}: no new session`);
        assert.equal(fake.sessions.at(-1)!.closed, false, `${what}: the session is kept`);
        fake.script({ kind: "reply", text: "Back again.", ms: 300 });
        await say(question);
        await metricsOf(log, ++n);
        assert.equal(log.of(`out-${n}`).find((e) => e.type === "EOS")?.error, undefined, `${what}: the next turn is answered`);
        assert.equal(fake.sessions.length, sessions, `${what}: on the same session`);
        continue;
      }
      // A new session, reopened by itself, with the history as items.
      await fake.until(() => fake.sessions.length > sessions && fake.sessions.at(-1)!.session !== undefined, 15_000, `${what}: a new session`);
      const items = fake.sessions
        .at(-1)!
        .events.filter((e) => e.type === "conversation.item.create")
        .map((e) => e.item);
      assert.deepEqual(items.slice(0, 2), [
        { type: "message", role: "user", content: [{ type: "input_text", text: "Remember the number seven." }] },
        { type: "message", role: "assistant", content: [{ type: "output_text", text: "Seven it is." }] },
      ]);
      fake.script({ kind: "reply", text: "Back again.", ms: 300 });
      await say(question);
      const ok = await metricsOf(log, ++n);
      assert.equal(log.of(`out-${n}`).find((e) => e.type === "EOS")?.error, undefined, `${what}: the next turn is answered`);
      assert.deepEqual(ok.engines, { realtime: "rt" });
    }
    // One log line per failure, naming the provider's reason, never the key.
    const failures = lines.filter((l) => l.msg === "the realtime session failed; reconnecting");
    assert.ok(lines.some((l) => l.msg === "the realtime model reported an error" && String(l.reason).includes("the model fell over")));
    assert.ok(failures.some((l) => String(l.reason).includes("did not start its response")));
    // A refused upgrade (401 naming the key, 429, 503): retried with back-off; the conversation goes on.
    fake.refuse(401, `Incorrect API key provided: ${KEY}.`);
    fake.refuse(429, "Rate limit reached.");
    fake.refuse(503, "Service unavailable.");
    const sessions = fake.sessions.length;
    fake.sessions.at(-1)!.socket.terminate();
    await fake.until(() => fake.sessions.length > sessions && fake.sessions.at(-1)!.session !== undefined, 20_000, "a session after three refusals");
    const refusals = lines.filter((l) => l.msg === "the realtime session failed; reconnecting" && /HTTP (401|429|503)/.test(String(l.reason)));
    assert.deepEqual(
      refusals.map((l) => [String(l.reason).match(/HTTP (\d+)/)![1], l.retry_in_ms]),
      [
        ["401", 500],
        ["429", 1000],
        ["503", 2000],
      ],
    );
    assert.ok(!JSON.stringify(lines).includes(KEY), "the key is never logged");
    fake.script({ kind: "reply", text: "Still here.", ms: 300 });
    await say(question);
    await metricsOf(log, ++n);
    assert.equal(log.of(`out-${n}`).find((e) => e.type === "EOS")?.error, undefined);
    assert.equal(conn.connectionState, "connected", "the device's connection never ended");
    conn.close();
  });

  test("a session the provider ends for its age is renewed between turns without losing one", async () => {
    fake.maxAgeMs = 8_000;
    try {
      const failuresBefore = lines.filter((l) => l.msg === "the realtime session failed; reconnecting").length;
      const { conn, log, say, s: first } = await device();
      fake.script({ kind: "reply", text: "First.", ms: 300 });
      await say(question);
      await metricsOf(log, 1);
      // Renewed before its end (expires_at), not when it ends: it is closed by Perch, not expired by the provider.
      await fake.until(() => first.closed && fake.sessions.at(-1) !== first && fake.sessions.at(-1)!.session !== undefined, 15_000, "the renewed session");
      assert.equal(
        lines.filter((l) => l.msg === "the realtime session failed; reconnecting").length,
        failuresBefore,
        "no failure: the session was renewed before",
      );
      fake.maxAgeMs = undefined;
      const renewed = fake.sessions.at(-1)!;
      fake.script({ kind: "reply", text: "Second.", ms: 300 });
      await say(question);
      await metricsOf(log, 2);
      assert.equal(log.of("out-2").find((e) => e.type === "EOS")?.error, undefined);
      assert.ok(
        renewed.events.some((e) => e.type === "conversation.item.create"),
        "the history went to the new session",
      );
      assert.ok(!log.all.some((e) => e.error?.code === "failed"), "no turn failed");
      conn.close();
    } finally {
      fake.maxAgeMs = undefined;
    }
  });

  test("1,000,000 audio deltas faster than real time: memory stays bounded (the 60 s buffer) and the reply is cut", { timeout: 240_000 }, async () => {
    const { conn, log, say, s } = await device();
    fake.script({ kind: "flood", deltas: 1_000_000, deltaBytes: 480, text: "A flood of audio." });
    let peak = 0;
    const base = process.memoryUsage().arrayBuffers;
    const sampler = setInterval(() => {
      peak = Math.max(peak, process.memoryUsage().arrayBuffers - base);
    }, 20);
    try {
      await say(question);
      await log.wait((e) => e.stream === "out-1" && e.type === "BOS" && e.label === "assistant.audio", 30_000, "the reply's audio");
      await fake.until(() => s.events.some((e) => e.type === "response.cancel"), 60_000, "the cut's cancel");
      // The flood goes on past the cut, to its millionth delta: counted, not kept.
      await fake.until(() => fake.flooded >= 1_000_000, 110_000, "the whole flood");
    } finally {
      clearInterval(sampler);
    }
    // 1,000,000 deltas of 10 ms are 10,000 s of audio (480 MB): kept, they would show here.
    assert.ok(peak < 64 * 1024 * 1024, `array buffers grew by ${Math.round(peak / 1048576)} MB`);
    // The user speaks over the cut reply's last minute: its metrics say it was cut.
    fake.script({ kind: "reply", text: "Okay.", ms: 300 });
    await say(await spoken("Stop."));
    const m = await metricsOf(log, 1);
    assert.equal(m.reply_cut, true);
    assert.equal(m.interrupted, true);
    conn.close();
  });
});

describe("turn detection by the node's own voice activity (turn_detection: node)", () => {
  let fake: FakeRealtime;
  let server: TestServer;

  before(async () => {
    await engines().transcription?.start?.();
    fake = await startFakeRealtime();
    server = await startTestServer({ config: realtimeConfig(fake.url, { turn_detection: "node", input_transcription: false }), engines: engines() });
  });
  after(async () => {
    await server?.stop();
    await fake?.close();
  });

  test("the commit and response.create come from Perch's voice activity; the session has no turn detection and no transcription", async () => {
    const { conn, log } = await voiceDevice(server, { keyPair: generateKeyPair() });
    const mic = await conn.microphone();
    await fake.until(() => fake.sessions.at(-1)?.session !== undefined, 10_000, "the session");
    const s = fake.sessions.at(-1)!;
    const input = (s.session as { audio: { input: Record<string, unknown> } }).audio.input;
    assert.equal(input.turn_detection, null);
    assert.equal(input.transcription, null);
    fake.script({ kind: "reply", text: "Heard you.", ms: 400 });
    await mic.say(await spoken("What is the weather like today?"));
    await metricsOf(log, 1);
    const types = s.events.map((e) => e.type).filter((t) => t !== "input_audio_buffer.append");
    const commit = types.indexOf("input_audio_buffer.commit");
    assert.ok(commit > 0, `events: ${types.join(", ")}`);
    assert.equal(types[commit + 1], "response.create");
    assert.deepEqual(
      log.of("in-1").map((e) => `${e.type} ${e.label}`),
      ["BOS user.audio", "EOS user.audio"],
      "no transcription: no user transcript events",
    );
    assert.equal(log.all.find((e) => e.stream === "out-1" && e.type === "TEXT_DONE" && e.label === "assistant.text")!.text, "Heard you.");
    conn.close();
  });
});
