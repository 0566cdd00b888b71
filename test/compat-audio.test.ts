import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, before, describe, test } from "node:test";
import OpenAI, { toFile } from "openai";
import { wavFile } from "../src/audio/samples.ts";
import { engines } from "./support/engines.ts";
import { childProcesses } from "./support/processes.ts";
import { startTestNode, type TestNode } from "./support/server.ts";
import { sseJson } from "./support/sse.ts";

const KEY = "sk-perch-audio-test";
const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");

/** A 0.1 s silent WAV: a real container for the routes' content checks. */
function wav(): Buffer {
  return wavFile(new Int16Array(1600), 16_000);
}

describe("Compatible API: audio routes, HTTP side", () => {
  let server: TestNode;
  let openai: OpenAI;
  const url = (path: string) => `${server.url}/openai/v1${path}`;
  const auth = { authorization: `Bearer ${KEY}` };

  before(async () => {
    server = await startTestNode({ config: { api_keys: [{ name: "a", sha256: sha256(KEY) }] }, engines: engines() });
    openai = new OpenAI({ apiKey: KEY, baseURL: url(""), maxRetries: 0, fetch: server.fetch });
  });
  after(() => server?.stop());

  test("an agent's voice must be one of tts-1's: start-up stops naming the field", async () => {
    await assert.rejects(
      startTestNode({
        config: {
          providers: [{ id: "p", kind: "openai-compatible", base_url: "http://127.0.0.1:9/v1" }],
          models: [{ id: "m", kind: "chat", provider: "p", upstream_model: "x" }],
          agents: [{ id: "a", model: "m", voice: "marvin" }],
        },
        engines: engines(),
      }),
      /agents\.0\.voice: unknown voice marvin/,
    );
  });

  test("/models lists tts-1 and whisper-1 (both installed by npm install)", async () => {
    const ids = [];
    for await (const m of openai.models.list()) ids.push(m.id);
    assert.ok(ids.includes("tts-1"));
    assert.ok(ids.includes("whisper-1"));
  });

  test("speech: validation errors name the parameter", async () => {
    const cases: Array<[Record<string, unknown>, number, string]> = [
      [{ voice: "marvin" }, 400, "voice"],
      [{ response_format: "ogg" }, 400, "response_format"],
      [{ speed: 5 }, 400, "speed"],
      [{ speed: 0.1 }, 400, "speed"],
      [{ input: "" }, 400, "input"],
      [{ input: "x".repeat(4097) }, 400, "input"],
      [{ stream_format: "chunks" }, 400, "stream_format"],
      [{ instructions: "whisper it" }, 400, "instructions"],
      [{ style: "x" }, 400, "style"],
      [{ model: "tts-9" }, 404, "model"],
    ];
    for (const [extra, status, param] of cases) {
      const res = await server.fetch(url("/audio/speech"), {
        method: "POST",
        headers: { ...auth, "content-type": "application/json" },
        body: JSON.stringify({ model: "tts-1", input: "Hello there.", voice: "alloy", ...extra }),
      });
      const body = await res.json();
      assert.equal(res.status, status, JSON.stringify({ extra, body }));
      assert.equal(body.error.param, param, JSON.stringify({ extra, body }));
    }
  });

  test("speech: audio with the format's content type, and SSE events", async () => {
    const res = await openai.audio.speech.create({ model: "tts-1", input: "Hello there.", voice: "nova", response_format: "wav" });
    assert.equal(res.headers.get("content-type"), "audio/wav");
    assert.ok((await res.arrayBuffer()).byteLength > 0);

    const sse = await server.fetch(url("/audio/speech"), {
      method: "POST",
      headers: { ...auth, "content-type": "application/json" },
      body: JSON.stringify({ model: "tts-1", input: "Hello there.", voice: "alloy", stream_format: "sse", response_format: "pcm" }),
    });
    assert.match(sse.headers.get("content-type") ?? "", /^text\/event-stream/);
    const events = await sseJson(sse);
    assert.ok(events.length >= 2);
    assert.ok(events.slice(0, -1).every((e) => e.type === "speech.audio.delta" && typeof e.audio === "string"));
    const done = events.at(-1);
    assert.equal(done.type, "speech.audio.done");
    assert.deepEqual(Object.keys(done.usage).sort(), ["input_tokens", "output_tokens", "total_tokens"]);
  });

  test("speech that fails mid-stream ends in an error the client sees, not a short file", async () => {
    const input = "The small device on the kitchen table reports its battery level and its temperature every minute. ".repeat(30);
    const res = await server.fetch(url("/audio/speech"), {
      method: "POST",
      headers: { ...auth, "content-type": "application/json" },
      body: JSON.stringify({ model: "tts-1", input, voice: "nova", response_format: "mp3" }),
    });
    assert.equal(res.status, 200);
    const reader = res.body!.getReader();
    assert.ok(!(await reader.read()).done);
    // The request's encoder dies (a real failure of the engine, not a fake one).
    const encoders = childProcesses()
      .filter((c) => c.name === "ffmpeg")
      .map((c) => c.pid);
    assert.equal(encoders.length, 1, `ffmpeg children: ${encoders}`);
    process.kill(encoders[0]!, "SIGKILL");
    await assert.rejects(async () => {
      for (;;) if ((await reader.read()).done) break;
    });
  });

  const transcription = async (fields: Record<string, string | Blob | undefined>, headers: Record<string, string> = {}) => {
    const form = new FormData();
    for (const [k, v] of Object.entries(fields)) if (v !== undefined) form.append(k, v);
    const res = await server.fetch(url("/audio/transcriptions"), { method: "POST", headers: { ...auth, ...headers }, body: form });
    return { status: res.status, body: await res.json() };
  };

  test("transcriptions: validation errors name the parameter", async () => {
    const file = new Blob([new Uint8Array(wav())], { type: "audio/wav" });
    const ok = { model: "whisper-1", file };
    const cases: Array<[Record<string, string | Blob | undefined>, number, string]> = [
      [{ file: undefined }, 400, "file"],
      [{ file: "not a file" }, 400, "file"],
      [{ file: new Blob([Buffer.from("hello, not audio at all")], { type: "text/plain" }) }, 400, "file"],
      [{ language: "fr" }, 400, "language"],
      [{ language: "english" }, 400, "language"],
      [{ response_format: "xml" }, 400, "response_format"],
      [{ temperature: "hot" }, 400, "temperature"],
      [{ "timestamp_granularities[]": "word", response_format: "json" }, 400, "timestamp_granularities[]"],
      [{ "timestamp_granularities[]": "sentence" }, 400, "timestamp_granularities[]"],
      [{ stream: "yes" }, 400, "stream"],
      [{ chunking_strategy: "auto" }, 400, "chunking_strategy"],
      [{ model: "tts-1" }, 400, "model"],
      [{ model: "whisper-9" }, 404, "model"],
    ];
    for (const [extra, status, param] of cases) {
      const { status: got, body } = await transcription({ ...ok, ...extra });
      assert.equal(got, status, JSON.stringify({ extra: Object.keys(extra), body }));
      assert.equal(body.error.param, param, JSON.stringify({ extra: Object.keys(extra), body }));
    }
    const notMultipart = await server.fetch(url("/audio/transcriptions"), {
      method: "POST",
      headers: { ...auth, "content-type": "application/json" },
      body: "{}",
    });
    assert.equal(notMultipart.status, 400);
  });

  test("transcriptions: a corrupt file → 400 param file", async () => {
    const corrupt = Buffer.concat([wav().subarray(0, 12), Buffer.from("this is not a fmt chunk at all, just garbage")]);
    const { status, body } = await transcription({ model: "whisper-1", file: new Blob([new Uint8Array(corrupt)], { type: "audio/wav" }) });
    assert.equal(status, 400, JSON.stringify(body));
    assert.equal(body.error.param, "file");
  });

  test("round trip through the openai client: audio.speech.create, then audio.transcriptions.create", async () => {
    const sentence = "Open the front door.";
    const speech = await openai.audio.speech.create({ model: "tts-1", input: sentence, voice: "nova", response_format: "mp3" });
    assert.equal(speech.headers.get("content-type"), "audio/mpeg");
    const mp3 = Buffer.from(await speech.arrayBuffer());
    const heard = await openai.audio.transcriptions.create({ model: "whisper-1", file: await toFile(mp3, "door.mp3"), language: "en" });
    const words = heard.text.toLowerCase().split(/\W+/).filter(Boolean);
    for (const w of ["open", "front", "door"]) assert.ok(words.includes(w), `"${w}" not in "${heard.text}"`);
  });

  test("transcriptions: the 25 MB audio limit", async () => {
    const big = Buffer.alloc(25 * 1000 * 1000 + 1);
    wav().copy(big);
    const { status, body } = await transcription({ model: "whisper-1", file: new Blob([new Uint8Array(big)], { type: "audio/wav" }) });
    assert.equal(status, 413);
    assert.equal(body.error.param, "file");
    assert.equal(body.error.type, "invalid_request_error");
  });

  test("transcriptions through the openai client: json, text, verbose_json, srt, vtt", async () => {
    const file = await toFile(wav(), "silence.wav", { type: "audio/wav" });
    const json = await openai.audio.transcriptions.create({ model: "whisper-1", file, language: "en" });
    assert.equal(typeof json.text, "string");
    const verbose = await openai.audio.transcriptions.create({
      model: "whisper-1",
      file: await toFile(wav(), "silence.wav"),
      response_format: "verbose_json",
      timestamp_granularities: ["segment"],
    });
    assert.equal((verbose as unknown as { task: string }).task, "transcribe");
    assert.equal(typeof verbose.duration, "number");
    assert.ok(Array.isArray(verbose.segments));
    for (const format of ["text", "srt", "vtt"] as const) {
      const out = await openai.audio.transcriptions.create({ model: "whisper-1", file: await toFile(wav(), "silence.wav"), response_format: format });
      assert.equal(typeof out, "string");
      if (format === "vtt") assert.match(out as unknown as string, /^WEBVTT/);
    }
  });
});
