/**
 * One decode in a worker thread of its own: the WebAssembly decoders from npm (memory-safe, and
 * killable with the thread), fed the upload a kilobyte at a time so that a decompression bomb is
 * stopped at the duration limit before it has decoded much more than that, and never takes the
 * main thread's event loop. Mixed to mono and resampled to 16 kHz as the blocks come.
 */
import { parentPort, workerData } from "node:worker_threads";
import type { SpeexModule } from "@echogarden/speex-resampler-wasm";
import { loadResampler, Resampler } from "../../audio/resampler.ts";

export type WasmFormat = "wav" | "mp3" | "flac" | "vorbis" | "opus";

export interface DecodeJob {
  bytes: Uint8Array;
  format: WasmFormat;
  maxSeconds: number;
  cpuSeconds: number;
  outputRate: number;
}

export type DecodeResult =
  | { ok: true; samples: Float32Array; sourceRate: number; channels: number }
  | { ok: false; kind: "too_long" | "invalid" | "cpu"; message: string };

interface Block {
  channelData: Float32Array[];
  samplesDecoded: number;
  sampleRate: number;
  errors?: unknown[];
}

interface StreamDecoder {
  ready: Promise<void>;
  decode(bytes: Uint8Array): Block | Promise<Block>;
  flush?: () => Promise<Block>;
  free(): void;
}

/**
 * Bytes handed to a decoder at once. A FLAC frame of silence is ~15 bytes for 65,535 samples, so
 * a kilobyte decodes to at most ~4.5 M samples a channel (18 MB) before the duration is checked.
 */
const FEED_BYTES = 1024;

class TooLong extends Error {}
class OverCpu extends Error {}
class Invalid extends Error {}

async function decoderFor(format: Exclude<WasmFormat, "wav">): Promise<StreamDecoder> {
  switch (format) {
    case "mp3":
      return new (await import("mpg123-decoder")).MPEGDecoder();
    case "flac":
      return new (await import("@wasm-audio-decoders/flac")).FLACDecoder();
    case "vorbis":
      return new (await import("@wasm-audio-decoders/ogg-vorbis")).OggVorbisDecoder();
    case "opus":
      return new (await import("ogg-opus-decoder")).OggOpusDecoder() as unknown as StreamDecoder;
  }
}

/** Collects 16 kHz mono output, stopping at the duration limit and the CPU limit. */
class Sink {
  private readonly parts: Float32Array[] = [];
  private length = 0;
  private resampler: Resampler | undefined;
  private started = false;
  private sourceSamples = 0;
  sourceRate = 0;
  channels = 0;
  private readonly job: DecodeJob;
  private readonly speex: SpeexModule;
  /** The thread's CPU time when the decode began (loading the decoders counts). */
  private readonly cpuStart: NodeJS.CpuUsage;

  constructor(job: DecodeJob, speex: SpeexModule, cpuStart: NodeJS.CpuUsage) {
    this.job = job;
    this.speex = speex;
    this.cpuStart = cpuStart;
  }

  checkCpu(): void {
    const used = process.threadCpuUsage(this.cpuStart);
    if ((used.user + used.system) / 1e6 > this.job.cpuSeconds) throw new OverCpu();
  }

  add(block: Block): void {
    if (block.samplesDecoded === 0 || block.channelData.length === 0) return;
    if (!(block.sampleRate >= 1000 && block.sampleRate <= 384_000)) throw new Invalid(`a sample rate of ${block.sampleRate} Hz`);
    if (!this.started) {
      this.started = true;
      this.sourceRate = block.sampleRate;
      this.channels = block.channelData.length;
      if (block.sampleRate !== this.job.outputRate) this.resampler = new Resampler(this.speex, block.sampleRate, this.job.outputRate);
    } else if (block.sampleRate !== this.sourceRate) throw new Invalid("the sample rate changes within the file");
    this.sourceSamples += block.samplesDecoded;
    if (this.sourceSamples / this.sourceRate > this.job.maxSeconds) throw new TooLong();
    const mono = mixDown(block.channelData, block.samplesDecoded);
    // Kept as a copy when not resampled: the decoder reuses its blocks.
    this.keep(this.resampler ? this.resampler.processFloat(mono) : mono.slice());
  }

