/**
 * libopus through our own glue (src/audio/opus.ts): many codecs alive at once, each hearing only
 * its own stream. opusscript's glue, which this replaced, placed PCM buffers at twice their
 * addresses: codecs wrote over each other, and past about 77 of them every call failed.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { LibOpus, opusModules } from "../src/audio/opus.ts";

const FRAME = 960;

function tone(hz: number, frame: number): Int16Array {
  return Int16Array.from({ length: FRAME }, (_, i) => Math.round(Math.sin((2 * Math.PI * hz * (frame * FRAME + i)) / 48_000) * 10_000));
}

/** The share of `pcm`'s energy at `hz` (a single-bin DFT), 0–1. */
function energyAt(pcm: Int16Array, hz: number): number {
  let re = 0;
  let im = 0;
  let total = 0;
  for (let i = 0; i < pcm.length; i++) {
    re += pcm[i]! * Math.cos((2 * Math.PI * hz * i) / 48_000);
    im += pcm[i]! * Math.sin((2 * Math.PI * hz * i) / 48_000);
    total += pcm[i]! ** 2;
  }
  return total === 0 ? 0 : (2 * (re * re + im * im)) / pcm.length / total;
}

test("200 codecs at once, frames interleaved: each decodes its own tone, and their memory is released", () => {
  const count = 200;
  const before = opusModules();
  const codecs = Array.from({ length: count }, () => new LibOpus("voip"));
  assert.ok(opusModules() >= 4, `200 codecs over ${opusModules()} module instances`);
  const hz = (i: number) => 200 + i * 15;
  const heard: Int16Array[][] = codecs.map(() => []);
  try {
    for (let f = 0; f < 10; f++) {
      const packets = codecs.map((c, i) => c.encode(tone(hz(i), f)));
      for (const [i, c] of codecs.entries()) heard[i]!.push(c.decode(packets[i]!));
    }
    for (const [i, frames] of heard.entries()) {
      // The codec's first frames settle; the last is compared.
      const last = frames.at(-1)!;
      assert.equal(last.length, FRAME);
      const own = energyAt(last, hz(i));
      assert.ok(own > 0.8, `codec ${i} hears its own ${hz(i)} Hz tone (${own.toFixed(2)} of the energy)`);
    }
  } finally {
    for (const c of codecs) c.close();
  }
  assert.equal(opusModules(), Math.max(1, before), "the extra module instances are dropped once empty");
  assert.throws(() => codecs[0]!.encode(tone(440, 0)), /closed/);
});

test("a packet libopus refuses throws and leaves the codec usable; sizes outside libopus's are refused", () => {
  const codec = new LibOpus("voip");
  try {
    assert.throws(() => codec.decode(new Uint8Array([0xff, 0xff, 0xff, 0xff, 0x00])), /libopus decode failed/);
    assert.throws(() => codec.decode(new Uint8Array(0)), RangeError);
    assert.throws(() => codec.encode(new Int16Array(2881)), RangeError);
    const pcm = codec.decode(codec.encode(tone(440, 0)));
    assert.equal(pcm.length, FRAME);
  } finally {
    codec.close();
  }
  codec.close(); // twice is harmless
});
