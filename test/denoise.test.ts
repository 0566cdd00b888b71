/**
 * Noise suppression (src/ai/speech/denoise.ts, issue 50), fast: what each suppressor does to audio.
 * Whether it helps the words is the hearing benchmark's to say (bench/hearing.ts).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { pinkNoise } from "../bench/speech-set.ts";
import { gate, rnnoise, wiener } from "../src/ai/speech/denoise.ts";
import { nonSpeech } from "../src/ai/speech/recogniser.ts";
import { ESPEAK_VOICES, espeak } from "./support/speech.ts";

const RATE = 16_000;
const WIENER = { method: "wiener", floorDb: -15, overSubtraction: 1 } as const;

const rms = (x: Float32Array, from = 0, to = x.length) => {
  let s = 0;
  for (let i = from; i < to; i++) s += x[i]! * x[i]!;
  return Math.sqrt(s / Math.max(1, to - from));
};
const db = (ratio: number) => 20 * Math.log10(ratio);

/** Pink noise of RMS `level`, seeded. */
function noise(n: number, level: number, seed = 5): Float32Array {
  const x = pinkNoise(n, seed);
  const k = level / rms(x);
  return x.map((v) => v * k);
}

/** The power of `x[from, to)` between `lowHz` and `highHz` (a DFT at each hertz). */
function bandPower(x: Float32Array, from: number, to: number, lowHz: number, highHz: number): number {
  let total = 0;
  for (let hz = lowHz; hz <= highHz; hz++) {
    let re = 0;
    let im = 0;
    for (let i = from; i < to; i++) {
      re += x[i]! * Math.cos((2 * Math.PI * hz * i) / RATE);
      im -= x[i]! * Math.sin((2 * Math.PI * hz * i) / RATE);
    }
    total += re * re + im * im;
  }
  return total;
}

const add = (a: Float32Array, b: Float32Array) => a.map((v, i) => v + b[i]!);

/** 3 s: 1 s of noise, 1 s of a 440 Hz tone (RMS 0.07) in it, 1 s of noise; the noise at RMS 0.01 (17 dB below). */
function toneInNoise() {
  const n = 3 * RATE;
  const clean = Float32Array.from({ length: n }, (_, i) => (i >= RATE && i < 2 * RATE ? 0.1 * Math.sin((2 * Math.PI * 440 * i) / RATE) : 0));
  return { clean, noisy: add(clean, noise(n, 0.01)) };
}

test("wiener: a tone in pink noise comes out with the noise at least 6 dB lower and the tone within 0.5 dB", () => {
  const { clean, noisy } = toneInNoise();
  const isNoise = (s: number) => s < RATE - 600 || s >= 2 * RATE + 600;
  const out = wiener(noisy, WIENER, isNoise);
  assert.equal(out.length, noisy.length);
  const noiseDown = db(rms(out, 0, RATE - 600) / rms(noisy, 0, RATE - 600));
  assert.ok(noiseDown < -6, `noise changed by ${noiseDown.toFixed(1)} dB`);
  const toneChange = db(rms(out, RATE + 1000, 2 * RATE - 1000) / rms(clean, RATE + 1000, 2 * RATE - 1000));
  assert.ok(Math.abs(toneChange) < 0.5, `tone changed by ${toneChange.toFixed(2)} dB`);
  // Nearer the clean tone than the noisy input was.
  const error = (x: Float32Array) => rms(x.map((v, i) => v - clean[i]!));
  assert.ok(error(out) < 0.6 * error(noisy), `error ${error(out)} against ${error(noisy)}`);
});

test("wiener, fixed: one gain per bin from the long-term SNR: noise at least 6 dB lower, the tone within 0.5 dB", () => {
  const { clean, noisy } = toneInNoise();
  const out = wiener(noisy, { ...WIENER, fixed: true }, (s) => s < RATE - 600 || s >= 2 * RATE + 600);
  assert.ok(db(rms(out, 0, RATE - 600) / rms(noisy, 0, RATE - 600)) < -6, "noise lowered");
  const toneChange = db(rms(out, RATE + 1000, 2 * RATE - 1000) / rms(clean, RATE + 1000, 2 * RATE - 1000));
  assert.ok(Math.abs(toneChange) < 0.5, `tone changed by ${toneChange.toFixed(2)} dB`);
  // One gain for all time: the noise around 440 Hz passes where the tone is silent too (the
  // frame-by-frame filter takes it away there).
  const band = (x: Float32Array) => bandPower(x, 0, RATE - 600, 430, 450);
  assert.ok(Math.abs(db(Math.sqrt(band(out) / band(noisy)))) < 1, `fixed: 440 Hz in the noise alone changed by ${db(Math.sqrt(band(out) / band(noisy)))} dB`);
  const moving = wiener(noisy, WIENER, (s) => s < RATE - 600 || s >= 2 * RATE + 600);
  assert.ok(db(Math.sqrt(band(moving) / band(noisy))) < -6, "frame by frame: 440 Hz in the noise alone taken away");
});

