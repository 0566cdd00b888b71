import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { wavFile } from "../src/audio/samples.ts";
import type { PerchConnection } from "../src/sdk/webrtc.ts";
import { engines } from "./support/engines.ts";
import { type FakeSpeechProvider, startFakeSpeechProvider, startSpeechNode, tone } from "./support/fake-speech.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { wordErrorRate } from "./support/speech.ts";
import { type EventLog, resample, spoken, voiceDevice } from "./support/voice.ts";
import { within } from "./support/webrtc.ts";

const QUESTION = "What is the weather like today?";
const ANSWER = "It is sunny and warm today. Is there anything else you would like to know?";

async function device(server: TestServer): Promise<{ conn: PerchConnection; log: EventLog; say: (pcm: Int16Array) => Promise<void> }> {
  const { conn, log } = await voiceDevice(server);
  const mic = await conn.microphone();
  return { conn, log, say: (pcm) => mic.say(pcm) };
}

const metricsOf = async (log: EventLog, n: number) =>
  JSON.parse((await log.wait((s) => s.stream === `out-${n}` && s.label === "turn.metrics", 60_000, `turn ${n}'s metrics`)).text!) as Record<string, unknown>;

/** The reply stream's events of turn `n`, as `TYPE label[ error]`. */
const outline = (log: EventLog, n: number) =>
  log.of(`out-${n}`).map((s) => `${s.type} ${s.label}${s.kind ? ` ${s.kind}` : ""}${s.error ? ` ${s.error.code}` : ""}`);

describe("voice conversations with a second Perch as the speech provider", () => {
  const KEY = "sk-front-node";
  let upstream: FakeUpstream;
  let nodeA: TestServer;
  let nodeB: TestServer;

  before(async () => {
    // Voice activity is the node's own: its models load before the first question (on a loaded machine their first load outlasts the detector's backlog).
    await engines().transcription?.start?.();
    upstream = await startFakeUpstream();
    process.env.PERCH_TEST_NODE_A_KEY = KEY;
    // Node A: the speech node, its embedded tts-1 and whisper-1 on its Compatible API.
    nodeA = await startSpeechNode(KEY);
    // Node B: devices converse here; it hears and speaks through node A.
    nodeB = await startTestServer({
      config: {
        providers: [
          { id: "local", kind: "openai-compatible", base_url: upstream.url, max_retries: 0 },
          { id: "node-a", kind: "openai-compatible", base_url: `${nodeA.url}/openai/v1`, api_key_env: "PERCH_TEST_NODE_A_KEY", max_retries: 0 },
        ],
        models: [
          { id: "chat", kind: "chat", provider: "local", upstream_model: "scripted" },
          { id: "remote-tts", kind: "speech", provider: "node-a", upstream_model: "tts-1" },
          { id: "remote-stt", kind: "transcription", provider: "node-a", upstream_model: "whisper-1", stream: true },
        ],
        agents: [
          { id: "talker", model: "chat", instructions: "You speak briefly.", voice: "alloy", speech_model: "remote-tts", transcription_model: "remote-stt" },
        ],
        voice: { agent: "talker" },
      },
      engines: engines(),
    });
  });
  after(async () => {
    await nodeB?.stop();
    await nodeA?.stop();
    await upstream?.close();
  });

  test("a spoken question on B is transcribed by A, answered, spoken by A and heard at the device; events and metrics name A", async () => {
    upstream.reply({ chunks: ["It is sunny ", "and warm today. Is there anything ", "else you would like to know?"] });
    const aBefore = await (await fetch(`${nodeA.url}/metrics`)).text();
    const { conn, log, say } = await device(nodeB);
    conn.speaker.record();
    await say(await spoken(QUESTION));
    const metrics = await metricsOf(log, 1);
    assert.deepEqual(metrics.engines, { transcription: "node-a", speech: "node-a" });
    const transcript = log.all.find((s) => s.stream === "in-1" && s.type === "TEXT_DONE")!.text!;
    assert.ok(wordErrorRate(QUESTION, transcript) <= 0.4, `transcript: ${transcript}`);
    assert.deepEqual(
      outline(log, 1).filter((e) => !e.startsWith("TEXT_DELTA")),
      ["BOS assistant.text TEXT", "BOS assistant.audio AUDIO", "TEXT_DONE assistant.text", "EOS assistant.audio AUDIO", "TEXT_DONE turn.metrics"],
    );
    // What the device heard says the answer (recognised here by the embedded recogniser directly).
    await new Promise((r) => setTimeout(r, 300));
    const heard48 = conn.speaker.take();
    const heard = await engines().transcription!.transcribe({ audio: wavFile(await resample(heard48, 48_000, 16_000), 16_000) });
    assert.ok(wordErrorRate(ANSWER, heard.text) < 0.5, `heard: ${heard.text}`);
    // A did the work: its Compatible API counted the speech and transcription requests.
    const aAfter = await (await fetch(`${nodeA.url}/metrics`)).text();
    const count = (text: string, route: string) =>
      [...text.matchAll(new RegExp(`^perch_ai_requests_total\\{[^}]*route="${route.replace("/", "\\/")}"[^}]*\\} (\\d+)`, "gm"))].reduce(
        (n, m) => n + Number(m[1]),
        0,
      );
    assert.ok(count(aAfter, "/audio/speech") > count(aBefore, "/audio/speech"), "A synthesised the reply");
    assert.ok(count(aAfter, "/audio/transcriptions") > count(aBefore, "/audio/transcriptions"), "A transcribed the question");
    const bMetrics = await (await fetch(`${nodeB.url}/metrics`)).text();
    assert.match(bMetrics, /perch_voice_stage_seconds_count\{[^}]*engine="node-a"[^}]*\} \d+/);
    conn.close();
  });
});

