import assert from "node:assert/strict";
import { getEventListeners } from "node:events";
import { after, before, beforeEach, describe, test } from "node:test";
import { GenerationError } from "../src/ai/errors.ts";
import { InFlight } from "../src/ai/in-flight.ts";
import { JsonThread } from "../src/ai/json-thread.ts";
import { PROVIDER_PCM_RATE, type RemoteContext, remoteSpeech, remoteTranscription } from "../src/ai/remote-speech.ts";
import { ChatRouter, embeddedFallback } from "../src/ai/router.ts";
import { concatInt16 } from "../src/audio/samples.ts";
import { type Config, loadConfig } from "../src/config/config.ts";
import { type FakeSpeechProvider, startFakeSpeechProvider, startSpeechNode, tone } from "./support/fake-speech.ts";
import type { TestServer } from "./support/server.ts";
import { resample } from "./support/voice.ts";
import { within } from "./support/webrtc.ts";

/** Two providers (the second a fallback's) on two fake servers, a speech and a transcription model on each. */
function config(primary: string, second: string, o: { timeoutMs?: number; maxInFlight?: number; stream?: boolean } = {}): Config {
  const provider = (id: string, url: string) => ({
    id,
    kind: "openai-compatible" as const,
    base_url: url,
    max_retries: 0,
    timeout_ms: o.timeoutMs ?? 5_000,
    voice_max_in_flight: o.maxInFlight ?? 32,
  });
  return loadConfig(
    {},
    {
      providers: [provider("main", primary), provider("spare", second)],
      models: [
        { id: "voice", kind: "speech", provider: "main", upstream_model: "main-tts" },
        { id: "voice-spared", kind: "speech", provider: "main", upstream_model: "main-tts", fallbacks: ["voice-spare"] },
        { id: "voice-spare", kind: "speech", provider: "spare", upstream_model: "spare-tts" },
        { id: "voice-embedded", kind: "speech", provider: "main", upstream_model: "main-tts", fallbacks: ["tts-1"] },
        { id: "ears", kind: "transcription", provider: "main", upstream_model: "main-stt", stream: o.stream ?? false },
        { id: "ears-spared", kind: "transcription", provider: "main", upstream_model: "main-stt", fallbacks: ["ears-spare"] },
        { id: "ears-spare", kind: "transcription", provider: "spare", upstream_model: "spare-stt" },
      ],
    },
  );
}

const model = (c: Config, id: string) => c.models.find((m) => m.id === id)!;

async function collect(samples: AsyncIterable<Int16Array>): Promise<number> {
  let n = 0;
  for await (const s of samples) n += s.length;
  return n;
}

