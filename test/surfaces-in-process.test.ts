/**
 * The fast layer: the surfaces' validation and error mapping served in process (`Node.request()` on
 * a built node: the exchange and every route, as over TCP), with fake engines; no port is taken, except where a
 * transport must run to be shut down. The end-to-end tests beside it cover the same routes over
 * the network.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { EngineBusyError, type SpeechEngine, type TranscriptionEngine } from "../src/ai/speech/index.ts";
import type { ConfigInput } from "../src/config/config.ts";
import { generateKeyPair } from "../src/crypto/keys.ts";
import { freeUdpPort, startTestNode } from "./support/server.ts";
import { sseJson as events } from "./support/sse.ts";
import { realOfferSdp, sealOffer } from "./support/webrtc.ts";

const KEY = "sk-in-process";
const auth = { authorization: `Bearer ${KEY}` };

/** A node built (store and bus open, nothing listening) with these engines; `request` serves one request in process. */
async function builtNode(engines: { speech?: SpeechEngine; transcription?: TranscriptionEngine }, config: ConfigInput = {}) {
  const n = await startTestNode({
    engines,
    config: { api_keys: [{ name: "app", sha256: createHash("sha256").update(KEY).digest("hex"), models: ["*"] }], ...config },
  });
  return { node: n.node, request: n.request, close: n.stop };
}

const VOICES = ["alloy", "echo", "fable", "onyx", "nova", "shimmer"];

/** A speech engine that plays `script`: pieces of audio, then a failure when `fail` is given. */
function scriptedSpeech(script: { pieces?: number; fail?: Error; busy?: boolean }): SpeechEngine {
  return {
    voices: VOICES,
    synthesize: () => {
      if (script.busy) throw new EngineBusyError();
      return (async function* () {
        for (let i = 0; i < (script.pieces ?? 1); i++) yield new Uint8Array([0xff, 0xfb, i]);
        if (script.fail) throw script.fail;
      })();
    },
  };
}

const speechBody = (o: Record<string, unknown> = {}) => JSON.stringify({ model: "tts-1", input: "Hello there.", voice: "alloy", ...o });
const postJson = (body: string) => ({ method: "POST", headers: { ...auth, "content-type": "application/json" }, body });

describe("in process: the Compatible API's speech route", () => {
  test("a full engine queue is 429 with Retry-After and the engine_busy code", async () => {
    const n = await builtNode({ speech: scriptedSpeech({ busy: true }) });
    try {
      const res = await n.request("/openai/v1/audio/speech", postJson(speechBody()));
      assert.equal(res.status, 429);
      assert.equal(res.headers.get("retry-after"), "1");
      const body = (await res.json()) as { error: Record<string, unknown> };
      assert.equal(body.error.type, "rate_limit_error");
      assert.equal(body.error.code, "engine_busy");
    } finally {
      await n.close();
    }
  });

  test("a synthesis failing mid-stream ends the SSE format with an error event (no audio.done), and aborts the audio format", async () => {
    const n = await builtNode({ speech: scriptedSpeech({ pieces: 2, fail: new Error("the flite worker exited") }) });
    try {
      const sse = await n.request("/openai/v1/audio/speech", postJson(speechBody({ stream_format: "sse" })));
      assert.equal(sse.status, 200);
      const seen = await events(sse);
      assert.deepEqual(
        seen.map((e) => e.type ?? "error"),
        ["speech.audio.delta", "speech.audio.delta", "error"],
      );
      assert.deepEqual(Object.keys(seen.at(-1)!.error).sort(), ["code", "message", "param", "type"]);
      assert.equal(seen.at(-1)!.error.type, "api_error");

      const audio = await n.request("/openai/v1/audio/speech", postJson(speechBody()));
      assert.equal(audio.status, 200);
      await assert.rejects(audio.arrayBuffer(), "audio that broke off does not end like a whole file");
    } finally {
      await n.close();
    }
  });

  test("a whole synthesis ends the SSE format with audio.done and its usage", async () => {
    const n = await builtNode({ speech: scriptedSpeech({ pieces: 1 }) });
    try {
      const seen = await events(await n.request("/openai/v1/audio/speech", postJson(speechBody({ stream_format: "sse" }))));
      assert.deepEqual(
        seen.map((e) => e.type),
        ["speech.audio.delta", "speech.audio.done"],
      );
      assert.equal(seen[1]!.usage.input_tokens, 3);
    } finally {
      await n.close();
    }
  });

  test("validation: each bad field is a 400 naming it", async () => {
    const n = await builtNode({ speech: scriptedSpeech({}) });
    try {
      for (const [field, value] of [
        ["speed", 4.5],
        ["response_format", "ogg"],
        ["voice", "bob"],
        ["input", ""],
      ] as const) {
        const res = await n.request("/openai/v1/audio/speech", postJson(speechBody({ [field]: value })));
        assert.equal(res.status, 400, field);
        assert.equal(((await res.json()) as { error: { param: string } }).error.param, field);
      }
    } finally {
      await n.close();
    }
  });
});