test("wiener: the noise is measured where the detector heard none, not in the quietest frames", () => {
  // A second of digital silence first: the quietest frames are no noise at all.
  const { noisy } = toneInNoise();
  const audio = new Float32Array(noisy.length + RATE);
  audio.set(noisy, RATE);
  const region = [RATE + 600, 2 * RATE - 600] as const;
  const heard = wiener(audio, WIENER, (s) => s >= region[0] && s < region[1]);
  const guessed = wiener(audio, WIENER);
  assert.ok(db(rms(heard, ...region) / rms(audio, ...region)) < -6, "the detector's noise is suppressed");
  assert.ok(db(rms(guessed, ...region) / rms(audio, ...region)) > -1, "the quietest frames (silence) say there is no noise");
});

test("wiener: silence stays silence; with a floor of 0 dB the audio comes back exactly, edges and odd lengths included", () => {
  for (const n of [0, 1, 100, 511, 512, 513, 16_001]) {
    assert.deepEqual(wiener(new Float32Array(n), WIENER), new Float32Array(n), `${n} samples of silence`);
    const x = noise(n, 0.1, n + 1);
    const out = wiener(x, { ...WIENER, floorDb: 0 });
    assert.equal(out.length, n);
    let worst = 0;
    for (let i = 0; i < n; i++) worst = Math.max(worst, Math.abs(out[i]! - x[i]!));
    assert.ok(worst < 1e-5, `${n} samples: off by ${worst}`);
  }
});

test("rnnoise: speech in pink noise comes out aligned with the speech, the noise alone at least 15 dB lower, the speech kept", async () => {
  const speech = await espeak("Turn on the kitchen lights.", ESPEAK_VOICES[0]!.args);
  const lead = RATE / 2;
  const clean = new Float32Array(speech.length + 2 * lead);
  clean.set(speech, lead);
  const noisy = add(clean, noise(clean.length, rms(speech) / 10 ** (10 / 20)));
  const out = await rnnoise(noisy, { method: "rnnoise", dryDb: undefined });
  assert.equal(out.length, noisy.length);
  const alone = [RATE / 10, lead - RATE / 10] as const;
  assert.ok(db(rms(out, ...alone) / rms(noisy, ...alone)) < -15, `noise alone: ${db(rms(out, ...alone) / rms(noisy, ...alone)).toFixed(1)} dB`);
  // Aligned: the output correlates best with the clean speech at no lag (RNNoise's frame of delay taken out).
  const correlation = (lag: number) => {
    let c = 0;
    for (let i = lead; i < lead + speech.length; i++) c += clean[i]! * (out[i + lag] ?? 0);
    return c;
  };
  let best = 0;
  for (let lag = -400; lag <= 400; lag++) if (correlation(lag) > correlation(best)) best = lag;
  assert.ok(Math.abs(best) <= 2, `best lag ${best} samples`);
  const kept = db(rms(out, lead, lead + speech.length) / rms(clean, lead, lead + speech.length));
  assert.ok(kept > -6, `speech level changed by ${kept.toFixed(1)} dB`);
});

test("rnnoise: the dry signal mixed back at dryDb, silence stays silence", async () => {
  const x = noise(RATE, 0.05);
  const wet = await rnnoise(x, { method: "rnnoise", dryDb: undefined });
  const mixed = await rnnoise(x, { method: "rnnoise", dryDb: -10 });
  const dry = mixed.map((v, i) => v - wet[i]!);
  assert.ok(Math.abs(db(rms(dry) / rms(x)) + 10) < 0.01, `dry at ${db(rms(dry) / rms(x))} dB`);
  const silent = await rnnoise(new Float32Array(RATE), { method: "rnnoise", dryDb: -10 });
  assert.ok(rms(silent) < 1e-6, `silence came out at ${rms(silent)}`);
});

test("gate: non-speech brought down by depthDb, speech untouched, the gain ramped over 10 ms at the edges", () => {
  const x = noise(RATE, 0.1);
  const speech = [4000, 12_000] as const;
  const out = gate(x, { method: "gate", depthDb: -20 }, (s) => s < speech[0] || s >= speech[1]);
  for (let i = speech[0] + 160; i < speech[1]; i++) assert.equal(out[i], x[i], `sample ${i} changed`);
  assert.ok(Math.abs(db(rms(out, 0, speech[0]) / rms(x, 0, speech[0])) + 20) < 0.01, "before speech: −20 dB");
  assert.ok(Math.abs(db(rms(out, speech[1] + 160) / rms(x, speech[1] + 160)) + 20) < 0.01, "after speech: −20 dB");
  // The gain never jumps: it takes 160 samples from 0.1 to 1.
  for (let i = 1; i < x.length; i++)
    if (x[i] !== 0 && x[i - 1] !== 0) assert.ok(Math.abs(out[i]! / x[i]! - out[i - 1]! / x[i - 1]!) < 0.9 / 150, `a step at ${i}`);
  assert.deepEqual(gate(x, { method: "gate", depthDb: -20 }), x, "without a detector nothing is gated");
});

test("a file's noise is where the detector's frames and their three neighbours each side are below 0.2", () => {
  // Frames of 512 samples: speech in frames 10 and 11.
  const p = new Float32Array(20).fill(0.05);
  p[10] = 0.9;
  p[11] = 0.6;
  const isNoise = nonSpeech(p);
  const frameOf = (f: number) => f * 512 + 100;
  assert.deepEqual(
    Array.from({ length: 20 }, (_, f) => (isNoise(frameOf(f)) ? 1 : 0)),
    [1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1],
  );
  assert.equal(isNoise(20 * 512 + 5), false, "past the last whole frame: not known to be noise");
});
