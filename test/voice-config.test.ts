import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import OpenAI, { toFile } from "openai";
import { ConfigError, loadConfig } from "../src/config/config.ts";
import { engines } from "./support/engines.ts";
import { type FakeSpeechProvider, startFakeSpeechProvider } from "./support/fake-speech.ts";
import { startTestNode, tempDir } from "./support/server.ts";

const KEY = "sk-voice-config-test";
const provider = { id: "openai", kind: "openai-compatible", base_url: "http://127.0.0.1:9/v1" } as const;
const chat = { id: "my-chat", kind: "chat", provider: "openai", upstream_model: "gpt-4.1-mini" } as const;
const tts = { id: "voice-tts", kind: "speech", provider: "openai", upstream_model: "gpt-4o-mini-tts" } as const;
const stt = { id: "voice-stt", kind: "transcription", provider: "openai", upstream_model: "gpt-4o-transcribe" } as const;

function refused(input: Record<string, unknown>, field: string, message?: RegExp): void {
  assert.throws(
    () => loadConfig({}, input as never),
    (err: unknown) => err instanceof ConfigError && err.message.includes(`at ${field}:`) && (!message || message.test(err.message)),
    `expected a refusal naming ${field}`,
  );
}

test("voice.md §5's example loads: an agent's speech and transcription models, voice and language; a streaming model; defaults are embedded", () => {
  const file = join(tempDir(), "perch.yaml");
  writeFileSync(
    file,
    `providers:
  - { id: openai, kind: openai, api_key_env: OPENAI_API_KEY }
models:
  - { id: my-chat,  kind: chat,          provider: openai, upstream_model: gpt-4.1-mini }
  - { id: voice-tts, kind: speech,        provider: openai, upstream_model: gpt-4o-mini-tts, fallbacks: [tts-1] }
  - { id: voice-stt, kind: transcription, provider: openai, upstream_model: gpt-4o-transcribe, stream: true }
agents:
  - { id: talker, model: my-chat, speech_model: voice-tts, transcription_model: voice-stt, voice: coral, language: es }
  - { id: plain, model: my-chat }
`,
  );
  const config = loadConfig({ PERCH_CONFIG: file });
  const [talker, plain] = config.agents;
  assert.deepEqual([talker?.speech_model, talker?.transcription_model, talker?.voice, talker?.language], ["voice-tts", "voice-stt", "coral", "es"]);
  assert.deepEqual([plain?.speech_model, plain?.transcription_model, plain?.language], ["tts-1", "whisper-1", undefined]);
  assert.equal(config.models[2]?.stream, true);
  assert.equal(config.models[1]?.stream, false);
  assert.deepEqual(config.models[1]?.fallbacks, ["tts-1"]);
  assert.equal(config.providers[0]?.voice_max_in_flight, 32);
});

test("voice models that cannot work stop start-up with a message naming the field", () => {
  const base = { providers: [provider], models: [chat, tts, stt] };
  refused({ ...base, agents: [{ id: "a", model: "my-chat", speech_model: "ghost" }] }, "agents.0.speech_model", /unknown model ghost/);
  refused({ ...base, agents: [{ id: "a", model: "my-chat", speech_model: "voice-stt" }] }, "agents.0.speech_model", /transcription model, not speech/);
  refused({ ...base, agents: [{ id: "a", model: "my-chat", transcription_model: "voice-tts" }] }, "agents.0.transcription_model");
  refused({ ...base, agents: [{ id: "a", model: "my-chat", transcription_model: "tts-1" }] }, "agents.0.transcription_model");
  refused({ ...base, agents: [{ id: "a", model: "my-chat", speech_model: "my-chat" }] }, "agents.0.speech_model", /chat model/);
  refused({ ...base, agents: [{ id: "a", model: "my-chat", language: "not a language" }] }, "agents.0.language", /BCP-47/);
  refused({ providers: [provider], models: [chat, { ...tts, stream: true }] }, "models.1.stream");
  refused({ providers: [provider], models: [chat, { ...tts, fallbacks: ["whisper-1"] }] }, "models.1.fallbacks.0", /unknown model whisper-1/);
  refused({ providers: [provider], models: [chat, { ...stt, fallbacks: ["tts-1"] }] }, "models.1.fallbacks.0");
  refused({ providers: [provider], models: [chat, tts, { ...tts, id: "t2", fallbacks: ["tts-1", "voice-tts"] }] }, "models.2.fallbacks.0", /last fallback/);
  refused({ providers: [{ ...provider, voice_max_in_flight: 0 }] }, "providers.0.voice_max_in_flight");
  // What is right loads.
  loadConfig({}, { ...base, agents: [{ id: "a", model: "my-chat", speech_model: "voice-tts", transcription_model: "voice-stt", language: "pt-BR" }] });
});

