/**
 * Traces end to end (voice.md §8): a device on real WebRTC speaks to a node whose agent converses
 * over a realtime model (a fake realtime server); the node exports through the OpenTelemetry SDK
 * to an OTLP/HTTP receiver decoding the specification's messages. The text agent's turn tree is
 * checked in the fast layer (tracing-voice.test.ts).
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import pino from "pino";
import { engines } from "./support/engines.ts";
import { type FakeRealtime, startFakeRealtime } from "./support/fake-realtime.ts";
import { OtlpReceiver } from "./support/otlp-receiver.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { spoken, voiceDevice } from "./support/voice.ts";

const KEY = "sk-realtime-trace-test-0123456789";
process.env.PERCH_TEST_REALTIME_TRACE_KEY = KEY;
type LogLine = { msg: string; [k: string]: unknown };

describe("tracing end to end: a realtime voice turn over WebRTC", () => {
  let fake: FakeRealtime;
  let receiver: OtlpReceiver;
  let server: TestServer;
  const lines: LogLine[] = [];

  before(async () => {
    fake = await startFakeRealtime();
    receiver = await OtlpReceiver.start();
    const logger = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line) as LogLine) });
    server = await startTestServer({
      engines: engines(),
      logger,
      config: {
        providers: [{ id: "rt", kind: "openai-compatible", base_url: fake.url, api_key_env: "PERCH_TEST_REALTIME_TRACE_KEY", timeout_ms: 3_000 }],
        models: [{ id: "live", kind: "realtime", provider: "rt", upstream_model: "gpt-realtime" }],
        agents: [{ id: "talker", model: "live", instructions: "Be brief.", voice: "marin" }],
        voice: { agent: "talker", store_transcripts: true },
        tracing: { otlp: { endpoint: receiver.endpoint, schedule_delay_ms: 5 } },
      },
    });
  });

  after(async () => {
    await server?.stop();
    await fake?.close();
    await receiver?.close();
  });

  test("the turn is one trace: voice.turn with the realtime session's events and the playout; its log line carries the trace id; no words", async () => {
    fake.transcript = "What is the weather like today?";
    fake.script({ kind: "reply", text: "It is sunny and warm today.", ms: 600 });
    const { conn, log } = await voiceDevice(server);
    const mic = await conn.microphone();
    await fake.until(() => fake.sessions.some((s) => s.session !== undefined), 10_000, "the session");
    await mic.say(await spoken("What is the weather like today?"));
    await log.wait((s) => s.stream === "out-1" && s.label === "turn.metrics", 30_000, "turn 1's metrics");
    const root = await receiver.until((all) => all.find((s) => s.name === "voice.turn" && s.attributes["perch.voice.turn"] === 1), 20_000);
    assert.deepEqual(
      [root.attributes["gen_ai.agent.id"], root.attributes["perch.voice.engine.realtime"], root.attributes["perch.voice.outcome"]],
      ["talker", "rt", "answered"],
    );
    assert.match(String(root.attributes["gen_ai.conversation.id"]), /^[0-9a-f-]{36}$/);
    assert.equal(root.resource["service.name"], "perch");
    const events = root.events.map((e) => e.name);
    for (const type of [
      "input_audio_buffer.speech_started",
      "input_audio_buffer.speech_stopped",
      "response.created",
      "response.output_audio.delta",
      "response.done",
    ])
      assert.ok(events.includes(type), `the session's ${type} on the turn's span: ${events.join(", ")}`);
    assert.equal(events.filter((e) => e === "response.output_audio.delta").length, 1, "only the reply's first audio delta");
    const playout = await receiver.until((all) => all.find((s) => s.name === "voice.playout" && s.traceId === root.traceId));
    assert.equal(playout.parentSpanId, root.spanId);
    assert.equal(playout.attributes["perch.voice.interrupted"], false);
    const line = lines.find((l) => l.msg === "voice turn" && l.turn === 1);
    assert.equal(line?.trace_id, root.traceId, "the turn's log line carries its trace id");
    for (const s of receiver.trace(root.traceId)) {
      const texts = [...Object.values(s.attributes), ...s.events.flatMap((e) => Object.values(e.attributes))].map(String);
      for (const t of texts) assert.ok(!/weather|sunny/.test(t), `${s.name}: ${t}`);
    }
    await conn.close();
  });
});
