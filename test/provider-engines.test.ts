import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { InFlight } from "../src/ai/in-flight.ts";
import { JsonThread } from "../src/ai/json-thread.ts";
import { ChatRouter } from "../src/ai/router.ts";
import { type Config, loadConfig } from "../src/config/config.ts";
import { engineChooser } from "../src/voice/engine-choice.ts";
import type { SpeechPort, TranscriptionPort } from "../src/voice/engine-ports.ts";
import { type FakeSpeechProvider, startFakeSpeechProvider, tone } from "./support/fake-speech.ts";

/** Fake embedded engines: they say who answered. */
const embeddedSpeech: SpeechPort = {
  engine: "embedded",
  async *synthesize() {
    yield { pcm: new Int16Array(160), sampleRate: 16_000 };
  },
};
const heardByEmbedded: number[] = [];
const embeddedTranscription: TranscriptionPort = {
  engine: "embedded",
  languages: ["en"],
  streamsPartials: true,
  open: () => {
    let samples = 0;
    return {
      push: (pcm) => {
        samples += pcm.length;
      },
      pause: () => {},
      soFar: async () => "embedded heard it",
      finish: async () => {
        heardByEmbedded.push(samples);
        return "embedded heard it";
      },
    };
  },
};

const speechAt = (ms: number) => tone(ms, 300, 16_000);
const quiet = (ms: number) => new Int16Array((ms / 1000) * 16_000);

