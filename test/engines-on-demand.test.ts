/**
 * Engines loaded when needed (issue 41): a node starts only the embedded engines its voice
 * conversations use (or `engines.preload` names); any other starts on its first use, which waits
 * for it and is served. Each node here has an engine host of its own, so that what it started is
 * its own doing (the host's processes and `perch_engine_state`, not timings).
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import pino from "pino";
import { MoonshineEngine } from "../src/ai/speech/index.ts";
import { EngineHost } from "../src/server.ts";
import { TEST_ENGINES } from "./support/engines.ts";
import { startFakeSpeechProvider } from "./support/fake-speech.ts";
import { startFakeUpstream } from "./support/fake-upstream.ts";
import { childProcesses } from "./support/processes.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { ESPEAK_VOICES, espeak, wavFile, wordErrorRate } from "./support/speech.ts";
import { type EventLog, spoken, voiceDevice } from "./support/voice.ts";
import { eventually } from "./support/webrtc.ts";

const KEY = "sk-engines-on-demand";
const API_KEYS = [{ name: "app", sha256: createHash("sha256").update(KEY).digest("hex"), models: ["*"] }];
const QUESTION = "What is the weather like today?";

/** `perch_engine_state` of the node: each engine's state. */
async function states(server: TestServer): Promise<Record<string, string>> {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const out: Record<string, string> = {};
  for (const m of text.matchAll(/^perch_engine_state\{engine="(\w+)",state="(\w+)"\} 1$/gm)) out[m[1]!] = m[2]!;
  return out;
}

/** This process's children that hold a model (a recogniser or voice activity process), whoever started them. */
function modelProcesses(): number {
  return childProcesses().filter(({ pid }) => {
    try {
      return readFileSync(`/proc/${pid}/environ`, "utf8").includes("PERCH_WORKER_DATA=");
    } catch {
      return false;
    }
  }).length;
}

function host() {
  const engines = EngineHost.embedded(TEST_ENGINES);
  return { engines, moonshine: engines.transcription as MoonshineEngine };
}

