/**
 * The recogniser's front end (src/ai/speech/front-end.ts, issue 50), fast: what it does to audio,
 * exactly. Whether it helps the words is the hearing benchmark's to say (bench/hearing.ts).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { FRONT_END, frontEnd } from "../src/ai/speech/front-end.ts";

const RATE = 16_000;

function tone(seconds: number, hz: number, amplitude: number, dc = 0): Float32Array {
  return Float32Array.from({ length: Math.round(seconds * RATE) }, (_, i) => dc + amplitude * Math.sin((2 * Math.PI * hz * i) / RATE));
}

const rms = (x: Float32Array, from = 0, to = x.length) => {
  let s = 0;
  for (let i = from; i < to; i++) s += x[i]! * x[i]!;
  return Math.sqrt(s / (to - from));
};
const mean = (x: Float32Array, from = 0, to = x.length) => {
  let s = 0;
  for (let i = from; i < to; i++) s += x[i]!;
  return s / (to - from);
};
const dbfs = (level: number) => 20 * Math.log10(level);

test("the high-pass takes away a DC offset and rumble, and keeps speech's frequencies", () => {
  const o = { highPassHz: 80, speechDbfs: undefined, floorDbfs: undefined };
  const offset = frontEnd(tone(1, 300, 0.1, 0.2), o);
  assert.ok(Math.abs(mean(offset, RATE / 2)) < 1e-3, `DC left: ${mean(offset, RATE / 2)}`);
  const rumble = frontEnd(tone(1, 20, 0.2), o);
  assert.ok(rms(rumble, RATE / 2) < 0.2 * 0.05, `20 Hz left at ${rms(rumble, RATE / 2)}`);
  const voice = frontEnd(tone(1, 300, 0.2), o);
  assert.ok(Math.abs(rms(voice, RATE / 2) / rms(tone(1, 300, 0.2)) - 1) < 0.03, "300 Hz passes");
});

test("the level: speech brought to speechDbfs, whether it came in soft or loud; at most 24 dB either way", () => {
  const o = { highPassHz: 0, speechDbfs: -23, floorDbfs: undefined };
  for (const amplitude of [0.01, 0.1, 0.5]) {
    const out = frontEnd(tone(1, 300, amplitude), o);
    assert.ok(Math.abs(dbfs(rms(out)) - -23) < 0.2, `${amplitude} → ${dbfs(rms(out))} dBFS`);
  }
  // −80 dBFS of hum is not made speech: +24 dB at most.
  const faint = frontEnd(tone(1, 300, 1e-4 * Math.SQRT2), o);
  assert.ok(Math.abs(dbfs(rms(faint)) - (-80 + 24)) < 0.5, `${dbfs(rms(faint))}`);
  // Its loud part decides, not the silence around it.
  const padded = new Float32Array(3 * RATE);
  padded.set(tone(1, 300, 0.05), RATE);
  assert.ok(Math.abs(dbfs(rms(frontEnd(padded, o), RATE, 2 * RATE)) - -23) < 0.2);
});

test("the floor: seeded noise at floorDbfs, the same for the same audio; digital silence gets exactly it", () => {
  const silence = new Float32Array(RATE);
  const a = frontEnd(silence, FRONT_END);
  const b = frontEnd(silence, FRONT_END);
  assert.deepEqual(a, b, "deterministic");
  assert.ok(Math.abs(dbfs(rms(a)) - FRONT_END.floorDbfs!) < 0.5, `${dbfs(rms(a))} dBFS`);
  // Two renditions of an utterance that differ in the last bits of its silence (a converter's
  // dither): there, they differ by a small share of the floor.
  const speech = new Float32Array(2 * RATE);
  speech.set(tone(1, 300, 0.1), RATE);
  const dithered = Float32Array.from(speech, (x, i) => (i < RATE ? x + (((i * 7919) % 3) - 1) / 32768 : x));
  const [clean, other] = [frontEnd(speech, FRONT_END), frontEnd(dithered, FRONT_END)];
  const difference = Float32Array.from(other.subarray(0, RATE), (x, i) => x - clean[i]!);
  assert.ok(rms(difference) < rms(a) / 5, `dither's difference ${dbfs(rms(difference))} dBFS against the floor's ${FRONT_END.floorDbfs}`);
});

test("frontEnd never changes its input", () => {
  const input = tone(0.5, 300, 0.1, 0.1);
  const copy = input.slice();
  frontEnd(input, FRONT_END);
  assert.deepEqual(input, copy);
});

test("the files' front end takes mains hum (50 and 60 Hz) at least 12 dB down and keeps 300 Hz within 0.5 dB", () => {
  const o = { ...FRONT_END, speechDbfs: undefined, floorDbfs: undefined };
  for (const hz of [50, 60]) {
    const hum = frontEnd(tone(1, hz, 0.1), o);
    assert.ok(dbfs(rms(hum, RATE / 2) / rms(tone(1, hz, 0.1))) < -12, `${hz} Hz: ${dbfs(rms(hum, RATE / 2) / rms(tone(1, hz, 0.1)))} dB`);
  }
  const voice = frontEnd(tone(1, 300, 0.1), o);
  assert.ok(Math.abs(dbfs(rms(voice, RATE / 2) / rms(tone(1, 300, 0.1)))) < 0.5, "300 Hz passes");
});
