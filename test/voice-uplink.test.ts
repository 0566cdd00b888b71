import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { loadResampler, Resampler } from "../src/audio/resampler.ts";
import { concatInt16 } from "../src/audio/samples.ts";
import { JitterBuffer, type JitterOutput } from "../src/voice/jitter.ts";
import { FRAME_SAMPLES, OpusCodec } from "../src/voice/opus.ts";
import { parseRtp, type RtpPacket } from "../src/voice/rtp.ts";
import { Uplink } from "../src/voice/uplink.ts";

function sine(samples: number, rate: number, hz: number, offset = 0): Int16Array {
  const out = new Int16Array(samples);
  for (let i = 0; i < samples; i++) out[i] = Math.round(Math.sin((2 * Math.PI * hz * (i + offset)) / rate) * 10_000);
  return out;
}

function rtp(seq: number, ts: number, payload: Buffer, pt = 111, ssrc = 0x1234): Buffer {
  const h = Buffer.alloc(12);
  h[0] = 0x80;
  h[1] = pt;
  h.writeUInt16BE(seq & 0xffff, 2);
  h.writeUInt32BE(ts >>> 0, 4);
  h.writeUInt32BE(ssrc, 8);
  return Buffer.concat([h, payload]);
}

function packet(seq: number, ts: number, payload = Buffer.from([0xf8, 1, 2])): RtpPacket {
  return parseRtp(rtp(seq, ts, payload))!;
}

describe("RTP parsing", () => {
  test("reads the header, skips CSRCs, the extension and padding, and refuses RTCP and garbage", () => {
    const payload = Buffer.from([9, 8, 7]);
    const p = parseRtp(rtp(65535, 4_000_000_000, payload))!;
    assert.equal(p.sequence, 65535);
    assert.equal(p.timestamp, 4_000_000_000);
    assert.equal(p.payloadType, 111);
    assert.deepEqual([...p.payload], [9, 8, 7]);
    // One CSRC, a one-word extension and two bytes of padding.
    const h = Buffer.alloc(12 + 4 + 8);
    h[0] = 0x80 | 0x20 | 0x10 | 1;
    h[1] = 111;
    h.writeUInt16BE(1, 12 + 4 + 2);
    const padded = Buffer.concat([h, payload, Buffer.from([0, 2])]);
    assert.deepEqual([...parseRtp(padded)!.payload], [9, 8, 7]);
    const rtcp = rtp(1, 1, payload);
    rtcp[1] = 200;
    assert.equal(parseRtp(rtcp), undefined);
    assert.equal(parseRtp(Buffer.alloc(5)), undefined);
    assert.equal(parseRtp(Buffer.from([0x40, ...Buffer.alloc(20)])), undefined, "version 1");
    const bad = Buffer.alloc(12);
    bad[0] = 0x8f; // 15 CSRCs in a 12-byte packet
    assert.equal(parseRtp(bad), undefined);
  });
});

