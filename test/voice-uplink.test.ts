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
    const codec = new OpusCodec();
    const resampler = new Resampler(await loadResampler(), 48_000, 16_000);
    const out: Int16Array[] = [];
    const uplink = new Uplink({ codec, resampler, payloadType: 111, pcm: (s) => out.push(s) });
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
    // Every 20 ms is there (the lost one concealed), less the resampler's delay.
    assert.ok(pcm.length > frames * 320 - 100 && pcm.length <= frames * 320, `${pcm.length}`);
    let energy = 0;
    for (const s of pcm.subarray(2000)) energy += s * s;
    assert.ok(Math.sqrt(energy / (pcm.length - 2000)) > 3000, "the tone is heard");
    codec.close();
    resampler.close();
  });

  test("a packet libopus refuses is concealed for as long as it says it lasts: the timeline holds, and refused packets claim no more audio than good ones", async () => {
    const encoder = new OpusCodec();
    const good = encoder.encode(sine(FRAME_SAMPLES, 48_000, 300));
    encoder.close();
    const codec = new OpusCodec();
    const resampler = new Resampler(await loadResampler(), 48_000, 16_000);
    let samples = 0;
    let now = 0;
    const uplink = new Uplink({ codec, resampler, payloadType: 111, pcm: (s) => (samples += s.length), now: () => now });
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
    // 20 ms + 100 × 5 ms + 20 ms at 16 kHz, less the resampler's delay.
    const expected = (2 * FRAME_SAMPLES + 100 * 240) / 3;
    assert.ok(samples > expected - 100 && samples <= expected, `${samples} samples, ${expected} expected`);
    codec.close();
    resampler.close();
  });
});