  finish(): Float32Array {
    if (this.resampler) {
      this.keep(this.resampler.flushFloat());
      this.resampler.close();
    }
    const out = new Float32Array(this.length);
    let at = 0;
    for (const p of this.parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }

  private keep(samples: Float32Array): void {
    if (samples.length === 0) return;
    this.parts.push(samples);
    this.length += samples.length;
  }
}

function mixDown(channels: Float32Array[], n: number): Float32Array {
  if (channels.length === 1) return channels[0]!.subarray(0, n);
  const out = new Float32Array(n);
  for (const ch of channels) for (let i = 0; i < n; i++) out[i]! += ch[i]!;
  const scale = 1 / channels.length;
  for (let i = 0; i < n; i++) out[i]! *= scale;
  return out;
}

async function decodeCompressed(job: DecodeJob, speex: Promise<SpeexModule>, cpuStart: NodeJS.CpuUsage): Promise<Sink> {
  const decoder = await decoderFor(job.format as Exclude<WasmFormat, "wav">);
  const [, module] = await Promise.all([decoder.ready, speex]);
  const sink = new Sink(job, module, cpuStart);
  try {
    for (let at = 0; at < job.bytes.length; at += FEED_BYTES) {
      sink.checkCpu();
      sink.add(await decoder.decode(job.bytes.subarray(at, at + FEED_BYTES)));
    }
    if (decoder.flush) sink.add(await decoder.flush());
  } finally {
    decoder.free();
  }
  return sink;
}

/** RIFF/WAVE with integer PCM (8–32 bits) or IEEE float (32/64 bits), mono or more channels. */
function decodeWav(job: DecodeJob, sink: Sink): void {
  const b = job.bytes;
  const view = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const tag = (at: number) => String.fromCharCode(b[at]!, b[at + 1]!, b[at + 2]!, b[at + 3]!);
  if (b.length < 12 || tag(0) !== "RIFF" || tag(8) !== "WAVE") throw new Invalid("no RIFF/WAVE header");
  let fmt: { format: number; channels: number; rate: number; bits: number } | undefined;
  let at = 12;
  while (at + 8 <= b.length) {
    const id = tag(at);
    const size = view.getUint32(at + 4, true);
    const body = at + 8;
    if (id === "fmt ") {
      if (size < 16 || body + 16 > b.length) throw new Invalid("a short fmt chunk");
      let format = view.getUint16(body, true);
      // WAVE_FORMAT_EXTENSIBLE: the real format is the sub-format GUID's first two bytes.
      if (format === 0xfffe && size >= 26 && body + 26 <= b.length) format = view.getUint16(body + 24, true);
      fmt = { format, channels: view.getUint16(body + 2, true), rate: view.getUint32(body + 4, true), bits: view.getUint16(body + 14, true) };
    } else if (id === "data") {
      if (!fmt) throw new Invalid("data before the fmt chunk");
      const { format, channels, rate, bits } = fmt;
      const width = bits / 8;
      const pcm = format === 1 && (bits === 8 || bits === 16 || bits === 24 || bits === 32);
      const float = format === 3 && (bits === 32 || bits === 64);
      if (!pcm && !float) throw new Invalid(`WAV sample format ${format} at ${bits} bits (only PCM and IEEE float are read)`);
      if (channels < 1 || channels > 32) throw new Invalid(`${channels} channels`);
      // A streamed WAV may declare a size of 0 or 0xFFFFFFFF: the data runs to the end of the file.
      const length = size === 0 || body + size > b.length ? b.length - body : size;
      const frames = Math.floor(length / (width * channels));
      if (!(rate >= 1000 && rate <= 384_000)) throw new Invalid(`a sample rate of ${rate} Hz`);
      if (frames / rate > job.maxSeconds) throw new TooLong();
      const perBlock = 16_384;
      for (let start = 0; start < frames; start += perBlock) {
        sink.checkCpu();
        const n = Math.min(perBlock, frames - start);
        const channelData = Array.from({ length: channels }, () => new Float32Array(n));
        for (let i = 0; i < n; i++) {
          for (let c = 0; c < channels; c++) {
            const p = body + ((start + i) * channels + c) * width;
            let v: number;
            if (float) v = bits === 32 ? view.getFloat32(p, true) : view.getFloat64(p, true);
            else if (bits === 8) v = (b[p]! - 128) / 128;
            else if (bits === 16) v = view.getInt16(p, true) / 32768;
            else if (bits === 24) v = ((b[p]! | (b[p + 1]! << 8) | (b[p + 2]! << 16)) << 8) / 2147483648;
            else v = view.getInt32(p, true) / 2147483648;
            channelData[c]![i] = Number.isFinite(v) ? Math.max(-1, Math.min(1, v)) : 0;
          }
        }
        sink.add({ channelData, samplesDecoded: n, sampleRate: rate });
      }
      return;
    }
    at = body + size + (size & 1);
  }
  throw new Invalid(fmt ? "no data chunk" : "no fmt chunk");
}

async function main(job: DecodeJob): Promise<DecodeResult> {
  const cpuStart = process.threadCpuUsage();
  // The resampler's module (this thread's own) loads beside the decoder's.
  const speex = loadResampler();
  try {
    let sink: Sink;
    if (job.format === "wav") {
      sink = new Sink(job, await speex, cpuStart);
      decodeWav(job, sink);
    } else sink = await decodeCompressed(job, speex, cpuStart);
    const samples = sink.finish();
    return { ok: true, samples, sourceRate: sink.sourceRate, channels: sink.channels };
  } catch (err) {
    if (err instanceof TooLong) return { ok: false, kind: "too_long", message: "too long" };
    if (err instanceof OverCpu) return { ok: false, kind: "cpu", message: "over the CPU time limit" };
    if (err instanceof Invalid) return { ok: false, kind: "invalid", message: err.message };
    // The decoders' own failures name no path (they only ever see bytes); keep the first line.
    return {
      ok: false,
      kind: "invalid",
      message: String((err as Error)?.message ?? err)
        .split("\n")[0]!
        .slice(0, 200),
    };
  }
}

if (parentPort) {
  const port = parentPort;
  main(workerData as DecodeJob).then(
    (result) => port.postMessage(result, result.ok ? [result.samples.buffer as ArrayBuffer] : []),
    (err: unknown) => port.postMessage({ ok: false, kind: "invalid", message: String((err as Error)?.message ?? err).slice(0, 200) } satisfies DecodeResult),
  );
}