describe("engines loaded when needed", () => {
  test("a node with no agent starts no engine; its first tts-1 and whisper-1 requests start them (two at once: one load), wait for them and are served", async () => {
    const { engines, moonshine } = host();
    const server = await startTestServer({ config: { api_keys: API_KEYS }, engines });
    try {
      assert.deepEqual(moonshine.pids(), { recogniser: [], vad: [] });
      assert.deepEqual(await states(server), { recognition: "not_loaded", voice_activity: "not_loaded", speech: "not_loaded" });

      const auth = { authorization: `Bearer ${KEY}` };
      const speech = await fetch(`${server.url}/openai/v1/audio/speech`, {
        method: "POST",
        headers: { ...auth, "content-type": "application/json" },
        body: JSON.stringify({ model: "tts-1", input: QUESTION, voice: "nova", response_format: "wav" }),
      });
      assert.equal(speech.status, 200);
      const wav = new Uint8Array(await speech.arrayBuffer());
      assert.ok(wav.byteLength > 20_000, `${wav.byteLength} bytes of speech`);
      // Speech alone started flite (its first worker served; the others may still be loading): the recogniser is still not loaded.
      const afterSpeech = await states(server);
      assert.ok(afterSpeech.speech === "ready" || afterSpeech.speech === "loading", JSON.stringify(afterSpeech));
      assert.deepEqual({ ...afterSpeech, speech: "started" }, { recognition: "not_loaded", voice_activity: "not_loaded", speech: "started" });
      assert.deepEqual(moonshine.pids(), { recogniser: [], vad: [] });

      // Two first requests at once: one load (one recogniser process and one detector started), both served.
      const children = modelProcesses();
      const transcribe = async () => {
        const form = new FormData();
        form.set("model", "whisper-1");
        form.set("file", new Blob([wav], { type: "audio/wav" }), "question.wav");
        const heard = await fetch(`${server.url}/openai/v1/audio/transcriptions`, { method: "POST", headers: auth, body: form });
        assert.equal(heard.status, 200);
        return ((await heard.json()) as { text: string }).text;
      };
      for (const text of await Promise.all([transcribe(), transcribe()])) assert.ok(wordErrorRate(QUESTION, text) <= 0.4, `transcript: ${text}`);
      assert.equal(moonshine.pids().recogniser.length, 1);
      assert.equal(modelProcesses() - children, 2, "one recogniser process and one voice activity process started");
      await eventually(async () => Object.values(await states(server)).every((s) => s === "ready"), 60_000, "every engine ready");
    } finally {
      await server.stop();
      await engines.close();
    }
  });

  test("engines.preload: true starts every engine with the node, before any use", async () => {
    const { engines, moonshine } = host();
    const server = await startTestServer({ config: { engines: { preload: true } }, engines });
    try {
      // Started as the node began listening (nothing has asked for them).
      assert.equal(moonshine.pids().recogniser.length, 1);
      assert.equal(moonshine.pids().vad.length, 1);
      assert.notEqual((await states(server)).speech, "not_loaded");
      await eventually(async () => Object.values(await states(server)).every((s) => s === "ready"), 120_000, "every engine ready");
    } finally {
      await server.stop();
      await engines.close();
    }
  });

  test("engines.preload: [speech] starts flite with the node, and nothing else", async () => {
    const { engines, moonshine } = host();
    const server = await startTestServer({ config: { engines: { preload: ["speech"] } }, engines });
    try {
      const at = await states(server);
      assert.notEqual(at.speech, "not_loaded", JSON.stringify(at));
      assert.deepEqual({ recognition: at.recognition, voice_activity: at.voice_activity }, { recognition: "not_loaded", voice_activity: "not_loaded" });
      assert.deepEqual(moonshine.pids(), { recogniser: [], vad: [] });
      await eventually(async () => (await states(server)).speech === "ready", 60_000, "flite ready");
    } finally {
      await server.stop();
      await engines.close();
    }
  });

  test("an agent on providers: its turns start no recogniser and no flite; when the provider fails, the fallback loads them and the turn is served", async () => {
    const { engines, moonshine } = host();
    const upstream = await startFakeUpstream();
    const fake = await startFakeSpeechProvider();
    const server = await startTestServer({
      config: {
        providers: [
          { id: "local", kind: "openai-compatible", base_url: upstream.url, max_retries: 0 },
          { id: "speechbox", kind: "openai-compatible", base_url: fake.url, max_retries: 0 },
        ],
        models: [
          { id: "chat", kind: "chat", provider: "local", upstream_model: "scripted" },
          { id: "box-tts", kind: "speech", provider: "speechbox", upstream_model: "kokoro", fallbacks: ["tts-1"] },
          { id: "box-stt", kind: "transcription", provider: "speechbox", upstream_model: "whisper-large", fallbacks: ["whisper-1"] },
        ],
        agents: [{ id: "talker", model: "chat", voice: "alloy", speech_model: "box-tts", transcription_model: "box-stt" }],
        // The fallback's recognition waits for the recogniser to load, which takes a loaded machine
        // well over the default 2 s a turn's recognition may queue (the turn would then end
        // `overloaded`, its transcript empty): that bound is speech-load.test.ts's, not this test's.
        voice: { agent: "talker", max_reply_delay_ms: 60_000 },
      },
      engines,
    });
    const question = await spoken(QUESTION);
    const metricsOf = async (log: EventLog, n: number) =>
      JSON.parse((await log.wait((s) => s.stream === `out-${n}` && s.label === "turn.metrics", 90_000, `turn ${n}'s metrics`)).text!) as Record<
        string,
        unknown
      >;
    try {
      // The detector hears every conversation: it started with the node; the recogniser and flite did not.
      // (Loading or ready by now: the state is read once, since at load it may turn ready between two reads.)
      const { voice_activity, ...others } = await states(server);
      assert.deepEqual(others, { recognition: "not_loaded", speech: "not_loaded" });
      assert.ok(voice_activity === "loading" || voice_activity === "ready", `the detector started with the node: ${voice_activity}`);
      assert.equal(moonshine.pids().vad.length, 1);
      await moonshine.startActivity();
      const { conn, log } = await voiceDevice(server);
      const mic = await conn.microphone();

      await mic.say(question);
      assert.deepEqual((await metricsOf(log, 1)).engines, { transcription: "speechbox", speech: "speechbox" });
      assert.deepEqual(moonshine.pids().recogniser, []);
      assert.deepEqual(await states(server), { recognition: "not_loaded", voice_activity: "ready", speech: "not_loaded" });

      // The provider fails: the turn falls back to the embedded engines, which load for it.
      const asked = fake.of("/audio/transcriptions").length;
      fake.defaultSpeech = { kind: "status", status: 500 };
      fake.defaultTranscription = { kind: "status", status: 500 };
      await mic.say(question);
      await metricsOf(log, 2);
      assert.ok(fake.of("/audio/transcriptions").length > asked, "the provider was asked first");
      const transcript = log.all.find((s) => s.stream === "in-2" && s.type === "TEXT_DONE")?.text ?? "";
      assert.ok(wordErrorRate(QUESTION, transcript) <= 0.4, `transcript: ${transcript}`);
      assert.ok(
        log.of("out-2").some((s) => s.type === "BOS" && s.label === "assistant.audio"),
        "the reply was spoken",
      );
      assert.equal(moonshine.pids().recogniser.length, 1);
      await eventually(async () => Object.values(await states(server)).every((s) => s === "ready"), 60_000, "every engine ready");
      conn.close();
    } finally {
      await server.stop();
      await engines.close();
      await fake.close();
      await upstream.close();
    }
  });
});