describe("jitter buffer", () => {
  function buffer(now: { t: number }) {
    const out: JitterOutput[] = [];
    const jb = new JitterBuffer({ depthMs: 60, frameSamples: 960, clockRate: 48_000, maxGapMs: 2000, output: (o) => out.push(o), now: () => now.t });
    return { jb, out };
  }
  const kinds = (out: JitterOutput[]) =>
    out.map((o) => (o.kind === "packet" ? o.payload[1] : o.kind === "lost" ? `lost ${o.samples}` : `silence ${o.samples}`));

  test("reorders, across the sequence number's wrap", () => {
    const now = { t: 0 };
    const { jb, out } = buffer(now);
    const order = [0, 2, 1, 3, 5, 4, 6];
    for (const i of order) jb.push(packet(65533 + i, 1000 + i * 960, Buffer.from([0xf8, i])));
    assert.deepEqual(kinds(out), [0, 1, 2, 3, 4, 5, 6]);
    assert.equal(jb.stats.lost, 0);
  });

  test("a missing packet is concealed after the buffer's depth, and a late one is dropped", () => {
    const now = { t: 0 };
    const { jb, out } = buffer(now);
    jb.push(packet(10, 0, Buffer.from([0xf8, 0])));
    jb.push(packet(12, 1920, Buffer.from([0xf8, 2])));
    assert.deepEqual(kinds(out), [0], "waits for 11");
    now.t = 59;
    jb.tick();
    assert.deepEqual(kinds(out), [0]);
    now.t = 61;
    jb.tick();
    assert.deepEqual(kinds(out), [0, "lost 960", 2]);
    jb.push(packet(11, 960, Buffer.from([0xf8, 1])));
    jb.push(packet(12, 1920, Buffer.from([0xf8, 2])));
    assert.deepEqual(kinds(out), [0, "lost 960", 2], "late and duplicate packets are dropped");
    assert.equal(jb.stats.late, 2);
  });

  test("a burst of loss longer than the depth goes on without waiting", () => {
    const now = { t: 0 };
    const { jb, out } = buffer(now);
    jb.push(packet(0, 0, Buffer.from([0xf8, 0])));
    for (let i = 3; i < 8; i++) jb.push(packet(i, i * 960, Buffer.from([0xf8, i])));
    assert.deepEqual(kinds(out), [0, "lost 960", "lost 960", 3, 4, 5, 6, 7]);
  });

  test("a pause in the timestamps (discontinuous transmission) comes out as silence; a new stream restarts", () => {
    const now = { t: 0 };
    const { jb, out } = buffer(now);
    jb.push(packet(0, 0, Buffer.from([0xf8, 0])));
    jb.push(packet(1, 960 * 6, Buffer.from([0xf8, 1])));
    assert.deepEqual(kinds(out), [0, "silence 4800", 1]);
    jb.push(packet(30_000, 123, Buffer.from([0xf8, 2])));
    jb.push(packet(30_001, 123 + 960, Buffer.from([0xf8, 3])));
    assert.deepEqual(kinds(out).slice(3), [2, 3]);
    assert.equal(jb.stats.resets, 1);
  });
});

describe("resampler", () => {
  test("48 kHz cut into frames of any size comes out exactly as resampled in one piece", async () => {
    const m = await loadResampler();
    const input = sine(48_000, 48_000, 440);
    const whole = new Resampler(m, 48_000, 16_000);
    const reference = whole.process(input);
    whole.close();
    const pieces = new Resampler(m, 48_000, 16_000);
    const parts: Int16Array[] = [];
    const sizes = [960, 7, 333, 1, 4800, 959, 10_000];
    for (let at = 0, i = 0; at < input.length; i++) {
      const n = Math.min(sizes[i % sizes.length]!, input.length - at);
      parts.push(pieces.process(input.subarray(at, at + n)));
      at += n;
    }
    pieces.close();
    const joined = concatInt16(parts);
    assert.deepEqual(joined, reference);
    // A third of the samples, less the filter's delay (held back at the end: the start is aligned), and the same tone.
    assert.ok(joined.length > 15_900 && joined.length <= 16_000, `${joined.length} samples`);
    const expected = sine(16_000, 16_000, 440);
    let err = 0;
    for (let i = 100; i < joined.length - 100; i++) err += Math.abs(joined[i]! - expected[i]!);
    assert.ok(err / joined.length < 400, `mean error ${err / joined.length}`);
  });

  test("every rate pair the engines use gives a second's worth of samples (24 → 16 kHz lost them all once)", async () => {
    const m = await loadResampler();
    for (const [from, to] of [
      [24_000, 16_000],
      [24_000, 48_000],
      [48_000, 16_000],
      [16_000, 48_000],
      [22_050, 16_000],
    ] as const) {
      const r = new Resampler(m, from, to);
      const input = sine(from, from, 440);
      let total = 0;
      for (let at = 0; at < input.length; at += from / 50) total += r.process(input.subarray(at, at + from / 50)).length;
      r.close();
      assert.ok(total > to * 0.99 && total <= to, `${from} → ${to}: ${total} samples`);
    }
  });

  test("a closed resampler refuses work", async () => {
    const r = new Resampler(await loadResampler(), 16_000, 48_000);
    r.close();
    assert.throws(() => r.process(new Int16Array(10)), /closed/);
  });
});

