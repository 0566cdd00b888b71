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

test("a packet of 120 ms (six 20 ms frames, as RFC 6716 allows) decodes whole and leaves the codec and its neighbours working", () => {
  const sender = new LibOpus("voip");
  const codecs = Array.from({ length: 3 }, () => new LibOpus("voip"));
  const receiver = codecs[0]!;
  try {
    // 400 Hz: 8 whole cycles a frame. The receiver hears the sender's first frames, as a call would.
    let last: Buffer = Buffer.alloc(0);
    for (let f = 0; f < 10; f++) {
      last = sender.encode(tone(400, f));
      if (f < 9) receiver.decode(last);
    }
    assert.equal(last[0]! & 0x03, 0, "one frame per packet");
    const frame = last.subarray(1);
    // Code 3, constant bitrate: six frames of the same size after the frame-count byte.
    const long = Buffer.concat([Buffer.from([(last[0]! & 0xfc) | 3, 6]), ...Array.from({ length: 6 }, () => frame)]);
    const pcm = receiver.decode(long);
    assert.equal(pcm.length, 6 * FRAME);
    for (let k = 0; k < 6; k++) assert.ok(energyAt(pcm.subarray(k * FRAME, (k + 1) * FRAME), 400) > 0.8, `frame ${k} of the packet is the 400 Hz tone`);
    // Its encoder and decoder still work, and so do the codecs allocated beside it.
    for (const [i, c] of codecs.entries()) {
      const hz = 300 + 100 * i;
      let heard: Int16Array = new Int16Array(0);
      for (let f = 0; f < 5; f++) heard = c.decode(c.encode(tone(hz, f)));
      assert.ok(energyAt(heard, hz) > 0.8, `codec ${i} still round-trips its ${hz} Hz tone`);
    }
  } finally {
    for (const c of [sender, ...codecs]) c.close();
  }
});