describe("in process: the Compatible API's transcription form", () => {
  let n: Awaited<ReturnType<typeof builtNode>>;
  const recognised: string[] = [];
  before(async () => {
    n = await builtNode({
      transcription: {
        languages: ["en"],
        transcribe: async (o) => {
          recognised.push(o.language ?? "");
          return { language: "en", duration: 1, text: "hello", segments: [{ id: 0, start: 0, end: 1, text: "hello" }] };
        },
      },
    });
  });
  after(() => n.close());

  const wav = () => new File([Buffer.concat([Buffer.from("RIFF0000WAVE"), Buffer.alloc(64)])], "a.wav", { type: "audio/wav" });
  const transcribe = (fields: Record<string, string>, file: File | null = wav()) => {
    const form = new FormData();
    for (const [k, v] of Object.entries(fields)) form.append(k, v);
    if (file) form.append("file", file);
    return n.request("/openai/v1/audio/transcriptions", { method: "POST", headers: auth, body: form });
  };
  const error = async (res: Response) => {
    const body = (await res.json()) as { error: { param: string | null; code: string | null; message: string } };
    assert.ok(body.error, `an error, not ${JSON.stringify(body)} (${res.status})`);
    return body.error;
  };

  test("a valid form is recognised", async () => {
    const res = await transcribe({ model: "whisper-1", language: "en", temperature: "0.2" });
    assert.equal(res.status, 200);
    assert.deepEqual(await res.json(), { text: "hello" });
  });

  test("the language must be an ISO-639-1 code, and one the model has", async () => {
    const before = recognised.length;
    for (const language of ["eng", "EN", "e"]) {
      const res = await transcribe({ model: "whisper-1", language });
      assert.equal(res.status, 400, language);
      const e = await error(res);
      assert.deepEqual([e.param, e.code], ["language", "invalid_value"], language);
      assert.match(e.message, /ISO-639-1/);
    }
    const res = await transcribe({ model: "whisper-1", language: "de" });
    assert.equal(res.status, 400);
    const e = await error(res);
    assert.deepEqual([e.param, e.code], ["language", "unsupported_language"]);
    assert.equal(recognised.length, before, "nothing reached the engine");
  });

  test("the temperature is a number from 0 to 1", async () => {
    for (const temperature of ["1.5", "2", "-0.1", "warm"]) {
      const res = await transcribe({ model: "whisper-1", temperature });
      assert.equal(res.status, 400, temperature);
      const e = await error(res);
      assert.equal(e.param, "temperature");
      assert.match(e.message, /temperature must be a number from 0 to 1/);
    }
  });

  test("model and file are required; the file once, not as text; word timestamps need verbose_json", async () => {
    let e = await error(await transcribe({}));
    assert.deepEqual([e.param, e.code], ["model", "missing_required_parameter"]);
    e = await error(await transcribe({ model: "whisper-1" }, null));
    assert.deepEqual([e.param, e.code], ["file", "missing_required_parameter"]);
    e = await error(await transcribe({ model: "whisper-1", file: "not a file" }, null));
    assert.deepEqual([e.param, e.code], ["file", "missing_required_parameter"]);
    e = await error(await transcribe({ model: "whisper-1", "timestamp_granularities[]": "word" }));
    assert.deepEqual([e.param, e.message], ["timestamp_granularities[]", "word timestamps need response_format verbose_json"]);
    e = await error(await transcribe({ model: "whisper-1", "timestamp_granularities[]": "letter" }));
    assert.equal(e.param, "timestamp_granularities[]");
  });
});

describe("in process: offers to a node whose transport does not run", () => {
  test("before the node listens, an offer is 503 UNAVAILABLE with Retry-After (not a 500)", async () => {
    const n = await builtNode({});
    try {
      const sealed = sealOffer(n.node.domain.ctx.serverKey.publicKeyText, generateKeyPair(), "v=0\r\n");
      const res = await n.request("/webrtc/v1/offer", { method: "POST", headers: sealed.headers, body: sealed.body });
      assert.equal(res.status, 503);
      assert.equal(res.headers.get("retry-after"), "1");
      assert.equal(((await res.json()) as { error: { code: string } }).error.code, "UNAVAILABLE");
    } finally {
      await n.close();
    }
  });

  test("once its transport is shutting down, an offer is 503 UNAVAILABLE with Retry-After", async () => {
    const n = await builtNode({}, { webrtc: { udp_port: await freeUdpPort() } });
    try {
      await n.node.listen();
      await n.node.transport!.close();
      // A real offer: one the transport would answer, but for its shutdown.
      const sealed = sealOffer(n.node.domain.ctx.serverKey.publicKeyText, generateKeyPair(), await realOfferSdp());
      const res = await n.request("/webrtc/v1/offer", { method: "POST", headers: sealed.headers, body: sealed.body });
      assert.equal(res.status, 503);
      assert.ok(res.headers.get("retry-after"));
      assert.equal(((await res.json()) as { error: { code: string } }).error.code, "UNAVAILABLE");
    } finally {
      await n.close();
    }
  });
});