describe("uplink", () => {
  test("Opus RTP, reordered, with a loss, garbage and RTCP, comes out as 16 kHz audio of the whole timeline", async () => {
    const encoder = new OpusCodec();
    const frames = 50;
    const source = sine(frames * FRAME_SAMPLES, 48_000, 300);
    const packets = Array.from({ length: frames }, (_, i) =>
      rtp(100 + i, 5000 + i * FRAME_SAMPLES, encoder.encode(source.subarray(i * FRAME_SAMPLES, (i + 1) * FRAME_SAMPLES))),
    );
    encoder.close();
    const codec = new OpusCodec(16_000);
    const out: Int16Array[] = [];
    const uplink = new Uplink({ codec, payloadType: 111, pcm: (s) => out.push(s) });
    const order = packets.map((_, i) => i).filter((i) => i !== 20);
    [order[5], order[6]] = [order[6]!, order[5]!];
    for (const i of order) {
      uplink.packet(packets[i]!);
      if (i === 30) {
        uplink.packet(Buffer.from("not rtp at all"));
        uplink.packet(rtp(1, 1, Buffer.from([1, 2]), 96));
        const rtcp = rtp(1, 1, Buffer.alloc(8));
        rtcp[1] = 201;
        uplink.packet(rtcp);
      }
    }
    uplink.jitter.flush();
    const pcm = concatInt16(out);
    assert.equal(uplink.stats.lost, 1);
    assert.equal(uplink.stats.rejected, 1, "the other payload type");
    // Every 20 ms is there (the lost one concealed), decoded at 16 kHz: no resampler, no delay.
    assert.equal(pcm.length, frames * 320);
    let energy = 0;
    for (const s of pcm.subarray(2000)) energy += s * s;
    assert.ok(Math.sqrt(energy / (pcm.length - 2000)) > 3000, "the tone is heard");
    codec.close();
  });

  test("a packet libopus refuses is concealed for as long as it says it lasts: the timeline holds, and refused packets claim no more audio than good ones", async () => {
    const encoder = new OpusCodec();
    const good = encoder.encode(sine(FRAME_SAMPLES, 48_000, 300));
    encoder.close();
    const codec = new OpusCodec(16_000);
    let samples = 0;
    let now = 0;
    const uplink = new Uplink({ codec, payloadType: 111, pcm: (s) => (samples += s.length), now: () => now });
    // Two 2.5 ms CELT frames (code 1) of unequal halves: 5 ms that libopus refuses.
    const refused = Buffer.from([(16 << 3) | 1, 1, 2, 3]);
    uplink.packet(rtp(0, 0, good));
    for (let i = 0; i < 100; i++) {
      now += 5;
      uplink.packet(rtp(1 + i, FRAME_SAMPLES + i * 240, refused));
    }
    uplink.packet(rtp(101, FRAME_SAMPLES + 100 * 240, good));
    uplink.jitter.flush();
    assert.equal(uplink.stats.rejected, 100);
    assert.equal(uplink.stats.dropped, 0);
    // 20 ms + 100 × 5 ms + 20 ms at 16 kHz.
    assert.equal(samples, (2 * FRAME_SAMPLES + 100 * 240) / 3);
    codec.close();
  });
});

