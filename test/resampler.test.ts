/** The one resampler (Speex) for float samples, as the decoders use it: cut anywhere, flushed to the input's duration. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { loadResampler, Resampler } from "../src/audio/resampler.ts";

function tone(rate: number, seconds: number, hz = 1000, amplitude = 0.5): Float32Array {
  const out = new Float32Array(Math.round(rate * seconds));
  for (let i = 0; i < out.length; i++) out[i] = amplitude * Math.sin((2 * Math.PI * hz * i) / rate);
  return out;
}

function join(parts: Float32Array[]): Float32Array {
  const out = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

test("float: cut into blocks of any size, the same as in one piece; flushed, as long as the input's duration at the output rate", async () => {
  const m = await loadResampler();
  for (const from of [44_100, 48_000, 8_000, 22_050]) {
    const input = tone(from, 1.3);
    const whole = new Resampler(m, from, 16_000);
    const one = join([whole.processFloat(input), whole.flushFloat()]);
    whole.close();
    const cut = new Resampler(m, from, 16_000);
    const parts: Float32Array[] = [];
    for (let at = 0, n = 1; at < input.length; at += n, n = ((n * 7 + 3) % 4999) + 1) parts.push(cut.processFloat(input.subarray(at, at + n)));
    parts.push(cut.flushFloat());
    cut.close();
    const pieces = join(parts);
    assert.equal(one.length, Math.round((input.length * 16_000) / from), `${from} Hz`);
    assert.deepEqual(pieces, one, `${from} Hz`);
    // The tone comes through at its level (well inside the filter's pass band), and it is not shifted in time.
    const middle = one.subarray(2000, 18_000);
    const peak = middle.reduce((p, v) => Math.max(p, Math.abs(v)), 0);
    assert.ok(Math.abs(peak - 0.5) < 0.02, `${from} Hz: peak ${peak}`);
    const expected = 0.5 * Math.sin((2 * Math.PI * 1000 * 10_000) / 16_000);
    assert.ok(Math.abs(one[10_000]! - expected) < 0.05, `${from} Hz: ${one[10_000]} for ${expected}`);
  }
});
