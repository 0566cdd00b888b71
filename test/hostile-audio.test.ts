/**
 * Uploaded audio as an attacker sends it (issue 17): a FLAC decompression bomb, audio past the
 * duration limit, and garbage; the decode is bounded in duration, in memory (never on disk) and
 * in CPU time, and its errors name the problem, never a path.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { after, before, describe, test } from "node:test";
import { decodeAudio } from "../src/ai/speech/decode.ts";
import { AudioDecodeError, AudioTooLongError } from "../src/ai/speech/errors.ts";
import { wavFile } from "../src/audio/samples.ts";
import { engines } from "./support/engines.ts";
import { BOMB_BLOCK, BOMB_RATE, flacBomb } from "./support/flac-bomb.ts";
import { startTestNode, type TestNode } from "./support/server.ts";

const KEY = "sk-perch-hostile-audio";
const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");

/** A mono 16-bit WAV of `seconds` of a quiet tone at `rate`. */
function wav(seconds: number, rate = 16_000): Buffer {
  const tone = Int16Array.from({ length: Math.round(seconds * rate) }, (_, i) => Math.round(3000 * Math.sin((2 * Math.PI * 440 * i) / rate)));
  return wavFile(tone, rate);
}

/** Entries in the temporary directory that a decode may have left (ffmpeg's or the recogniser's). */
function tempEntries(): string[] {
  return readdirSync(tmpdir()).filter((n) => n.startsWith("perch-decode-") || n.startsWith("perch-asr-"));
}

describe("decoding untrusted audio", () => {
  test("a FLAC bomb (138 KB, ~20 hours of silence) stops at the duration limit, in memory, nothing on disk", async () => {
    const bomb = flacBomb(10_000);
    assert.ok(bomb.length < 150_000, `${bomb.length} bytes`);
    const hours = (10_000 * BOMB_BLOCK) / BOMB_RATE / 3600;
    assert.ok(hours > 20, `${hours} h`);
    const before = tempEntries();
    const rss = process.memoryUsage().rss;
    await assert.rejects(decodeAudio(bomb), (err: unknown) => err instanceof AudioTooLongError && err.maxSeconds === 600 && /600 seconds/.test(err.message));
    // Nothing on disk, and no more than the fed blocks' worth in memory (the worker thread is gone).
    assert.deepEqual(tempEntries(), before);
    const grown = (process.memoryUsage().rss - rss) / 2 ** 20;
    assert.ok(grown < 400, `resident memory grew ${grown.toFixed(0)} MiB`);
  });

  test("a short FLAC made the same way decodes, and the limit is the caller's", async () => {
    const three = flacBomb(3); // 3 × 65,535 samples at 8 kHz: 24.6 s (the decoder holds back the last frame)
    const decoded = await decodeAudio(three);
    assert.equal(decoded.decoder, "wasm");
    assert.equal(decoded.container, "flac");
    assert.ok(decoded.duration > 16 && decoded.duration < 25, `${decoded.duration} s`);
    await assert.rejects(decodeAudio(three, { maxSeconds: 10 }), AudioTooLongError);
  });

  test("a decode over its CPU time limit is stopped, naming the limit", async () => {
    // Four minutes of FLAC frames take far more than a millisecond of CPU to decode.
    await assert.rejects(decodeAudio(flacBomb(30), { cpuSeconds: 0.001 }), (err: unknown) => {
      assert.ok(err instanceof AudioDecodeError && !(err instanceof AudioTooLongError), String(err));
      assert.match(err.message, /limit of 0\.001 s of CPU time/);
      return true;
    });
    // The same file within the default limit decodes.
    assert.ok((await decodeAudio(flacBomb(30))).duration > 200);
  });

  test("WAV past the limit is refused from its header; under it, decoded and resampled to 16 kHz", async () => {
    await assert.rejects(decodeAudio(wav(3), { maxSeconds: 2 }), AudioTooLongError);
    const decoded = await decodeAudio(wav(1.5, 44_100));
    assert.equal(decoded.sampleRate, 16_000);
    assert.ok(Math.abs(decoded.duration - 1.5) < 0.01, `${decoded.duration}`);
    const peak = decoded.samples.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
    assert.ok(Math.abs(peak - 3000 / 32768) < 0.01, `peak ${peak}`);
  });

  test("garbage, truncated and unsupported files: errors name the problem, never a path", async () => {
    const cases: Uint8Array[] = [
      Buffer.from("not audio at all"),
      wav(1).subarray(0, 30),
      Buffer.concat([Buffer.from("fLaC"), Buffer.alloc(400, 0xab)]),
      Buffer.concat([Buffer.from("ID3"), Buffer.alloc(4000, 0x5a)]),
      // An MP4 box header over garbage: ffmpeg's own complaint must not carry the temporary path.
      Buffer.concat([Buffer.from([0, 0, 0, 24]), Buffer.from("ftypisom"), Buffer.alloc(4000, 0x11)]),
      // A playlist is no container: it never reaches a demuxer that would fetch.
      Buffer.from("#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXTINF:1,\nhttp://127.0.0.1:9/a.ts\n#EXT-X-ENDLIST\n"),
    ];
    for (const bytes of cases) {
      await assert.rejects(decodeAudio(bytes), (err: unknown) => {
        assert.ok(err instanceof AudioDecodeError, String(err));
        assert.doesNotMatch(err.message, /\/(tmp|work|home|var|usr)\b|perch-decode/, err.message);
        return true;
      });
    }
    assert.deepEqual(tempEntries(), []);
  });
});

describe("transcription route against a decompression bomb", { skip: engines().transcription ? false : "no transcription engine" }, () => {
  let server: TestNode;
  before(async () => {
    server = await startTestNode({ config: { api_keys: [{ name: "a", sha256: sha256(KEY) }], compat: { max_audio_seconds: 120 } }, engines: engines() });
  });
  after(() => server?.stop());

  test("400 naming the configured limit; /healthz answers meanwhile", async () => {
    const form = new FormData();
    form.append("model", "whisper-1");
    form.append("file", new Blob([Buffer.from(flacBomb(10_000))], { type: "audio/flac" }), "bomb.flac");
    const answer = server.fetch(`${server.url}/openai/v1/audio/transcriptions`, { method: "POST", headers: { authorization: `Bearer ${KEY}` }, body: form });
    const health = await server.fetch(`${server.url}/healthz`);
    assert.equal(health.status, 200);
    const res = await answer;
    assert.equal(res.status, 400);
    const body = (await res.json()) as { error: { message: string; code: string; param: string } };
    assert.equal(body.error.code, "audio_too_long");
    assert.equal(body.error.param, "file");
    assert.match(body.error.message, /limit of 120 seconds/);
    assert.deepEqual(tempEntries(), []);
  });
});