/** An RTP packet whose one-byte header extension (RFC 8285) carries the audio level (RFC 6464) under `id`. */
function leveled(seq: number, ts: number, payload: Buffer, level: number, id = 1): Buffer {
  const h = Buffer.alloc(20);
  h[0] = 0x90;
  h[1] = 111;
  h.writeUInt16BE(seq & 0xffff, 2);
  h.writeUInt32BE(ts >>> 0, 4);
  h.writeUInt32BE(0x1234, 8);
  h.writeUInt16BE(0xbede, 12);
  h.writeUInt16BE(1, 14);
  h[16] = 0; // a padding byte first, then the element (id, one byte long)
  h[17] = (id << 4) | 0;
  h[18] = 0x80 | (level & 0x7f); // the voice-activity bit is not read
  return Buffer.concat([h, payload]);
}

/** Loud 20 ms blocks (16 kHz) of `pcm`: those whose RMS is over 2000. */
function loudBlocks(pcm: Int16Array): number[] {
  const blocks: number[] = [];
  for (let b = 0; (b + 1) * 320 <= pcm.length; b++) {
    let sum = 0;
    for (let i = b * 320; i < (b + 1) * 320; i++) sum += pcm[i]! * pcm[i]!;
    if (Math.sqrt(sum / 320) > 2000) blocks.push(b);
  }
  return blocks;
}