describe("start-up checks against the embedded engines", () => {
  const agentWith = (agent: Record<string, unknown>) => ({
    providers: [provider],
    models: [chat, tts, { ...tts, id: "tts-spared", fallbacks: ["tts-1"] }, stt, { ...stt, id: "stt-spared", fallbacks: ["whisper-1"] }],
    agents: [{ id: "talker", model: "my-chat", ...agent }],
  });

  test("a German-speaking agent on the embedded recogniser fails at start-up, naming the agent, the model and the language", async () => {
    await assert.rejects(startTestNode({ config: agentWith({ language: "de" }), engines: engines() }), (err: Error) => {
      assert.match(err.message, /agents\.0\.language/);
      assert.match(err.message, /talker/);
      assert.match(err.message, /whisper-1/);
      assert.match(err.message, /\bde\b/);
      return true;
    });
    // The embedded recogniser as the last fallback would hear it just the same.
    await assert.rejects(
      startTestNode({ config: agentWith({ language: "de-AT", transcription_model: "stt-spared" }), engines: engines() }),
      /speaks de-AT, but its transcription model stt-spared falls back to whisper-1 \(the embedded recogniser\), which hears only en/,
    );
  });

  test("a provider's voice and language pass through unchecked; an embedded fallback's voice is checked", async () => {
    const server = await startTestNode({
      config: agentWith({ language: "de", transcription_model: "voice-stt", speech_model: "voice-tts", voice: "coral" }),
      engines: engines(),
    });
    await server.stop();
    const english = await startTestNode({ config: agentWith({ language: "en-GB" }), engines: engines() });
    await english.stop();
    await assert.rejects(
      startTestNode({ config: agentWith({ speech_model: "tts-spared", voice: "coral" }), engines: engines() }),
      /agents\.0\.voice: unknown voice coral for agent talker; tts-1 has alloy/,
    );
  });
});

describe("the Compatible API's audio models fall back to the embedded engine when it closes their list", () => {
  let fake: FakeSpeechProvider;
  let server: Awaited<ReturnType<typeof startTestNode>>;
  let api: OpenAI;
  before(async () => {
    fake = await startFakeSpeechProvider();
    server = await startTestNode({
      config: {
        api_keys: [{ name: "app", sha256: createHash("sha256").update(KEY).digest("hex") }],
        providers: [{ id: "p", kind: "openai-compatible", base_url: fake.url, max_retries: 0 }],
        models: [
          { id: "neural", kind: "speech", provider: "p", upstream_model: "x-tts", fallbacks: ["tts-1"] },
          { id: "neural-only", kind: "speech", provider: "p", upstream_model: "x-tts" },
          { id: "ears", kind: "transcription", provider: "p", upstream_model: "x-stt", fallbacks: ["whisper-1"] },
        ],
      },
      engines: engines(),
    });
    api = new OpenAI({ apiKey: KEY, baseURL: `${server.url}/openai/v1`, maxRetries: 0, fetch: server.fetch });
  });
  after(async () => {
    await server?.stop();
    await fake?.close();
  });

  test("speech: a provider's 500 is answered by tts-1; without the fallback it is the provider's failure", async () => {
    fake.speech({ kind: "status", status: 500 });
    const res = await api.audio.speech.create({ model: "neural", input: "Hello.", voice: "alloy", response_format: "wav" });
    const wav = Buffer.from(await res.arrayBuffer());
    assert.equal(wav.subarray(0, 4).toString("latin1"), "RIFF");
    fake.speech({ kind: "status", status: 500 });
    await assert.rejects(api.audio.speech.create({ model: "neural-only", input: "Hello.", voice: "alloy" }), (err: unknown) => {
      assert.ok(err instanceof OpenAI.APIError);
      assert.equal(err.status, 502);
      return true;
    });
  });

  test("transcription: a provider's 503 is answered by whisper-1", async () => {
    const speech = await api.audio.speech.create({ model: "tts-1", input: "Turn on the lights.", voice: "nova", response_format: "wav" });
    fake.transcription({ kind: "status", status: 503 });
    const file = await toFile(Buffer.from(await speech.arrayBuffer()), "q.wav", { type: "audio/wav" });
    const t = await api.audio.transcriptions.create({ model: "ears", file });
    assert.match(t.text.toLowerCase(), /lights/);
    assert.equal(fake.of("/audio/transcriptions").length, 1);
  });
});
