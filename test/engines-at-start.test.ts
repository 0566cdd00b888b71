/**
 * Which embedded engines a node starts with it (issue 41): what its voice conversations use, and
 * what `engines.preload` names; everything else waits for its first use (test/engines-on-demand.test.ts).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { type ConfigInput, loadConfig } from "../src/config/config.ts";
import { enginesAtStart } from "../src/node/engines.ts";

const PROVIDER = { id: "box", kind: "openai-compatible" as const, base_url: "http://127.0.0.1:9/v1" };
const MODELS = [
  { id: "chat", kind: "chat" as const, provider: "box", upstream_model: "c" },
  { id: "box-tts", kind: "speech" as const, provider: "box", upstream_model: "kokoro" },
  { id: "box-tts-safe", kind: "speech" as const, provider: "box", upstream_model: "kokoro", fallbacks: ["tts-1"] },
  { id: "box-stt", kind: "transcription" as const, provider: "box", upstream_model: "whisper-large" },
  { id: "live", kind: "realtime" as const, provider: "box", upstream_model: "gpt-realtime" },
];
const onProviders = { id: "talker", model: "chat", voice: "af_bella", speech_model: "box-tts", transcription_model: "box-stt" };

const atStart = (input: Record<string, unknown>) =>
  [...enginesAtStart(loadConfig({}, { providers: [PROVIDER], models: MODELS, ...input } as ConfigInput))].sort();

test("a node whose agents hear and speak on providers starts the voice activity detector alone", () => {
  assert.deepEqual(atStart({ agents: [onProviders], voice: { agent: "talker" } }), ["voice_activity"]);
  // A fallback to the embedded engine is a first use when it happens, not a reason to start it.
  assert.deepEqual(atStart({ agents: [{ ...onProviders, voice: "alloy", speech_model: "box-tts-safe" }] }), ["voice_activity"]);
  // A realtime agent's model hears and speaks for itself.
  assert.deepEqual(atStart({ agents: [{ id: "live-talker", model: "live", voice: "marin" }] }), ["voice_activity"]);
});

test("an agent on the embedded engines starts the recogniser and flite with the node; each engine by what uses it", () => {
  assert.deepEqual(atStart({ agents: [{ id: "local", model: "chat", voice: "alloy" }] }), ["recognition", "speech", "voice_activity"]);
  assert.deepEqual(atStart({ agents: [{ ...onProviders, transcription_model: "whisper-1" }] }), ["recognition", "voice_activity"]);
  assert.deepEqual(atStart({ agents: [{ ...onProviders, voice: "alloy", speech_model: "tts-1" }] }), ["speech", "voice_activity"]);
  // One embedded agent among provider ones is enough.
  assert.deepEqual(atStart({ agents: [onProviders, { id: "local", model: "chat", voice: "alloy" }] }), ["recognition", "speech", "voice_activity"]);
});

test("with no conversations (no agent, or WebRTC off) a node starts no engine unless engines.preload says so", () => {
  assert.deepEqual(atStart({}), []);
  assert.deepEqual(atStart({ agents: [{ id: "local", model: "chat", voice: "alloy" }], webrtc: { enabled: false } }), []);
  assert.deepEqual(atStart({ engines: { preload: true } }), ["recognition", "speech", "voice_activity"]);
  assert.deepEqual(atStart({ engines: { preload: ["speech"] } }), ["speech"]);
  assert.deepEqual(atStart({ agents: [onProviders], engines: { preload: ["recognition"] } }), ["recognition", "voice_activity"]);
});

test("engines.preload takes true, false or a list of the engines; anything else is refused with its key", () => {
  assert.equal(loadConfig({}, {}).engines.preload, false);
  assert.deepEqual(loadConfig({ PERCH_ENGINES_PRELOAD: "recognition,speech" }, {}).engines.preload, ["recognition", "speech"]);
  assert.equal(loadConfig({ PERCH_ENGINES_PRELOAD: "true" }, {}).engines.preload, true);
  assert.throws(() => loadConfig({}, { engines: { preload: ["moonshine"] } } as unknown as ConfigInput), /engines\.preload/);
  // The error says what is accepted (an unknown engine's name, a string for a list).
  const accepted = /engines\.preload.*true, false or a list of recognition, voice_activity, speech/;
  assert.throws(() => loadConfig({}, { engines: { preload: ["moonshine"] } } as unknown as ConfigInput), accepted);
  assert.throws(() => loadConfig({}, { engines: { preload: "speech" } } as unknown as ConfigInput), accepted);
  assert.throws(() => loadConfig({ PERCH_ENGINES_PRELOAD: "bogus" }, {}), accepted);
  assert.throws(() => loadConfig({}, { engines: { preload: [] } } as unknown as ConfigInput), /engines\.preload/);
});