/** Devices converse with agent `talker`, its speech on `speechModel` of the fake provider at `fakeUrl` (`box-tts`, or `box-tts-safe` falling back to tts-1). */
function speechboxConfig(upstreamUrl: string, fakeUrl: string, speechModel: "box-tts" | "box-tts-safe", provider: { timeout_ms?: number } = {}) {
  return {
    providers: [
      { id: "local", kind: "openai-compatible" as const, base_url: upstreamUrl, max_retries: 0 },
      { id: "speechbox", kind: "openai-compatible" as const, base_url: fakeUrl, max_retries: 0, ...provider },
    ],
    models: [
      { id: "chat", kind: "chat" as const, provider: "local", upstream_model: "scripted" },
      { id: "box-tts", kind: "speech" as const, provider: "speechbox", upstream_model: "kokoro" },
      { id: "box-tts-safe", kind: "speech" as const, provider: "speechbox", upstream_model: "kokoro", fallbacks: ["tts-1"] },
      { id: "box-stt", kind: "transcription" as const, provider: "speechbox", upstream_model: "whisper-large" },
    ],
    agents: [
      { id: "talker", model: "chat", voice: speechModel === "box-tts" ? "af_bella" : "alloy", speech_model: speechModel, transcription_model: "box-stt" },
    ],
    voice: { agent: "talker" },
  };
}