describe("a recogniser that cannot load its model", () => {
  test("logged once per attempt naming the engine; 503 engine_unavailable naming it (Retry-After); perch_engine_state failed; tried again after the back-off", async () => {
    const empty = mkdtempSync(join(tmpdir(), "perch-no-model-"));
    const moonshine = new MoonshineEngine({ processes: 1, threads: 1, fastAfterMs: false, modelDir: empty, loadRetryMs: 3_000 });
    const engines = EngineHost.of({ transcription: moonshine });
    const lines: Array<Record<string, unknown>> = [];
    const logger = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>) });
    const server = await startTestServer({ config: { api_keys: API_KEYS }, engines, logger });
    try {
      const wav = wavFile(await espeak(QUESTION, ESPEAK_VOICES[0]!.args));
      const transcribe = async () => {
        const form = new FormData();
        form.set("model", "whisper-1");
        form.set("file", new Blob([new Uint8Array(wav)], { type: "audio/wav" }), "question.wav");
        return fetch(`${server.url}/openai/v1/audio/transcriptions`, { method: "POST", headers: { authorization: `Bearer ${KEY}` }, body: form });
      };
      const failures = () => lines.filter((l) => l.msg === "an embedded engine could not load its model; it is tried again on a use after the wait");
      for (let i = 0; i < 2; i++) {
        const res = await transcribe();
        assert.equal(res.status, 503);
        assert.ok(Number(res.headers.get("retry-after")) >= 1);
        const { error } = (await res.json()) as { error: { code: string; type: string; message: string } };
        assert.equal(error.code, "engine_unavailable");
        assert.equal(error.type, "api_error");
        assert.match(error.message, /The embedded recognition engine \(whisper-1: Moonshine\) could not load its model/);
      }
      // The second request came within the back-off: no new attempt, no second line.
      assert.equal(moonshine.recognitionLoad.attempts, 1);
      assert.equal(failures().length, 1);
      assert.equal(failures()[0]!.engine, "recognition");
      assert.equal(failures()[0]!.level, 50);
      assert.equal((await states(server)).recognition, "failed");
      // After the back-off, a use tries again (and fails again: logged again, the wait doubled).
      await eventually(
        async () => {
          await transcribe();
          return moonshine.recognitionLoad.attempts === 2;
        },
        10_000,
        "a second attempt",
      );
      await eventually(() => failures().length === 2, 10_000, "the second attempt's line");
      assert.equal(failures()[1]!.retry_in_ms, 6_000);
      // Nothing answered 500.
      assert.ok(!lines.some((l) => l.status === 500), "no 500");
    } finally {
      await server.stop();
      await engines.close();
      await moonshine.close();
      rmSync(empty, { recursive: true, force: true });
    }
  });
});