describe("provider engines behind the engine ports", () => {
  let fake: FakeSpeechProvider;
  let config: Config;
  let choose: ReturnType<typeof engineChooser>;
  const agent = (o: Record<string, unknown>) => ({ ...config.agents[0]!, ...o });

  before(async () => {
    fake = await startFakeSpeechProvider();
    config = loadConfig(
      {},
      {
        providers: [{ id: "speechbox", kind: "openai-compatible", base_url: fake.url, max_retries: 0 }],
        models: [
          { id: "chat", kind: "chat", provider: "speechbox", upstream_model: "c" },
          { id: "tts", kind: "speech", provider: "speechbox", upstream_model: "kokoro" },
          { id: "tts-safe", kind: "speech", provider: "speechbox", upstream_model: "kokoro", fallbacks: ["tts-1"] },
          { id: "stt", kind: "transcription", provider: "speechbox", upstream_model: "whisper-large" },
          { id: "stt-live", kind: "transcription", provider: "speechbox", upstream_model: "whisper-large", stream: true },
          { id: "stt-safe", kind: "transcription", provider: "speechbox", upstream_model: "whisper-large", fallbacks: ["whisper-1"] },
        ],
        agents: [{ id: "talker", model: "chat" }],
      },
    );
    choose = engineChooser({
      catalog: undefined as never,
      embedded: { speech: embeddedSpeech, transcription: embeddedTranscription },
      providers: { config, remote: { router: new ChatRouter(config, new JsonThread(), {}), inFlight: new InFlight() } },
    });
  });
  after(() => fake.close());

  test("an agent on the defaults gets the embedded ports; on catalog models, ports named by the provider", () => {
    const plain = choose(agent({}));
    assert.ok(typeof plain !== "string");
    assert.equal(plain.speech, embeddedSpeech);
    assert.equal(plain.transcription, embeddedTranscription);
    const remote = choose(agent({ speech_model: "tts", transcription_model: "stt-live" }));
    assert.ok(typeof remote !== "string");
    assert.deepEqual([remote.speech.engine, remote.transcription.engine, remote.transcription.streamsPartials], ["speechbox", "speechbox", true]);
    const quietOne = choose(agent({ transcription_model: "stt" }));
    assert.ok(typeof quietOne !== "string" && quietOne.transcription.streamsPartials === false);
    const none = engineChooser({
      catalog: undefined as never,
      embedded: {},
      providers: { config, remote: { router: new ChatRouter(config, new JsonThread(), {}), inFlight: new InFlight() } },
    });
    assert.match(none(agent({})) as string, /tts-1/);
    assert.ok(typeof none(agent({ speech_model: "tts", transcription_model: "stt" })) !== "string");
  });

  test("synthesis streams 24 kHz chunks; a failed provider falls back to the embedded engine only when the list ends with it", async () => {
    const engines = choose(agent({ speech_model: "tts" })) as Exclude<ReturnType<typeof choose>, string>;
    fake.speech({ kind: "pcm", pcm: tone(300), pieceMs: 100 });
    const rates = new Set<number>();
    let samples = 0;
    for await (const c of engines.speech.synthesize({ text: "Hi.", voice: "af_bella", signal: new AbortController().signal })) {
      rates.add(c.sampleRate);
      samples += c.pcm.length;
    }
    assert.deepEqual([...rates], [24_000]);
    assert.equal(samples, 7200);
    assert.equal(fake.of("/audio/speech").at(-1)!.fields.voice, "af_bella");
    fake.speech({ kind: "status", status: 500 });
    await assert.rejects(async () => {
      for await (const _ of engines.speech.synthesize({ text: "Hi.", voice: "a", signal: new AbortController().signal }));
    }, /the model provider failed/);
    const safe = choose(agent({ speech_model: "tts-safe" })) as Exclude<ReturnType<typeof choose>, string>;
    fake.speech({ kind: "html" });
    const chunks = [];
    for await (const c of safe.speech.synthesize({ text: "Hi.", voice: "alloy", signal: new AbortController().signal })) chunks.push(c);
    assert.deepEqual(
      chunks.map((c) => c.sampleRate),
      [16_000],
      "the embedded engine spoke",
    );
  });

  test("recognition: sent at the first pause; speech after it aborts that request; the next pause sends again; the end awaits it", async () => {
    const engines = choose(agent({ transcription_model: "stt", language: "pt-BR" })) as Exclude<ReturnType<typeof choose>, string>;
    const before = fake.of("/audio/transcriptions").length;
    fake.transcription({ kind: "text", text: "first try", delayMs: 5_000 }, { kind: "text", text: "Olá, tudo bem?", delayMs: 50 });
    const turn = engines.transcription.open({ language: "pt-BR", signal: new AbortController().signal, partial: () => assert.fail("no partials") });
    turn.push(speechAt(400));
    turn.push(quiet(150));
    turn.pause();
    while (fake.of("/audio/transcriptions").length === before) await sleep(5);
    const stale = fake.of("/audio/transcriptions").at(-1)!;
    assert.equal(stale.fields.language, "pt");
    turn.push(quiet(100)); // more silence keeps it
    turn.push(speechAt(300)); // speech does not
    await stale.closedEarly;
    turn.push(quiet(150));
    turn.pause();
    const text = await turn.finish();
    assert.equal(text, "Olá, tudo bem?");
    const sent = fake.of("/audio/transcriptions").slice(before);
    assert.equal(sent.length, 2, "the end of the turn reused the recognition of the second pause");
    // The second request carried the whole turn: 400 + 150 + 100 + 300 + 150 ms at 16 kHz.
    assert.equal(sent[1]!.file!.length, 44 + 2 * 16 * 1100);
  });

  test("a streaming model's deltas are partials (text so far); the turn's end without a pause sends once", async () => {
    const engines = choose(agent({ transcription_model: "stt-live" })) as Exclude<ReturnType<typeof choose>, string>;
    fake.transcription({ kind: "deltas", deltas: ["What ", "time ", "is it?"], delayMs: 5 });
    const partials: string[] = [];
    const turn = engines.transcription.open({ signal: new AbortController().signal, partial: (t) => partials.push(t) });
    turn.push(speechAt(500));
    assert.equal(await turn.finish(), "What time is it?");
    assert.deepEqual(partials, ["What ", "What time ", "What time is it?"]);
  });

  test("a failed recognition fails the turn, or goes to the embedded recogniser with the whole turn when it closes the list; abort ends it", async () => {
    const plain = choose(agent({ transcription_model: "stt" })) as Exclude<ReturnType<typeof choose>, string>;
    fake.transcription({ kind: "status", status: 500 });
    const failing = plain.transcription.open({ signal: new AbortController().signal, partial: () => {} });
    failing.push(speechAt(200));
    await assert.rejects(failing.finish(), /fake provider says 500/);

    const safe = choose(agent({ transcription_model: "stt-safe" })) as Exclude<ReturnType<typeof choose>, string>;
    fake.transcription({ kind: "status", status: 503 });
    const spared = safe.transcription.open({ signal: new AbortController().signal, partial: () => {} });
    spared.push(speechAt(200));
    spared.push(quiet(100));
    assert.equal(await spared.finish(), "embedded heard it");
    assert.equal(heardByEmbedded.at(-1), 16 * 300);

    fake.transcription({ kind: "hang" });
    const abort = new AbortController();
    const hanging = plain.transcription.open({ signal: abort.signal, partial: () => {} });
    hanging.push(speechAt(200));
    const before = fake.of("/audio/transcriptions").length;
    const finished = hanging.finish();
    while (fake.of("/audio/transcriptions").length === before) await sleep(5);
    abort.abort(new Error("barge-in"));
    await assert.rejects(finished, /barge-in/);
    await fake.of("/audio/transcriptions").at(-1)!.closedEarly;
  });
});
