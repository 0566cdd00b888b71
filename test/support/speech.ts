import { numbersToDigits } from "../../src/ai/speech/normalise.ts";
import { wavFile as wav } from "../../src/audio/samples.ts";

/**
 * Word error rate: the word-level edit distance from `reference` to `hypothesis`, over the
 * reference's length. Case, punctuation and hyphens are ignored; numbers compare as digits ("ten" = "10").
 */
export function wordErrorRate(reference: string, hypothesis: string): number {
  const words = (t: string) =>
    numbersToDigits(t)
      .toLowerCase()
      .replace(/(\w)-(\w)/g, "$1$2")
      .replace(/[^a-z0-9' ]/g, " ")
      .split(/\s+/)
      .filter(Boolean);
  const ref = words(reference);
  const hyp = words(hypothesis);
  let row = Array.from({ length: hyp.length + 1 }, (_, j) => j);
  for (let i = 1; i <= ref.length; i++) {
    const next = [i];
    for (let j = 1; j <= hyp.length; j++) next[j] = Math.min(row[j]! + 1, next[j - 1]! + 1, row[j - 1]! + (ref[i - 1] === hyp[j - 1] ? 0 : 1));
    row = next;
  }
  return row[hyp.length]! / ref.length;
}

/** Everyday requests to a voice device. */
export const ROUND_TRIP_SENTENCES = [
  "Please turn on the lights in the kitchen.",
  "What is the weather like today?",
  "Set a timer for ten minutes.",
  "Play some music in the living room.",
  "The battery is almost empty.",
  "Call my mother tomorrow morning.",
  "How far is the nearest train station?",
  "Remind me to buy milk after work.",
  "Open the front door.",
  "I would like a cup of coffee.",
];

/** Sentences spoken by espeak-ng (a synthesiser Perch was not tuned on), in two voices. */
export const ESPEAK_VOICES: ReadonlyArray<{ name: string; args: readonly string[] }> = [
  { name: "espeak-ng en-us", args: ["-v", "en-us", "-s", "140"] },
  { name: "espeak-ng en-gb-x-rp", args: ["-v", "en-gb-x-rp", "-s", "150"] },
];

/** `text` spoken by espeak-ng with `args`, as 16 kHz mono samples (-1..1). */
export async function espeak(text: string, args: readonly string[]): Promise<Float32Array> {
  const { execFile } = await import("node:child_process");
  const wav = await new Promise<Buffer>((resolve, reject) =>
    execFile("espeak-ng", [...args, "--stdout", text], { encoding: "buffer", maxBuffer: 1 << 28 }, (error, stdout) =>
      error ? reject(error) : resolve(stdout),
    ),
  );
  // espeak-ng streams its WAV (the header's sizes say "unknown"); it speaks at 22050 Hz.
  const rate = wav.readUInt32LE(24);
  const data = wav.indexOf("data", 12, "latin1") + 8;
  const pcm = new Int16Array(wav.buffer.slice(wav.byteOffset + data, wav.byteOffset + wav.length - ((wav.length - data) % 2)));
  return resample(
    Float32Array.from(pcm, (s) => s / 32768),
    rate,
    16_000,
  );
}

/** Linear-interpolation resampling: enough for test audio. */
export function resample(samples: Float32Array, from: number, to: number): Float32Array {
  if (from === to) return samples;
  const out = new Float32Array(Math.floor((samples.length * to) / from));
  for (let i = 0; i < out.length; i++) {
    const at = (i * from) / to;
    const j = Math.floor(at);
    const f = at - j;
    out[i] = (samples[j] ?? 0) * (1 - f) + (samples[j + 1] ?? samples[j] ?? 0) * f;
  }
  return out;
}

/** A seeded generator of uniform numbers in [0, 1): the same noise on every run. */
export function seededRandom(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

/** `samples` with white noise mixed in at `snrDb` below the speech's power (computed where it is not silent). */
export function withNoise(samples: Float32Array, snrDb: number, seed = 1): Float32Array {
  let power = 0;
  let n = 0;
  for (const x of samples)
    if (Math.abs(x) > 0.01) {
      power += x * x;
      n++;
    }
  const noiseRms = Math.sqrt(power / Math.max(1, n) / 10 ** (snrDb / 10));
  const random = seededRandom(seed);
  // Uniform noise on [-a, a] has an RMS of a / sqrt(3).
  return samples.map((x) => x + (random() * 2 - 1) * noiseRms * Math.sqrt(3));
}

/** Silence of `seconds` at 16 kHz. */
export function silence(seconds: number): Float32Array {
  return new Float32Array(Math.round(seconds * 16_000));
}

/** A 16-bit mono WAV file of 16 kHz samples. */
export function wavFile(samples: Float32Array, rate = 16_000): Buffer {
  return wav(
    Int16Array.from(samples, (x) => Math.max(-32768, Math.min(32767, Math.round(x * 32767)))),
    rate,
  );
}