describe("provider speech and transcription for conversations", () => {
  let fake: FakeSpeechProvider;
  let spare: FakeSpeechProvider;
  let cfg: Config;
  let ctx: RemoteContext;
  const use = (c: Config) => {
    cfg = c;
    ctx = { router: new ChatRouter(c, new JsonThread(), {}), inFlight: new InFlight() };
  };

  before(async () => {
    fake = await startFakeSpeechProvider();
    spare = await startFakeSpeechProvider();
  });
  after(async () => {
    await fake.close();
    await spare.close();
  });
  beforeEach(() => use(config(fake.url, spare.url)));

  test("one sentence is one POST /audio/speech for pcm; its first samples are read before the provider has sent the rest", async () => {
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    fake.speech({ kind: "pcm", pcm: tone(1000), pieceMs: 100, gate: (i) => (i === 1 ? held : Promise.resolve()) });
    const speech = await remoteSpeech(ctx, model(cfg, "voice"), "Hello there.", "coral", new AbortController().signal);
    const it = speech.samples[Symbol.asyncIterator]();
    const first = await it.next();
    // The provider is still holding its second piece: what arrived is usable already.
    assert.equal(first.done, false);
    assert.ok(first.value!.length > 0 && first.value!.length <= 2400, `first piece ${first.value?.length}`);
    const request = fake.of("/audio/speech").at(-1)!;
    assert.deepEqual(request.fields, { model: "main-tts", input: "Hello there.", voice: "coral", response_format: "pcm" });
    assert.equal(speech.sampleRate, PROVIDER_PCM_RATE);
    assert.equal(speech.model.id, "voice");
    release();
    let total = first.value!.length;
    for (let r = await it.next(); !r.done; r = await it.next()) total += r.value.length;
    assert.equal(total, 24_000);
    await request.finished;
  });

  test("aborting the signal closes the provider's connection mid-sentence", async () => {
    fake.speech({ kind: "pcm", pcm: tone(3000), pieceMs: 20, delayMs: 20 });
    const abort = new AbortController();
    const speech = await remoteSpeech(ctx, model(cfg, "voice"), "A long sentence.", "alloy", abort.signal);
    const it = speech.samples[Symbol.asyncIterator]();
    await it.next();
    abort.abort(new Error("barge-in"));
    await assert.rejects(it.next());
    await within(fake.of("/audio/speech").at(-1)!.closedEarly, 5_000, "the provider's connection closed by the abort");
  });

  test("refused answers: another rate (declared by type or WAV header), HTML, an empty body; a 24 kHz WAV is read past its header", async () => {
    const refused = async (act: Parameters<FakeSpeechProvider["speech"]>[0], pattern: RegExp) => {
      fake.speech(act);
      await assert.rejects(remoteSpeech(ctx, model(cfg, "voice"), "Hi.", "alloy", new AbortController().signal), (err: unknown) => {
        assert.ok(err instanceof GenerationError, String(err));
        assert.match(err.message, pattern);
        return true;
      });
    };
    await refused({ kind: "pcm", contentType: "audio/pcm; rate=16000" }, /16000 Hz instead of 24000 Hz/);
    await refused({ kind: "wav", rate: 16_000 }, /16000 Hz instead of 24000 Hz/);
    await refused({ kind: "pcm", contentType: "audio/pcm; rate=24000; channels=2" }, /2 channels instead of mono/);
    await refused({ kind: "wav", rate: 24_000, channels: 2 }, /2 channels instead of mono/);
    await refused({ kind: "html" }, /text\/html instead of PCM audio/);
    await refused(
      { kind: "pcm", contentType: "application/octet-stream", pcm: new Int16Array(new Uint8Array(Buffer.from("<!DOCTYPE html><html>oops</html>")).buffer) },
      /text instead/,
    );
    await refused({ kind: "pcm", pcm: new Int16Array(0) }, /no audio/);
    // A refusal on the headers alone still ends the exchange: aborting the call's signal afterwards
    // (as a reply does when it ends) must find nothing left to destroy.
    fake.speech({ kind: "html" });
    const abort = new AbortController();
    await assert.rejects(remoteSpeech(ctx, model(cfg, "voice"), "Hi.", "alloy", abort.signal));
    assert.deepEqual(getEventListeners(abort.signal, "abort"), [], "nothing of the refused exchange waits on the signal");
    abort.abort();
    fake.speech({ kind: "wav", rate: 24_000, pcm: tone(100) });
    const wav = await remoteSpeech(ctx, model(cfg, "voice"), "Hi.", "alloy", new AbortController().signal);
    assert.equal(await collect(wav.samples), 2400);
  });

  test("a 500, a 429 or HTML from the first model falls back to the next; the answer names the model that spoke", async () => {
    for (const act of [{ kind: "status", status: 500 }, { kind: "status", status: 429 }, { kind: "html" }] as const) {
      fake.speech(act);
      const before = spare.of("/audio/speech").length;
      const speech = await remoteSpeech(ctx, model(cfg, "voice-spared"), "Hi.", "alloy", new AbortController().signal);
      assert.equal(speech.model.id, "voice-spare");
      assert.equal(spare.of("/audio/speech").length, before + 1);
      assert.equal(spare.of("/audio/speech").at(-1)!.fields.model, "spare-tts");
      await collect(speech.samples);
    }
  });

  test("the embedded engine closing a model's fallbacks is for its caller: the router reports the providers' failure", async () => {
    fake.speech({ kind: "status", status: 503 });
    const err = await remoteSpeech(ctx, model(cfg, "voice-embedded"), "Hi.", "alloy", new AbortController().signal).catch((e: unknown) => e);
    assert.ok(err instanceof GenerationError);
    assert.equal(embeddedFallback(model(cfg, "voice-embedded"), err), true);
    assert.equal(embeddedFallback(model(cfg, "voice-spared"), err), false);
  });

  test("a provider that stalls (no bytes for timeout_ms) ends the sentence with a timeout, before or after its first bytes", async () => {
    use(config(fake.url, spare.url, { timeoutMs: 300 }));
    fake.speech({ kind: "stall", pieces: 2 });
    const speech = await remoteSpeech(ctx, model(cfg, "voice"), "Hi.", "alloy", new AbortController().signal);
    await assert.rejects(collect(speech.samples), /did not answer within 300 ms/);
    fake.speech({ kind: "stall", pieces: 0 });
    await assert.rejects(remoteSpeech(ctx, model(cfg, "voice"), "Hi.", "alloy", new AbortController().signal), /did not answer in time/);
  });

  test("calls in flight are bounded per provider: one over the bound fails at once (or moves to a fallback on another provider)", async () => {
    use(config(fake.url, spare.url, { maxInFlight: 1 }));
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    fake.speech({ kind: "pcm", pcm: tone(200), gate: () => held });
    const first = await remoteSpeech(ctx, model(cfg, "voice"), "One.", "alloy", new AbortController().signal);
    const asked = fake.requests.length;
    await assert.rejects(remoteSpeech(ctx, model(cfg, "voice"), "Two.", "alloy", new AbortController().signal), /main has 1 voice calls in flight/);
    assert.equal(fake.requests.length, asked, "the surplus call never reached the provider");
    const spared = await remoteSpeech(ctx, model(cfg, "voice-spared"), "Two.", "alloy", new AbortController().signal);
    assert.equal(spared.model.id, "voice-spare");
    await collect(spared.samples);
    release();
    await collect(first.samples);
    assert.equal(ctx.inFlight.count("main"), 0, "a finished call gives its place back");
    const third = await remoteSpeech(ctx, model(cfg, "voice"), "Three.", "alloy", new AbortController().signal);
    await collect(third.samples);
  });

  test("a turn is sent as a 16 kHz mono WAV with the model, the language and json; the text comes back", async () => {
    fake.transcription({ kind: "text", text: " Hola, ¿qué tal? " });
    const pcm = tone(500, 300, 16_000);
    const r = await remoteTranscription(ctx, model(cfg, "ears"), pcm, { language: "es" }, new AbortController().signal);
    assert.equal(r.text, "Hola, ¿qué tal?");
    const request = fake.of("/audio/transcriptions").at(-1)!;
    assert.deepEqual(request.fields, { model: "main-stt", response_format: "json", language: "es" });
    const file = request.file!;
    assert.equal(file.subarray(0, 4).toString("latin1"), "RIFF");
    assert.equal(file.readUInt32LE(24), 16_000);
    assert.equal(file.readUInt16LE(22), 1);
    assert.equal(file.length, 44 + pcm.byteLength);
  });

  test("a stream: true model is asked to stream; its transcript.text.delta events arrive as partials before the final text", async () => {
    use(config(fake.url, spare.url, { stream: true }));
    fake.transcription({ kind: "deltas", deltas: ["What ", "is the ", "weather?"], delayMs: 10 });
    const partials: string[] = [];
    const r = await remoteTranscription(ctx, model(cfg, "ears"), tone(200, 300, 16_000), { onDelta: (d) => partials.push(d) }, new AbortController().signal);
    assert.deepEqual(partials, ["What ", "is the ", "weather?"]);
    assert.equal(r.text, "What is the weather?");
    assert.equal(fake.of("/audio/transcriptions").at(-1)!.fields.stream, "true");
    // A model without stream: true is never asked to.
    use(config(fake.url, spare.url));
    fake.transcription({ kind: "deltas", deltas: ["a ", "b"] });
    const whole = await remoteTranscription(
      ctx,
      model(cfg, "ears"),
      tone(200, 300, 16_000),
      { onDelta: () => assert.fail("no partials") },
      new AbortController().signal,
    );
    assert.equal(whole.text, "a b");
    assert.equal(fake.of("/audio/transcriptions").at(-1)!.fields.stream, undefined);
  });

  test("transcription failures: one that never answers times out, HTML is refused, a 500 falls back; an abort closes the request", async () => {
    use(config(fake.url, spare.url, { timeoutMs: 300 }));
    const pcm = tone(200, 300, 16_000);
    fake.transcription({ kind: "hang" });
    await assert.rejects(remoteTranscription(ctx, model(cfg, "ears"), pcm, {}, new AbortController().signal), /did not answer in time/);
    fake.transcription({ kind: "html" });
    await assert.rejects(remoteTranscription(ctx, model(cfg, "ears"), pcm, {}, new AbortController().signal), /text\/html instead of a transcript/);
    fake.transcription({ kind: "status", status: 500 });
    spare.transcription({ kind: "text", text: "from the spare" });
    const spared = await remoteTranscription(ctx, model(cfg, "ears-spared"), pcm, {}, new AbortController().signal);
    assert.deepEqual([spared.text, spared.model.id], ["from the spare", "ears-spare"]);
    use(config(fake.url, spare.url));
    fake.transcription({ kind: "hang" });
    const abort = new AbortController();
    const asked = fake.of("/audio/transcriptions").length;
    const pending = remoteTranscription(ctx, model(cfg, "ears"), pcm, {}, abort.signal);
    while (fake.of("/audio/transcriptions").length === asked) await new Promise((r) => setTimeout(r, 5));
    abort.abort(new Error("speech resumed"));
    await assert.rejects(pending, /speech resumed/);
    await fake.of("/audio/transcriptions").at(-1)!.closedEarly;
  });
});