describe("silence costs no decoding", () => {
  /** `frames` 20 ms Opus packets of a tone (or of digital silence), encoded as a device would. */
  function encoded(frames: number, loud: boolean): Buffer[] {
    const encoder = new OpusCodec();
    const source = loud ? sine(frames * FRAME_SAMPLES, 48_000, 300) : new Int16Array(frames * FRAME_SAMPLES);
    const out = Array.from({ length: frames }, (_, i) => encoder.encode(source.subarray(i * FRAME_SAMPLES, (i + 1) * FRAME_SAMPLES)));
    encoder.close();
    return out;
  }

  test("the audio level is read from one-byte and two-byte extensions, only under the negotiated id", () => {
    const payload = Buffer.from([0xf8, 1, 2]);
    assert.equal(parseRtp(leveled(1, 0, payload, 127), 1)!.level, 127);
    assert.equal(parseRtp(leveled(1, 0, payload, 33), 1)!.level, 33);
    assert.equal(parseRtp(leveled(1, 0, payload, 33), 2)!.level, undefined, "another id");
    assert.equal(parseRtp(leveled(1, 0, payload, 33))!.level, undefined, "not negotiated");
    assert.deepEqual([...parseRtp(leveled(1, 0, payload, 33), 1)!.payload], [0xf8, 1, 2]);
    // Two-byte form (profile 0x1000): id 1, length 1, the level, padding.
    const h = Buffer.alloc(16);
    h[0] = 0x90;
    h[1] = 111;
    h.writeUInt16BE(0x1000, 12);
    h.writeUInt16BE(1, 14);
    const two = Buffer.concat([h, Buffer.from([1, 1, 45, 0]), payload]);
    assert.equal(parseRtp(two, 1)!.level, 45);
    // An element longer than the block is no level, and the packet is still read.
    const broken = leveled(1, 0, payload, 33);
    broken[17] = (1 << 4) | 7;
    assert.equal(parseRtp(broken, 1)!.level, undefined);
  });

  test("a device's DTX: the tiny packets of its pauses are not decoded, the gaps are silence, and its words after a long pause are whole", () => {
    const codec = new OpusCodec(16_000);
    const out: Int16Array[] = [];
    let now = 0;
    const uplink = new Uplink({ codec, payloadType: 111, pcm: (s) => out.push(s), now: () => now });
    let seq = 0;
    let ts = 0;
    const send = (payload: Buffer, samples = FRAME_SAMPLES) => {
      uplink.packet(rtp(seq++, ts, payload));
      ts += samples;
      now += (samples / 48_000) * 1000;
    };
    for (const p of encoded(15, true)) send(p);
    // 4 s of discontinuous transmission: a one-byte packet (the table of contents alone) every 400 ms.
    for (let i = 0; i < 10; i++) send(Buffer.from([0x78]), 400 * 48);
    for (const p of encoded(15, true)) send(p);
    uplink.jitter.flush();
    const pcm = concatInt16(out);
    assert.equal(uplink.stats.silent, 10, "no DTX packet decoded");
    assert.equal(uplink.stats.decoded, 30);
    assert.equal(pcm.length, (30 * FRAME_SAMPLES + 10 * 400 * 48) / 3, "the whole timeline, at 16 kHz");
    const loud = loudBlocks(pcm);
    const second = 15 + 200; // the second word's first 20 ms block
    assert.ok(loud.includes(second), `the second word's first 20 ms is heard (loud blocks ${loud.join(",")})`);
    assert.equal(loud.filter((b) => b >= second).length, 15, "all of it");
    assert.equal(loud.filter((b) => b > 15 && b < second).length, 0, "the pause is silence");
    codec.close();
  });

  test("a device that sends its audio level: silent packets are not decoded, speech after a long silence is whole, and without the extension everything is", () => {
    for (const negotiated of [true, false]) {
      const codec = new OpusCodec(16_000);
      const out: Int16Array[] = [];
      let now = 0;
      const uplink = new Uplink({ codec, payloadType: 111, audioLevelId: negotiated ? 3 : undefined, pcm: (s) => out.push(s), now: () => now });
      let seq = 0;
      const silence = encoded(250, false);
      const word = encoded(15, true);
      for (const p of silence) {
        uplink.packet(leveled(seq, seq * FRAME_SAMPLES, p, 127, 3));
        seq++;
        now += 20;
      }
      for (const p of word) {
        uplink.packet(leveled(seq, seq * FRAME_SAMPLES, p, 12, 3));
        seq++;
        now += 20;
      }
      uplink.jitter.flush();
      const pcm = concatInt16(out);
      assert.equal(pcm.length, 265 * 320);
      // The last 200 ms of the silence (10 packets) are decoded before the word: its soft start would be there.
      assert.equal(uplink.stats.silent, negotiated ? 240 : 0);
      assert.equal(uplink.stats.decoded, negotiated ? 25 : 265);
      const loud = loudBlocks(pcm);
      assert.deepEqual(
        loud,
        Array.from({ length: 15 }, (_, i) => 250 + i),
        "the word from its first 20 ms",
      );
      codec.close();
    }
  });

  test('the quiet parts of speech are heard: a soft start (a "th" or "f" under -50 dBov) and a soft stretch inside a word are decoded, not erased', () => {
    // 48 kHz noise of an RMS `dbov` below full scale (a fricative, a microphone's floor), seeded.
    let seed = 7;
    const noise = (samples: number, dbov: number) => {
      const amplitude = 10 ** (-dbov / 20) * 32768 * Math.sqrt(3);
      return Int16Array.from({ length: samples }, () => {
        seed = (seed * 1103515245 + 12345) & 0x7fffffff;
        return Math.round((seed / 0x7fffffff - 0.5) * 2 * amplitude);
      });
    };
    // 1 s of a microphone's floor (-66 dBov), a soft start of 80 ms (-54 dBov), 300 ms of voice, a
    // soft 100 ms inside the word (-55 dBov), 200 ms of voice, a soft end of 100 ms, then the floor again.
    const parts = [
      noise(48_000, 66),
      noise(3_840, 54),
      sine(14_400, 48_000, 300),
      noise(4_800, 55),
      sine(9_600, 48_000, 300),
      noise(4_800, 55),
      noise(72_000, 66),
    ];
    const source = concatInt16(parts);
    const encoder = new OpusCodec();
    const frames = source.length / FRAME_SAMPLES;
    const packets = Array.from({ length: frames }, (_, i) => {
      const frame = source.subarray(i * FRAME_SAMPLES, (i + 1) * FRAME_SAMPLES);
      let sum = 0;
      for (const x of frame) sum += x * x;
      // The level as libwebrtc sends it: the frame's RMS in -dBov, 0..127.
      const level = Math.min(127, Math.round(-10 * Math.log10(sum / frame.length / 32768 ** 2)));
      return { payload: encoder.encode(frame), level };
    });
    encoder.close();
    const heard = (negotiated: boolean): Int16Array => {
      const codec = new OpusCodec(16_000);
      const out: Int16Array[] = [];
      let now = 0;
      const uplink = new Uplink({ codec, payloadType: 111, audioLevelId: negotiated ? 1 : undefined, pcm: (s) => out.push(s), now: () => now });
      for (const [i, p] of packets.entries()) {
        uplink.packet(leveled(i, i * FRAME_SAMPLES, p.payload, p.level));
        now += 20;
      }
      uplink.flush();
      codec.close();
      return concatInt16(out);
    };
    const plain = heard(false);
    const leveledPcm = heard(true);
    assert.equal(leveledPcm.length, plain.length, "the same timeline");
    const rms = (pcm: Int16Array, block: number) => {
      let sum = 0;
      for (let i = block * 320; i < (block + 1) * 320; i++) sum += pcm[i]! ** 2;
      return Math.sqrt(sum / 320);
    };
    // The soft start (blocks 50–53), the soft stretch inside the word (69–73) and its soft end (84–88) are in both.
    const soft = [50, 51, 52, 53, 69, 70, 71, 72, 73, 84, 85, 86, 87, 88];
    assert.ok(
      soft.every((b) => packets[b]!.level >= 50),
      `the soft parts are under -50 dBov: ${soft.map((b) => packets[b]!.level)}`,
    );
    for (const b of soft)
      assert.ok(rms(leveledPcm, b) >= rms(plain, b) / 2, `block ${b}: ${rms(leveledPcm, b).toFixed(0)} heard, ${rms(plain, b).toFixed(0)} without the level`);
    // Yet the floor before and after the word costs no decoding.
    assert.ok(
      leveledPcm.subarray(0, 40 * 320).every((x) => x === 0),
      "the floor before the word is not decoded",
    );
    assert.ok(
      leveledPcm.subarray((frames - 20) * 320).every((x) => x === 0),
      "nor the floor long after it",
    );
  });

  test("a device that stops sending after its quiet packets: what the look-back held goes on as silence, and is counted, within 200 ms", () => {
    const codec = new OpusCodec(16_000);
    let samples = 0;
    let now = 0;
    const uplink = new Uplink({ codec, payloadType: 111, audioLevelId: 1, pcm: (s) => (samples += s.length), now: () => now });
    const quiet = encoded(1, false)[0]!;
    for (let i = 0; i < 50; i++) {
      uplink.packet(leveled(i, i * FRAME_SAMPLES, quiet, 127));
      now += 20;
      uplink.tick();
    }
    assert.ok(samples < 50 * 320, "the last packets are held back");
    now += 180;
    uplink.tick();
    assert.equal(samples, 50 * 320);
    assert.equal(uplink.stats.silent, 50);
    codec.close();
  });

  test("a packet lost in a silence is silence, not the concealment of the speech before it", () => {
    const codec = new OpusCodec(16_000);
    const out: Int16Array[] = [];
    const uplink = new Uplink({ codec, payloadType: 111, pcm: (s) => out.push(s), now: () => 0 });
    const word = encoded(10, true);
    for (const [i, p] of word.entries()) uplink.packet(rtp(i, i * FRAME_SAMPLES, p));
    uplink.packet(rtp(10, 10 * FRAME_SAMPLES, Buffer.from([0x78])));
    // 11 is lost.
    uplink.packet(rtp(12, 12 * FRAME_SAMPLES, Buffer.from([0x78])));
    uplink.flush();
    const pcm = concatInt16(out);
    assert.equal(pcm.length, 13 * 320);
    assert.ok(pcm.subarray(10 * 320).every((x) => x === 0));
    codec.close();
  });
});
