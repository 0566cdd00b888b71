/**
 * The trace of a voice turn (voice.md §8), fast: a conversation with fake engines on a fake clock
 * (test/support/fake-voice.ts), its spans exported by the node's tracing through the OpenTelemetry
 * SDK to an OTLP/HTTP receiver decoding the specification's messages.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Registry } from "prom-client";
import { Tracing } from "../src/observability/tracing.ts";
import { pieces, type Rig, rig } from "./support/fake-voice.ts";
import { OtlpReceiver, type ReceivedSpan } from "./support/otlp-receiver.ts";

async function ask(r: Rig): Promise<void> {
  await r.talk(600);
  await r.talk(600, false);
}

async function untilTurn(r: Rig, n: number): Promise<Record<string, unknown>> {
  for (let t = 0; t < 60_000 && !r.turnMetrics(n); t += 100) await r.wait(100);
  const m = r.turnMetrics(n);
  assert.ok(m, `turn ${n} finished`);
  return m;
}

function tracingTo(endpoint: string, includeText = false): Tracing {
  const tracing = Tracing.of(
    {
      otlp: { endpoint, headers_env: {}, timeout_ms: 5000, max_queue_size: 2048, max_export_batch_size: 512, schedule_delay_ms: 1 },
      service_name: "perch",
      sample_ratio: 1,
      include_text: includeText,
    },
    { registry: new Registry(), node: "voice-test", version: "test" },
  );
  assert.ok(tracing);
  return tracing;
}

/** The spans of the trace whose root is the turn's, once its playout's span is in too. */
async function turnTrace(receiver: OtlpReceiver, n: number): Promise<{ root: ReceivedSpan; spans: ReceivedSpan[] }> {
  return await receiver.until((all) => {
    const root = all.find((s) => s.name === "voice.turn" && s.attributes["perch.voice.turn"] === n);
    if (!root) return undefined;
    const spans = receiver.trace(root.traceId);
    return spans.some((s) => s.name === "voice.transcription") ? { root, spans } : undefined;
  });
}

const ms = (s: ReceivedSpan) => Number(s.endUnixNano - s.startUnixNano) / 1e6;

describe("tracing: a voice turn (fake engines, fake clock)", () => {
  let receiver: OtlpReceiver;
  let tracing: Tracing;

  before(async () => {
    receiver = await OtlpReceiver.start();
    tracing = tracingTo(receiver.endpoint);
  });

  after(async () => {
    await tracing?.shutdown();
    await receiver?.close();
  });

  test("one trace per turn: voice.turn with the end of turn, the transcription, the model call's parent, each synthesis and the playout; no words", async () => {
    const r = await rig({}, { tracing });
    await ask(r);
    const m = await untilTurn(r, 1);
    const { root, spans } = await turnTrace(receiver, 1);
    await receiver.until((all) => all.filter((s) => s.traceId === root.traceId).some((s) => s.name === "voice.playout"));
    const trace = receiver.trace(root.traceId);
    assert.equal(root.parentSpanId, "");
    assert.deepEqual(
      [root.attributes["gen_ai.agent.id"], root.attributes["gen_ai.conversation.id"], root.attributes["perch.voice.outcome"]],
      ["talker", "conversation-1", "answered"],
    );
    const names = trace.filter((s) => s !== root).map((s) => s.name);
    assert.deepEqual(
      [...new Set(names)].sort(),
      ["voice.end_of_turn", "voice.playout", "voice.synthesis", "voice.transcription"],
      `the turn's children: ${names.join(", ")}`,
    );
    for (const s of trace) if (s !== root) assert.equal(s.parentSpanId, root.spanId, `${s.name} is the turn's child`);
    // Two sentences, each its own synthesis, with its engine, characters and time to first audio.
    const syntheses = trace.filter((s) => s.name === "voice.synthesis");
    assert.equal(syntheses.length, 2);
    assert.deepEqual(syntheses.map((s) => s.attributes["perch.voice.characters"]).sort(), ["Anything else?".length, "It is ten o'clock.".length].sort());
    for (const s of syntheses) {
      assert.equal(s.attributes["perch.voice.engine"], "fake-tts");
      assert.equal(typeof s.attributes["perch.voice.time_to_first_audio_ms"], "number");
    }
    // The stages' spans last what turn.metrics says.
    const eot = trace.find((s) => s.name === "voice.end_of_turn")!;
    assert.ok(Math.abs(ms(eot) - (m.end_of_speech as number)) < 1, `end of turn ${ms(eot)} ms, metrics ${m.end_of_speech}`);
    const transcription = trace.find((s) => s.name === "voice.transcription")!;
    assert.equal(transcription.attributes["perch.voice.engine"], "fake-stt");
    assert.ok(Math.abs(ms(transcription) - (m.transcription as number)) < 1);
    assert.equal(trace.find((s) => s.name === "voice.playout")!.attributes["perch.voice.interrupted"], false);
    // The model call was made under the turn's span (its gen_ai spans: tracing.test.ts).
    assert.equal(r.model.calls[0]?.trace?.traceId, root.traceId);
    // Nothing that was said or answered is an attribute.
    for (const s of spans.concat(trace))
      for (const v of Object.values(s.attributes)) assert.ok(!/time is it|ten o'clock|Anything else/.test(String(v)), `${s.name}: ${String(v)}`);
    r.close();
  });

  test("a turn whose model fails: the turn's span says failed", async () => {
    const r = await rig({}, { tracing });
    r.model.script = () =>
      (async function* () {
        yield* [];
        throw new Error("the provider failed");
      })();
    await ask(r);
    await untilTurn(r, 1);
    const root = await receiver.until((all) => all.find((s) => s.name === "voice.turn" && s.attributes["perch.voice.outcome"] === "failed"));
    assert.equal(root.failed, true);
    r.close();
  });

  test("with tracing.include_text the transcript and each sentence are attributes", async () => {
    const own = await OtlpReceiver.start();
    const withText = tracingTo(own.endpoint, true);
    try {
      const r = await rig({}, { tracing: withText });
      r.model.script = () => pieces(["It is ten o'clock. "]);
      await ask(r);
      await untilTurn(r, 1);
      const { spans } = await turnTrace(own, 1);
      assert.equal(spans.find((s) => s.name === "voice.transcription")?.attributes["perch.voice.transcript"], "What time is it?");
      const synthesis = await own.until((all) => all.find((s) => s.name === "voice.synthesis"));
      assert.equal(synthesis.attributes["perch.voice.text"], "It is ten o'clock.");
      r.close();
    } finally {
      await withText.shutdown();
      await own.close();
    }
  });
});