describe("a second Perch as the speech provider (its embedded tts-1 and whisper-1 on its Compatible API)", () => {
  const KEY = "sk-speech-node";
  let nodeA: TestServer;
  let cfg: Config;
  let ctx: RemoteContext;

  before(async () => {
    nodeA = await startSpeechNode(KEY);
    cfg = loadConfig(
      {},
      {
        providers: [{ id: "node-a", kind: "openai-compatible", base_url: `${nodeA.url}/openai/v1`, api_key_env: "NODE_A_KEY", max_retries: 0 }],
        models: [
          { id: "remote-tts", kind: "speech", provider: "node-a", upstream_model: "tts-1" },
          { id: "remote-stt", kind: "transcription", provider: "node-a", upstream_model: "whisper-1", stream: true },
        ],
      },
    );
    ctx = { router: new ChatRouter(cfg, new JsonThread(), { NODE_A_KEY: KEY }), inFlight: new InFlight() };
  });
  after(() => nodeA?.stop());

  test("its pcm is accepted as 24 kHz audio, and what it says it hears back, partial words first", async () => {
    const speech = await remoteSpeech(ctx, model(cfg, "remote-tts"), "Please turn on the kitchen lights.", "nova", new AbortController().signal);
    const pieces: Int16Array[] = [];
    for await (const s of speech.samples) pieces.push(s);
    const pcm24 = concatInt16(pieces);
    assert.ok(pcm24.length > 24_000, `${pcm24.length} samples`);
    // Through 48 kHz: the Speex wrapper gives nothing for 24 kHz → 16 kHz directly (noted in the decisions).
    const pcm16 = await resample(await resample(pcm24, 24_000, 48_000), 48_000, 16_000);
    const deltas: string[] = [];
    const heard = await remoteTranscription(
      ctx,
      model(cfg, "remote-stt"),
      pcm16,
      { language: "en", onDelta: (d) => deltas.push(d) },
      new AbortController().signal,
    );
    assert.match(heard.text.toLowerCase(), /kitchen/);
    assert.ok(deltas.length > 0, "whisper-1 streamed its segments");
  });
});
