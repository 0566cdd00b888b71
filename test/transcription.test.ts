/**
 * whisper-1 on the embedded recogniser, end to end through the official openai client against the
 * real server: voices Perch was not tuned on (espeak-ng), noise the test mixes in, silence, every
 * response format, streamed events, a long file cut into segments, and the queue's 429.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import OpenAI, { toFile } from "openai";
import { createSpeechEngine, createTranscriptionEngine, type MoonshineEngine } from "../src/ai/speech/index.ts";
import { concatFloat32 } from "../src/audio/samples.ts";
import { engines } from "./support/engines.ts";
import { startTestNode, type TestNode } from "./support/server.ts";
import { ESPEAK_VOICES, espeak, ROUND_TRIP_SENTENCES, seededRandom, silence, wavFile, withNoise, wordErrorRate } from "./support/speech.ts";

const KEY = "sk-perch-transcription-test";
const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");
const SENTENCES = ROUND_TRIP_SENTENCES.slice(0, 6);
const TEXT = SENTENCES.join(" ");
/** White noise this far below the speech (dB). */
const SNR = 20;

interface Verbose {
  text: string;
  duration: number;
  language: string;
  segments: Array<{ id: number; start: number; end: number; text: string }>;
}

/** The sentences in one voice, half a second apart, with half a second before and after. */
async function spoken(args: readonly string[], sentences = SENTENCES): Promise<Float32Array> {
  const parts: Float32Array[] = [silence(0.5)];
  for (const s of sentences) parts.push(await espeak(s, args), silence(0.5));
  return concatFloat32(parts);
}

function assertSegmentsInside(v: Verbose): void {
  let last = 0;
  for (const [i, s] of v.segments.entries()) {
    assert.equal(s.id, i);
    assert.ok(s.start >= last && s.end > s.start && s.end <= v.duration, `segment ${JSON.stringify(s)} of ${v.duration} s`);
    last = s.end;
  }
}

