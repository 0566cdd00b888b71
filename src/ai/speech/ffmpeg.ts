import { createRequire } from "node:module";
import { type Child, findExecutable, startChild } from "./child.ts";
import type { SpeechFormat } from "./types.ts";

/** Every speech format is produced at this rate (OpenAI's, and what `pcm` promises). */
export const OUTPUT_SAMPLE_RATE = 24_000;

let resolved: string | undefined;

/**
 * The encoder of our own speech: the static build shipped on npm (it starts in ~10 ms where
 * Debian's dynamically linked ffmpeg takes ~70 ms, which the first byte of every speech answer
 * would pay), else a system ffmpeg. It only ever reads raw PCM that flite made here; uploads are
 * never given to it, only to a system ffmpeg (see decode.ts and docs/decisions.md).
 */
export function ffmpegPath(): string {
  if (resolved) return resolved;
  try {
    resolved = (createRequire(import.meta.url)("@ffmpeg-installer/ffmpeg") as { path: string }).path;
  } catch {
    resolved = findExecutable("ffmpeg");
  }
  if (!resolved) throw new Error("no ffmpeg: neither @ffmpeg-installer/ffmpeg nor one on PATH");
  return resolved;
}

const CODECS: Readonly<Record<SpeechFormat, readonly string[]>> = {
  mp3: ["-c:a", "libmp3lame", "-b:a", "64k", "-f", "mp3"],
  // Short Ogg pages so that audio leaves as it is encoded rather than once a second.
  // libopus at its default complexity (10) takes five times as long as at 5, for no audible gain at 32k.
  opus: ["-c:a", "libopus", "-b:a", "32k", "-compression_level", "5", "-f", "ogg", "-page_duration", "100000"],
  aac: ["-c:a", "aac", "-b:a", "64k", "-f", "adts"],
  flac: ["-c:a", "flac", "-f", "flac"],
  wav: ["-c:a", "pcm_s16le", "-f", "wav"],
  pcm: ["-c:a", "pcm_s16le", "-f", "s16le"],
};

/**
 * Bytes a second of each format's audio takes at most: the constant bitrates above, and 16-bit
 * samples at OUTPUT_SAMPLE_RATE for the uncompressed ones (FLAC is never larger). Turns a read-ahead
 * in seconds of audio into bytes.
 */
export const MAX_BYTES_PER_SECOND: Readonly<Record<SpeechFormat, number>> = {
  mp3: 64_000 / 8,
  opus: 32_000 / 8,
  aac: 64_000 / 8,
  flac: 2 * OUTPUT_SAMPLE_RATE,
  wav: 2 * OUTPUT_SAMPLE_RATE,
  pcm: 2 * OUTPUT_SAMPLE_RATE,
};

const QUIET = ["-hide_banner", "-nostats", "-loglevel", "error"];

/**
 * An encoder reading raw 16-bit mono PCM at `inputRate` on stdin and writing `format` at
 * OUTPUT_SAMPLE_RATE on stdout, flushing every packet so that bytes leave as soon as they exist.
 */
export function startEncoder(format: SpeechFormat, inputRate: number, signal?: AbortSignal): Child {
  const args = [
    ...QUIET,
    ...["-probesize", "32", "-analyzeduration", "0", "-f", "s16le", "-ar", String(inputRate), "-ac", "1", "-i", "pipe:0"],
    ...["-map_metadata", "-1", "-fflags", "+bitexact", "-flush_packets", "1"],
    ...["-ar", String(OUTPUT_SAMPLE_RATE), "-ac", "1", ...CODECS[format], "pipe:1"],
  ];
  return startChild(ffmpegPath(), args, signal);
}
