/**
 * Uploaded audio (untrusted) to 16 kHz mono PCM, at a bounded cost:
 * - a maximum decoded duration (AudioTooLongError past it), checked while decoding, so that a
 *   decompression bomb stops at the limit;
 * - decoded audio is never written to disk: it comes back in memory, at most `maxSeconds` of it;
 * - a CPU time limit per decode.
 * WAV, MP3, FLAC, Ogg Vorbis and Ogg Opus are decoded by WebAssembly decoders in a worker thread
 * of their own; MP4/M4A, WebM/Matroska, MPEG program streams and ADTS AAC by the system's ffmpeg
 * with its demuxer forced (no probing, no protocol but the one input file), under a CPU rlimit.
 */
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Worker } from "node:worker_threads";
import { findExecutable, startChild } from "./child.ts";
import type { DecodeJob, DecodeResult, WasmFormat } from "./decode-worker.ts";
import { AudioDecodeError, AudioTooLongError, abortReason } from "./errors.ts";

/** What every decode produces. */
export const DECODED_SAMPLE_RATE = 16_000;
/** The default maximum decoded duration: 10 minutes. */
export const DEFAULT_MAX_AUDIO_SECONDS = 600;
/** CPU seconds one decode may use (a 10-minute file takes well under one). */
export const DEFAULT_DECODE_CPU_SECONDS = 20;

export interface DecodeOptions {
  /** Longer audio is refused with AudioTooLongError. Default DEFAULT_MAX_AUDIO_SECONDS. */
  maxSeconds?: number;
  /** Default DEFAULT_DECODE_CPU_SECONDS. */
  cpuSeconds?: number;
  signal?: AbortSignal;
}

export interface DecodedAudio {
  /** Mono, -1..1, at DECODED_SAMPLE_RATE. */
  samples: Float32Array;
  sampleRate: typeof DECODED_SAMPLE_RATE;
  /** Seconds. */
  duration: number;
  /** The container found in the bytes. */
  container: Container;
  /** Which decoder did the work. */
  decoder: "wasm" | "ffmpeg";
}

export type Container = WasmFormat | "mp4" | "webm" | "mpeg-ps" | "adts" | "ogg";

/** The ffmpeg demuxer forced for each container ffmpeg decodes. */
const FFMPEG_DEMUXERS: Record<Exclude<Container, WasmFormat>, string> = { mp4: "mov", webm: "matroska", "mpeg-ps": "mpeg", adts: "aac", ogg: "ogg" };

/** The container the bytes hold, from their first bytes; undefined when none that is accepted. */
export function detectContainer(b: Uint8Array): Container | undefined {
  const ascii = (at: number, s: string) => b.length >= at + s.length && Buffer.from(b.subarray(at, at + s.length)).toString("latin1") === s;
  if (ascii(0, "fLaC")) return "flac";
  if (ascii(0, "RIFF") && ascii(8, "WAVE")) return "wav";
  if (ascii(0, "OggS")) {
    // The first page holds the first stream's identification header.
    const head = Buffer.from(b.subarray(0, 128)).toString("latin1");
    if (head.includes("OpusHead")) return "opus";
    if (head.includes("\x01vorbis")) return "vorbis";
    return "ogg";
  }
  if (ascii(4, "ftyp")) return "mp4";
  if (b[0] === 0x1a && b[1] === 0x45 && b[2] === 0xdf && b[3] === 0xa3) return "webm";
  if (b[0] === 0 && b[1] === 0 && b[2] === 1 && b[3] === 0xba) return "mpeg-ps";
  if (ascii(0, "ID3")) return "mp3";
  if (b[0] === 0xff && ((b[1] ?? 0) & 0xe0) === 0xe0) return ((b[1] ?? 0) & 0x06) === 0 ? "adts" : "mp3";
  return undefined;
}

/**
 * Decodes an uploaded file to 16 kHz mono. Throws AudioTooLongError beyond `maxSeconds`,
 * AudioDecodeError for anything that is not decodable audio (the message names the problem,
 * never a path), and the signal's reason when aborted.
 */