describe("transcription through the openai client (Moonshine)", () => {
  let server: TestNode;
  let openai: OpenAI;

  before(async () => {
    server = await startTestNode({ config: { api_keys: [{ name: "a", sha256: sha256(KEY) }] }, engines: engines() });
    openai = new OpenAI({ apiKey: KEY, baseURL: `${server.url}/openai/v1`, maxRetries: 0, fetch: server.fetch });
  });
  after(() => server?.stop());

  for (const voice of ESPEAK_VOICES) {
    test(`${voice.name}: clean and with noise mixed in, within a word error rate bound`, async () => {
      const clean = await spoken(voice.args);
      for (const [label, audio, bound] of [
        ["clean", clean, 0.2],
        [`white noise at ${SNR} dB`, withNoise(clean, SNR), 0.4],
      ] as const) {
        const heard = await openai.audio.transcriptions.create({ model: "whisper-1", file: await toFile(wavFile(audio), "speech.wav"), language: "en" });
        const wer = wordErrorRate(TEXT, heard.text);
        process.stderr.write(`# ${voice.name}, ${label}: WER ${wer.toFixed(3)}: ${heard.text}\n`);
        assert.ok(wer <= bound, `${label}: WER ${wer} > ${bound}: ${heard.text}`);
      }
    });
  }

  test("silence and pure noise give an empty text and no segments", async () => {
    const random = seededRandom(3);
    const noise = new Float32Array(16_000 * 3).map(() => (random() * 2 - 1) * 0.2);
    for (const audio of [silence(3), noise]) {
      const json = await openai.audio.transcriptions.create({ model: "whisper-1", file: await toFile(wavFile(audio), "quiet.wav") });
      assert.equal(json.text, "");
      const verbose = (await openai.audio.transcriptions.create({
        model: "whisper-1",
        file: await toFile(wavFile(audio), "quiet.wav"),
        response_format: "verbose_json",
      })) as unknown as Verbose;
      assert.deepEqual(verbose.segments, []);
      assert.equal(verbose.duration, 3);
    }
  });

  test("every response format, with segment timings inside the audio", async () => {
    const audio = await spoken(ESPEAK_VOICES[0]!.args, SENTENCES.slice(0, 2));
    const file = async () => toFile(wavFile(audio), "speech.wav");
    const verbose = (await openai.audio.transcriptions.create({
      model: "whisper-1",
      file: await file(),
      response_format: "verbose_json",
      timestamp_granularities: ["segment"],
    })) as unknown as Verbose;
    assert.equal(verbose.language, "en");
    assert.ok(Math.abs(verbose.duration - audio.length / 16_000) < 0.01, `duration ${verbose.duration}`);
    assert.ok(verbose.segments.length >= 1);
    assertSegmentsInside(verbose);
    assert.equal(verbose.text, verbose.segments.map((s) => s.text).join(" "));
    assert.ok(wordErrorRate(SENTENCES.slice(0, 2).join(" "), verbose.text) <= 0.2, verbose.text);
    // The first sentence starts after the half second of silence.
    assert.ok(verbose.segments[0]!.start >= 0.2 && verbose.segments[0]!.start <= 0.7, JSON.stringify(verbose.segments[0]));

    const json = await openai.audio.transcriptions.create({ model: "whisper-1", file: await file() });
    assert.equal(json.text, verbose.text);
    const text = (await openai.audio.transcriptions.create({ model: "whisper-1", file: await file(), response_format: "text" })) as unknown as string;
    assert.equal(text.trim(), verbose.text);
    const srt = (await openai.audio.transcriptions.create({ model: "whisper-1", file: await file(), response_format: "srt" })) as unknown as string;
    const srtCues = srt.trim().split(/\n\n+/);
    assert.equal(srtCues.length, verbose.segments.length, srt);
    assert.match(srtCues[0]!, /^1\n\d\d:\d\d:\d\d,\d{3} --> \d\d:\d\d:\d\d,\d{3}\n\S/);
    const vtt = (await openai.audio.transcriptions.create({ model: "whisper-1", file: await file(), response_format: "vtt" })) as unknown as string;
    assert.match(vtt, /^WEBVTT\n\n\d\d:\d\d:\d\d\.\d{3} --> \d\d:\d\d:\d\d\.\d{3}\n\S/);
  });

  test("stream: true sends a delta per segment as it is recognised, then the whole text", async () => {
    const audio = await spoken(ESPEAK_VOICES[0]!.args);
    const events: Array<{ type: string; delta?: string; text?: string }> = [];
    const stream = await openai.audio.transcriptions.create({ model: "whisper-1", file: await toFile(wavFile(audio), "speech.wav"), stream: true });
    for await (const event of stream) events.push(event as { type: string });
    const deltas = events.filter((e) => e.type === "transcript.text.delta");
    const done = events.at(-1)!;
    assert.equal(done.type, "transcript.text.done");
    assert.ok(deltas.length >= 2, JSON.stringify(events));
    assert.equal(deltas.map((d) => d.delta).join(""), done.text);
    assert.ok(wordErrorRate(TEXT, done.text!) <= 0.2, done.text);
  });

  test("a 60 s file is cut into segments at its pauses, each where its sentence is", async () => {
    // Ten sentences, each placed at a known second of a minute of audio.
    const placed: Array<{ at: number; seconds: number }> = [];
    const parts: Float32Array[] = [];
    let length = 0;
    for (const [i, sentence] of ROUND_TRIP_SENTENCES.entries()) {
      const at = 1 + i * 5.8;
      const gap = silence(at - length / 16_000);
      const speech = await espeak(sentence, ESPEAK_VOICES[i % 2]!.args);
      parts.push(gap, speech);
      length += gap.length + speech.length;
      // espeak-ng ends each sentence with some silence of its own: the speech ends at its last loud sample.
      let end = speech.length;
      while (end > 0 && Math.abs(speech[end - 1]!) < 0.01) end--;
      placed.push({ at, seconds: end / 16_000 });
    }
    parts.push(silence(60 - length / 16_000));
    const audio = concatFloat32(parts);
    assert.equal(audio.length, 60 * 16_000);
    const verbose = (await openai.audio.transcriptions.create({
      model: "whisper-1",
      file: await toFile(wavFile(audio), "minute.wav"),
      response_format: "verbose_json",
    })) as unknown as Verbose;
    assert.equal(verbose.duration, 60);
    assertSegmentsInside(verbose);
    // Sentences with 3 s and more between them are recognised one at a time.
    assert.equal(verbose.segments.length, 10, JSON.stringify(verbose.segments));
    for (const s of verbose.segments) assert.ok(s.end - s.start <= 20, JSON.stringify(s));
    // Every sentence's start lies within 0.4 s of a segment's start or inside a segment.
    for (const p of placed) {
      const covering = verbose.segments.find((s) => s.start - 0.4 <= p.at && p.at + p.seconds <= s.end + 0.4);
      assert.ok(covering, `the sentence at ${p.at} s (${p.seconds.toFixed(1)} s) is in no segment: ${JSON.stringify(verbose.segments)}`);
    }
    const first = verbose.segments[0]!;
    assert.ok(Math.abs(first.start - 1) <= 0.4, JSON.stringify(first));
    const wer = wordErrorRate(ROUND_TRIP_SENTENCES.join(" "), verbose.text);
    assert.ok(wer <= 0.25, `WER ${wer}: ${verbose.text}`);
  });

  // A sentence without a pause of more than 11 s.
  const LONG_SENTENCE =
    "The old man who lived by the river walks slowly across the wooden bridge every morning to buy fresh bread and a newspaper from the little shop on the corner of the busy market square in the middle of town";

  test("a long sentence without a pause is one segment, whatever the load", async () => {
    const sentence = await espeak(LONG_SENTENCE, ESPEAK_VOICES[1]!.args);
    assert.ok(sentence.length > 11 * 16_000, `${sentence.length / 16_000} s`);
    const verbose = (await openai.audio.transcriptions.create({
      model: "whisper-1",
      file: await toFile(wavFile(concatFloat32([silence(0.5), sentence, silence(0.5)])), "sentence.wav"),
      response_format: "verbose_json",
    })) as unknown as Verbose;
    assert.equal(verbose.segments.length, 1, JSON.stringify(verbose.segments));
    const wer = wordErrorRate(LONG_SENTENCE, verbose.text);
    assert.ok(wer <= 0.1, `WER ${wer}: ${verbose.text}`);
    // Where Silero dips in a word ("a|cross"), a cut lost words.
    assert.match(verbose.text, /slowly across the wooden bridge/, verbose.text);
  });
});

