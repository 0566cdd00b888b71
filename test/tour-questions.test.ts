/**
 * The README tour's questions are heard as written by the embedded engines, on every run (issue
 * 46): each is spoken by flite in `--say`'s default voice and goes the way the uplink takes it
 * (resampled to 48 kHz, Opus-encoded in 20 ms frames, decoded at the recogniser's 16 kHz), shifted
 * by a fraction of a frame and encoded at two bitrates, since a device's audio never lines up with
 * the frames the same way twice. Moonshine must hear every variant word for word. (The tour's
 * first question, "What is the weather like today?", was heard "… to be?" in most of them.)
 * Fast: no server, no WebRTC; the recipes end to end are in first-minutes.test.ts.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import type { FliteSpeechEngine, MoonshineEngine } from "../src/ai/speech/index.ts";
import { LibOpus } from "../src/audio/opus.ts";
import { SAY_VOICE } from "../src/cli/device-connect.ts";
import { engines } from "./support/engines.ts";
import { ROOT } from "./support/server.ts";
import { wordErrorRate } from "./support/speech.ts";
import { resample } from "./support/voice.ts";

const README = readFileSync(join(ROOT, "README.md"), "utf8");
/** Every question the tour has a device say (`connect … --say "…"`). */
const QUESTIONS = [...README.matchAll(/connect [^\n]*--say "([^"]+)"/g)].map((m) => m[1]!);

/** Shifts (ms) of the speech against the 20 ms frames, and encoder bitrates (bit/s). */
const SHIFTS_MS = [0, 5, 10, 15];
const BITRATES = [24_000, 32_000];

/** `pcm48` (48 kHz) after `lead` samples of silence, through an Opus encoder at 48 kHz and a decoder at 16 kHz, as -1..1 samples. */
function throughUplink(pcm48: Int16Array, lead: number, bitrate: number): Float32Array {
  const audio = new Int16Array(lead + pcm48.length + 48 * 300);
  audio.set(pcm48, lead);
  const encoder = new LibOpus("voip", 48_000);
  const decoder = new LibOpus("voip", 16_000);
  const out: number[] = [];
  try {
    encoder.setBitrate(bitrate);
    for (let i = 0; i + 960 <= audio.length; i += 960) for (const s of decoder.decode(encoder.encode(audio.subarray(i, i + 960)))) out.push(s / 32768);
  } finally {
    encoder.close();
    decoder.close();
  }
  return Float32Array.from(out);
}

describe("the README tour's questions", () => {
  test("the tour has a device ask a question and command a tool", () => {
    assert.equal(QUESTIONS.length, 2, JSON.stringify(QUESTIONS));
  });

  for (const question of QUESTIONS) {
    test(`"${question}" in the --say voice is heard word for word, however it lines up with the uplink's frames`, async () => {
      const host = engines();
      const spoken = await (host.speech as FliteSpeechEngine).speak(question, SAY_VOICE);
      const pcm48 = await resample(spoken.samples, spoken.sampleRate, 48_000);
      const variants = BITRATES.flatMap((bitrate) => SHIFTS_MS.map((shift) => ({ bitrate, shift })));
      // All at once: the recogniser takes them as batches.
      const heard = await Promise.all(
        variants.map(({ bitrate, shift }) => (host.transcription as MoonshineEngine).recognise(throughUplink(pcm48, 4_800 + Math.round(shift * 48), bitrate))),
      );
      const wrong = variants.flatMap((v, i) => (wordErrorRate(question, heard[i]!) === 0 ? [] : [`${v.bitrate / 1000} kbit/s, +${v.shift} ms: "${heard[i]}"`]));
      assert.deepEqual(wrong, [], `heard otherwise than "${question}"`);
    });
  }
});