export async function decodeAudio(bytes: Uint8Array, o: DecodeOptions = {}): Promise<DecodedAudio> {
  const maxSeconds = o.maxSeconds ?? DEFAULT_MAX_AUDIO_SECONDS;
  const cpuSeconds = o.cpuSeconds ?? DEFAULT_DECODE_CPU_SECONDS;
  if (!(maxSeconds > 0)) throw new RangeError("maxSeconds must be positive");
  if (o.signal?.aborted) throw abortReason(o.signal);
  const container = detectContainer(bytes);
  if (!container) throw new AudioDecodeError("the file is not in a supported audio container (flac, mp3, mp4, m4a, mpeg, ogg, opus, wav, webm)");
  const samples =
    container === "wav" || container === "mp3" || container === "flac" || container === "vorbis" || container === "opus"
      ? await inWorker(bytes, container, maxSeconds, cpuSeconds, o.signal)
      : await withFfmpeg(bytes, container, maxSeconds, cpuSeconds, o.signal);
  if (samples.length === 0) throw new AudioDecodeError("the file holds no audio");
  return {
    samples,
    sampleRate: DECODED_SAMPLE_RATE,
    duration: samples.length / DECODED_SAMPLE_RATE,
    container,
    decoder: container in FFMPEG_DEMUXERS ? "ffmpeg" : "wasm",
  };
}

/** 16-bit little-endian PCM of `samples` (what PocketSphinx and ffmpeg's s16le read). */
export function toInt16(samples: Float32Array): Int16Array {
  const out = new Int16Array(samples.length);
  for (let i = 0; i < samples.length; i++) out[i] = Math.max(-32768, Math.min(32767, Math.round(samples[i]! * 32768)));
  return out;
}

const WORKER_URL = new URL("./decode-worker.ts", import.meta.url);

function inWorker(bytes: Uint8Array, format: WasmFormat, maxSeconds: number, cpuSeconds: number, signal: AbortSignal | undefined): Promise<Float32Array> {
  const job: DecodeJob = { bytes, format, maxSeconds, cpuSeconds, outputRate: DECODED_SAMPLE_RATE };
  return new Promise((resolve, reject) => {
    // The heap is bounded; the decoders' WebAssembly memory is bounded by what one fed kilobyte decodes to.
    const worker = new Worker(WORKER_URL, { workerData: job, resourceLimits: { maxOldGenerationSizeMb: 512 } });
    let settled = false;
    const settle = (f: () => void) => {
      if (settled) return;
      settled = true;
      clearTimeout(deadline);
      signal?.removeEventListener("abort", onAbort);
      void worker.terminate();
      f();
    };
    // The worker checks its own CPU time between blocks; this bounds a single block that never returns.
    const deadline = setTimeout(() => settle(() => reject(overCpu(cpuSeconds))), wallLimitMs(cpuSeconds));
    const onAbort = () => settle(() => reject(abortReason(signal!)));
    signal?.addEventListener("abort", onAbort, { once: true });
    worker.once("message", (r: DecodeResult) =>
      settle(() => {
        if (r.ok) resolve(r.samples);
        else if (r.kind === "too_long") reject(new AudioTooLongError(maxSeconds));
        else if (r.kind === "cpu") reject(overCpu(cpuSeconds));
        else reject(new AudioDecodeError(`the ${format} data is invalid: ${r.message}`));
      }),
    );
    worker.once("error", (err) =>
      settle(() => reject(new AudioDecodeError(`the ${format} data could not be decoded${/memory/i.test(err.message) ? ": out of memory" : ""}`))),
    );
    worker.once("exit", () => settle(() => reject(new AudioDecodeError(`the ${format} decoder stopped`))));
  });
}

function overCpu(cpuSeconds: number): AudioDecodeError {
  return new AudioDecodeError(`decoding took more than the limit of ${cpuSeconds} s of CPU time`);
}

/** Wall-clock backstop: the machine may be loaded, so well above the CPU limit. */
function wallLimitMs(cpuSeconds: number): number {
  return Math.max(10_000, cpuSeconds * 3000);
}