describe("transcription queue", () => {
  let server: TestNode;
  let openai: OpenAI;
  let recogniser: MoonshineEngine;

  before(async () => {
    // One request at a time and none waiting: the second at once is refused.
    recogniser = createTranscriptionEngine({ concurrency: 1, maxQueued: 0, fastAfterMs: false });
    await recogniser.start();
    server = await startTestNode({
      config: { api_keys: [{ name: "a", sha256: sha256(KEY) }] },
      engines: { speech: createSpeechEngine(), transcription: recogniser },
    });
    openai = new OpenAI({ apiKey: KEY, baseURL: `${server.url}/openai/v1`, maxRetries: 0, fetch: server.fetch });
  });
  after(async () => {
    await server?.stop();
    await recogniser?.close();
  });

  test("a full queue answers 429 with Retry-After; the running request completes", async () => {
    const audio = wavFile(await spoken(ESPEAK_VOICES[0]!.args, SENTENCES.slice(0, 4)));
    const running = openai.audio.transcriptions.create({ model: "whisper-1", file: await toFile(audio, "a.wav") });
    // The first request holds the only slot from when its upload is parsed until it is answered.
    while (recogniser.load.running === 0) await sleep(5);
    let refused: unknown;
    try {
      await openai.audio.transcriptions.create({ model: "whisper-1", file: await toFile(wavFile(silence(0.5)), "b.wav") });
    } catch (error) {
      refused = error;
    }
    assert.ok(refused instanceof OpenAI.APIError, String(refused));
    assert.equal(refused.status, 429);
    assert.equal(refused.headers?.get("retry-after"), "1");
    assert.equal((refused.error as { code?: string }).code, "engine_busy");
    assert.ok(wordErrorRate(SENTENCES.slice(0, 4).join(" "), (await running).text) <= 0.25);
  });
});