describe("voice conversations with a fake speech provider", () => {
  // The fake provider does the hearing, so a question needs to be speech, not these words: a short one, synthesised once.
  let short: Promise<Int16Array> | undefined;
  const shortQuestion = () => (short ??= spoken("Hello there."));
  let upstream: FakeUpstream;
  let fake: FakeSpeechProvider;
  let server: TestServer;

  before(async () => {
    // Voice activity is the node's own: its models load before the first question (on a loaded machine their first load outlasts the detector's backlog).
    await engines().transcription?.start?.();
    upstream = await startFakeUpstream();
    fake = await startFakeSpeechProvider();
    server = await startTestServer({ config: speechboxConfig(upstream.url, fake.url, "box-tts", { timeout_ms: 1_500 }), engines: engines() });
  });
  after(async () => {
    await server?.stop();
    await fake?.close();
    await upstream?.close();
  });

  test("the first reply audio leaves Perch before the provider has finished the sentence", async () => {
    upstream.reply({ content: "Here is a long answer." });
    // Every recognition of the turn (a pause's, maybe several, and the end's) hears the same.
    fake.defaultTranscription = { kind: "text", text: "Tell me something." };
    const { conn, log, say } = await device(server);
    // The provider sends its first 100 ms, then holds the rest until the device has seen the reply's audio begin.
    fake.speech({
      kind: "pcm",
      pcm: tone(1500),
      pieceMs: 100,
      gate: (i) =>
        i === 1 ? log.wait((s) => s.stream === "out-1" && s.type === "BOS" && s.label === "assistant.audio", 30_000).then(() => {}) : Promise.resolve(),
    });
    await say(await shortQuestion());
    const metrics = await metricsOf(log, 1);
    assert.deepEqual(metrics.engines, { transcription: "speechbox", speech: "speechbox" });
    const request = fake.of("/audio/speech").at(-1)!;
    assert.deepEqual(request.fields, { model: "kokoro", input: "Here is a long answer.", voice: "af_bella", response_format: "pcm" });
    await within(request.finished, 30_000, "the provider's answer written whole");
    assert.equal(log.of("out-1").find((s) => s.type === "EOS" && s.label === "assistant.audio")?.error, undefined);
    // The turn went as a 16 kHz WAV.
    const upload = fake.of("/audio/transcriptions").at(-1)!;
    assert.equal(upload.file!.readUInt32LE(24), 16_000);
    assert.equal(log.all.find((s) => s.stream === "in-1" && s.type === "TEXT_DONE")?.text, "Tell me something.");
    conn.close();
  });

  test("barge-in aborts the provider's synthesis request: it sees its connection close", async () => {
    upstream.reply({ content: "This reply goes on for a long while." });
    fake.defaultTranscription = { kind: "text", text: "Play music." };
    // Ten seconds of audio sent at real time: the barge-in comes long before its end.
    fake.speech({ kind: "pcm", pcm: tone(10_000), pieceMs: 100, delayMs: 100 });
    const { conn, log, say } = await device(server);
    await say(await spoken("Play some music in the living room."));
    await log.wait((s) => s.stream === "out-1" && s.type === "BOS" && s.label === "assistant.audio", 30_000, "the reply's audio");
    const synthesis = fake.of("/audio/speech").at(-1)!;
    upstream.reply({ content: "Alright." });
    await say(await spoken("Call my mother tomorrow morning."));
    const end = await log.wait((s) => s.stream === "out-1" && s.type === "EOS" && s.label === "assistant.audio", 30_000, "the reply's end");
    assert.equal(end.error?.code, "interrupted");
    // Within 1 s of the reply's end, below the provider's 1.5 s stall timeout and the 10 s of audio:
    // only the barge-in's abort closes the request that soon.
    await within(synthesis.closedEarly, 1_000, "the provider's request closed by the barge-in");
    await metricsOf(log, 2);
    conn.close();
  });

  const failures: Array<{ name: string; act: () => void; stage: "speech" | "transcription"; message: RegExp }> = [
    { name: "a 500", stage: "speech", act: () => fake.speechFor("First answer.", { kind: "status", status: 500 }), message: /fake provider says 500/ },
    {
      name: "a 429",
      stage: "speech",
      act: () => fake.speechFor("First answer.", { kind: "status", status: 429, retryAfter: "0" }),
      message: /fake provider says 429/,
    },
    { name: "a stall", stage: "speech", act: () => fake.speechFor("First answer.", { kind: "stall", pieces: 0 }), message: /did not answer in time/ },
    { name: "HTML instead of audio", stage: "speech", act: () => fake.speechFor("First answer.", { kind: "html" }), message: /text\/html instead of PCM/ },
    {
      name: "a wrong sample rate",
      stage: "speech",
      act: () => fake.speechFor("First answer.", { kind: "pcm", contentType: "audio/pcm; rate=16000" }),
      message: /16000 Hz instead of 24000 Hz/,
    },
    {
      name: "a transcription that never answers",
      stage: "transcription",
      act: () => {
        fake.defaultTranscription = { kind: "hang" };
      },
      message: /did not answer in time/,
    },
  ];
  for (const f of failures) {
    test(`${f.name} ends that turn with failed events; the next turn is answered`, async () => {
      const { conn, log, say } = await device(server);
      // A failed recognition never asks the model: only a speech failure's turn takes an answer.
      if (f.stage === "speech") upstream.reply({ content: "First answer." });
      f.act();
      await say(await shortQuestion());
      await metricsOf(log, 1);
      const out1 = outline(log, 1);
      if (f.stage === "speech") {
        // The text went out; no audio did: the text stream ends failed.
        assert.ok(out1.includes("EOS assistant.text TEXT failed"), JSON.stringify(out1));
        assert.ok(!out1.some((e) => e.includes("assistant.audio")), JSON.stringify(out1));
      } else assert.deepEqual(out1, ["EOS assistant.text TEXT failed", "TEXT_DONE turn.metrics"]);
      const failed = log.of("out-1").find((s) => s.error?.code === "failed")!;
      assert.match(failed.error!.message, f.message);
      fake.defaultTranscription = { kind: "text", text: "hello there" };
      upstream.reply({ content: "Second answer." });
      await say(await shortQuestion());
      await metricsOf(log, 2);
      assert.ok(outline(log, 2).includes("EOS assistant.audio AUDIO"), JSON.stringify(outline(log, 2)));
      assert.equal(log.of("out-2").find((s) => s.type === "TEXT_DONE" && s.label === "assistant.text")?.text, "Second answer.");
      conn.close();
    });
  }

  test("with the embedded tts-1 closing the speech model's fallbacks, a failing provider's turn is spoken by tts-1", async () => {
    const safe = await startTestServer({ config: speechboxConfig(upstream.url, fake.url, "box-tts-safe"), engines: engines() });
    try {
      const { conn, log, say } = await device(safe);
      upstream.reply({ content: "Spoken anyway." });
      fake.speech({ kind: "status", status: 503 });
      await say(await shortQuestion());
      await metricsOf(log, 1);
      assert.ok(outline(log, 1).includes("EOS assistant.audio AUDIO"), JSON.stringify(outline(log, 1)));
      assert.equal(log.of("out-1").find((s) => s.type === "EOS" && s.label === "assistant.audio")?.error, undefined);
      assert.equal(fake.of("/audio/speech").at(-1)!.fields.input, "Spoken anyway.");
      conn.close();
    } finally {
      await safe.stop();
    }
  });
});