let systemFfmpeg: string | null | undefined;

/**
 * Only a system ffmpeg (the distribution's, patched) ever parses uploads; the 2018 static build
 * from npm is used for encoding our own PCM only (see docs/decisions.md).
 */
export function uploadFfmpeg(): string | undefined {
  if (systemFfmpeg === undefined) systemFfmpeg = findExecutable("ffmpeg") ?? null;
  return systemFfmpeg ?? undefined;
}

let prlimitPath: string | null | undefined;

async function withFfmpeg(
  bytes: Uint8Array,
  container: Exclude<Container, WasmFormat>,
  maxSeconds: number,
  cpuSeconds: number,
  signal: AbortSignal | undefined,
): Promise<Float32Array> {
  const ffmpeg = uploadFfmpeg();
  if (!ffmpeg) throw new AudioDecodeError(`${container} audio needs ffmpeg, which this server does not have; send flac, mp3, ogg, opus or wav`);
  if (prlimitPath === undefined) prlimitPath = findExecutable("prlimit") ?? null;
  // The upload (at most 25 MB) goes to a file: MP4 needs to seek. The decoded audio never does.
  const dir = await mkdtemp(join(tmpdir(), "perch-decode-"));
  try {
    const input = join(dir, "input");
    await writeFile(input, bytes);
    const maxSamples = Math.ceil(maxSeconds * DECODED_SAMPLE_RATE);
    const args = [
      ...["-hide_banner", "-nostdin", "-nostats", "-loglevel", "error", "-threads", "1"],
      ...["-protocol_whitelist", "file", "-f", FFMPEG_DEMUXERS[container], "-i", input],
      ...["-map", "0:a:0", "-vn", "-sn", "-dn", "-ac", "1", "-ar", String(DECODED_SAMPLE_RATE)],
      // One sample past the limit tells that there was more.
      ...["-t", String((maxSamples + 1) / DECODED_SAMPLE_RATE), "-f", "f32le", "pipe:1"],
    ];
    const command = prlimitPath ? prlimitPath : ffmpeg;
    // RLIMIT_CPU counts whole seconds.
    const argv = prlimitPath ? [`--cpu=${Math.max(1, Math.ceil(cpuSeconds))}`, "--", ffmpeg, ...args] : args;
    const child = startChild(command, argv, signal);
    child.proc.stdin.end();
    const deadline = setTimeout(() => child.kill(), wallLimitMs(cpuSeconds));
    const chunks: Buffer[] = [];
    let size = 0;
    let tooLong = false;
    const maxBytes = 4 * maxSamples;
    child.proc.stdout.on("data", (chunk: Buffer) => {
      if (tooLong) return;
      size += chunk.length;
      if (size > maxBytes) {
        tooLong = true;
        child.kill();
        return;
      }
      chunks.push(chunk);
    });
    let exit: Awaited<typeof child.exited>;
    try {
      exit = await child.exited;
    } catch {
      throw new AudioDecodeError(`${container} audio needs ffmpeg, which could not be started`);
    } finally {
      clearTimeout(deadline);
    }
    if (signal?.aborted) throw abortReason(signal);
    if (tooLong) throw new AudioTooLongError(maxSeconds);
    if (exit.signal === "SIGXCPU" || exit.signal === "SIGKILL") throw overCpu(cpuSeconds);
    if (exit.code !== 0) throw new AudioDecodeError(`the ${container} data is invalid${ffmpegReason(exit.stderr, input)}`);
    const all = Buffer.concat(chunks);
    const samples = new Float32Array(Math.floor(all.length / 4));
    for (let i = 0; i < samples.length; i++) samples[i] = all.readFloatLE(i * 4);
    return samples;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** ffmpeg's last line, without the input's path (ffmpeg prefixes messages with it). */
function ffmpegReason(stderr: string, input: string): string {
  const line =
    stderr
      .trim()
      .split("\n")
      .at(-1)
      ?.replaceAll(input, "input")
      .replace(/\/[^\s:'"]+/g, "…") ?? "";
  return line ? `: ${line.slice(0, 200)}` : "";
}
