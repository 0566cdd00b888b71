/**
 * `npm run -s bench -- uplink`: what one conversation's uplink costs the thread that runs it, per
 * second of audio, before and after issue 41 side by side in one run (in process, no WebRTC):
 * "before" decodes every packet at 48 kHz and resamples it to 16 kHz (the path before issue 41),
 * "after" is the Uplink as it is (decoded straight to 16 kHz; silence that needs no decoding is
 * not decoded). Inputs: speech (a tone, as loud as a voice), silence as our SDK's microphone
 * sends it (encoded digital silence, with and without the RFC 6464 audio level), and DTX.
 * Figures: CPU µs per second of audio and % of a core per conversation.
 * BENCH_UPLINK_SECONDS (default 60): seconds of audio per input and path.
 */
import { loadavg } from "node:os";
import { loadResampler, Resampler } from "../src/audio/resampler.ts";
import { JitterBuffer, opusPacketSamples } from "../src/voice/jitter.ts";
import { FRAME_SAMPLES, OpusCodec } from "../src/voice/opus.ts";
import { parseRtp } from "../src/voice/rtp.ts";
import { Uplink } from "../src/voice/uplink.ts";
import { round } from "./support.ts";

const SECONDS = Number(process.env.BENCH_UPLINK_SECONDS ?? 60);

function rtp(seq: number, ts: number, payload: Buffer, level?: number): Buffer {
  const ext = level === undefined ? Buffer.alloc(0) : Buffer.from([0xbe, 0xde, 0, 1, 0x10, level, 0, 0]);
  const h = Buffer.alloc(12);
  h[0] = level === undefined ? 0x80 : 0x90;
  h[1] = 111;
  h.writeUInt16BE(seq & 0xffff, 2);
  h.writeUInt32BE(ts >>> 0, 4);
  h.writeUInt32BE(0x1234, 8);
  return Buffer.concat([h, ext, payload]);
}

/** One second of a device's packets (50 of 20 ms; DTX: a table of contents every 400 ms). */
function second(kind: "speech" | "silence" | "silence+level" | "dtx"): Array<{ payload: Buffer; samples: number; level?: number }> {
  if (kind === "dtx") return Array.from({ length: 3 }, () => ({ payload: Buffer.from([0x78]), samples: 400 * 48 }));
  const encoder = new OpusCodec();
  const out = Array.from({ length: 50 }, (_, f) => {
    const pcm = new Int16Array(FRAME_SAMPLES);
    if (kind === "speech") for (let i = 0; i < pcm.length; i++) pcm[i] = Math.round(Math.sin((2 * Math.PI * 220 * (f * FRAME_SAMPLES + i)) / 48_000) * 8_000);
    const payload = encoder.encode(pcm);
    return kind === "silence+level" ? { payload, samples: FRAME_SAMPLES, level: 127 } : { payload, samples: FRAME_SAMPLES };
  });
  encoder.close();
  return out;
}

/** The uplink before issue 41: every packet decoded at 48 kHz, then resampled to 16 kHz. */
function before(resampler: Awaited<ReturnType<typeof loadResampler>>) {
  const codec = new OpusCodec(48_000);
  const down = new Resampler(resampler, 48_000, 16_000);
  let out = 0;
  const jitter = new JitterBuffer({
    depthMs: 60,
    frameSamples: FRAME_SAMPLES,
    clockRate: 48_000,
    maxGapMs: 2_000,
    now: () => 0,
    output: (o) => {
      const pcm = o.kind === "packet" ? (codec.decode(o.payload) ?? codec.conceal(opusPacketSamples(o.payload) ?? FRAME_SAMPLES)) : new Int16Array(o.samples);
      out += down.process(pcm).length;
    },
  });
  return {
    packet: (b: Buffer) => jitter.push(parseRtp(b)!),
    close: () => {
      codec.close();
      down.close();
      return out;
    },
  };
}

/** The audio's own time (ms): the uplink drops what runs ahead of real time, and the bench feeds it as fast as it can. */
let audioNow = 0;

function after(levelId: number | undefined) {
  const codec = new OpusCodec(16_000);
  let out = 0;
  const uplink = new Uplink({ codec, payloadType: 111, audioLevelId: levelId, pcm: (s) => (out += s.length), now: () => audioNow });
  return {
    packet: (b: Buffer) => uplink.packet(b),
    close: () => {
      codec.close();
      return out;
    },
  };
}

export async function uplinkBench(): Promise<unknown> {
  const resampler = await loadResampler();
  const figures: Record<string, unknown> = {};
  for (const kind of ["speech", "silence", "silence+level", "dtx"] as const) {
    const packets = second(kind);
    const row: Record<string, unknown> = {};
    for (const path of ["before", "after"] as const) {
      // The "before" path never read the audio level; the "after" path reads it when negotiated.
      const run = () => (path === "before" ? before(resampler) : after(kind === "silence+level" ? 1 : undefined));
      // Warm-up, then the measured run: every second of audio through one uplink.
      for (const [rounds, measured] of [
        [2, false],
        [SECONDS, true],
      ] as const) {
        const u = run();
        let seq = 0;
        let ts = 0;
        audioNow = 0;
        const cpu = process.cpuUsage();
        for (let s = 0; s < rounds; s++)
          for (const p of packets) {
            u.packet(rtp(seq++, ts, p.payload, p.level));
            ts += p.samples;
            audioNow = ts / 48;
          }
        const used = process.cpuUsage(cpu);
        const samples = u.close();
        if (!measured) continue;
        const usPerSecond = (used.user + used.system) / rounds;
        row[path] = { cpu_us_per_audio_second: round(usPerSecond), core_percent_per_conversation: round(usPerSecond / 10_000), samples_16k: samples };
      }
    }
    const b = (row.before as { cpu_us_per_audio_second: number }).cpu_us_per_audio_second;
    const a = (row.after as { cpu_us_per_audio_second: number }).cpu_us_per_audio_second;
    row.after_over_before = round(a / b);
    figures[kind] = row;
  }
  return { suite: "uplink", seconds_per_input: SECONDS, load_average: loadavg().map(round), figures };
}
