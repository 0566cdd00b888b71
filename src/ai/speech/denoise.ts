/**
 * Noise suppression before recognition (issue 50): two ways, compared on the hearing benchmark.
 *
 * - `wiener`: a classic short-time spectral Wiener filter. The noise's spectrum is the mean power of
 *   the frames the voice activity detector calls non-speech (or, with too few of them, of the
 *   quietest frames); each bin's gain follows the decision-directed a priori SNR (Ephraim and Malah),
 *   which keeps the "musical noise" of plain spectral subtraction low, and never falls below a floor.
 * - `rnnoise`: RNNoise (Xiph, BSD-3, its weights inside `@echogarden/rnnoise-wasm`), at 48 kHz (the
 *   Speex resampler up and down), 480-sample frames at 16-bit scale, with some of the dry signal
 *   mixed back (it tends to over-suppress).
 *
 * Both take 16 kHz mono audio (-1..1) and give a new array of the same length, aligned with it.
 */
import createRNNoise, { type RNNoiseModule } from "@echogarden/rnnoise-wasm";
import FFT from "fft.js";
import { loadResampler, Resampler } from "../../audio/resampler.ts";

export interface WienerOptions {
  method: "wiener";
  /** The lowest gain of a bin (dB): what is left of the noise at most suppressed. */
  floorDb: number;
  /** The noise's estimate is multiplied by this (power): above 1, more is taken. */
  overSubtraction: number;
  /**
   * One gain per bin for the whole audio, from the long-term SNR (a linear filter shaped by the
   * noise: no gain that moves from frame to frame, so no musical noise); default false.
   */
  fixed?: boolean;
}

export interface RnnoiseOptions {
  method: "rnnoise";
  /** The dry (original) signal mixed back at this level (dB); undefined: none. */
  dryDb: number | undefined;
}

export interface GateOptions {
  method: "gate";
  /** The audio the detector calls non-speech is brought down by this much (dB); speech is left as it is. */
  depthDb: number;
}

export type DenoiseOptions = WienerOptions | RnnoiseOptions | GateOptions;

const RATE = 16_000;

/** 32 ms frames, half overlapping; the square root of a periodic Hann window on both sides sums to one. */
const N = 512;
const HOP = N / 2;
const WINDOW = Float32Array.from({ length: N }, (_, i) => Math.sqrt(0.5 - 0.5 * Math.cos((2 * Math.PI * i) / N)));
const BINS = N / 2 + 1;
/** The decision-directed estimate's weight on the previous frame's clean speech. */
const DD_ALPHA = 0.98;
/** Fewer non-speech frames than this (≈ 0.3 s): the noise is taken from the quietest frames instead. */
const MIN_NOISE_FRAMES = 18;
/** The quietest share of the frames taken as noise when the detector gives too few. */
const QUIETEST = 0.15;
/** A frame's power below this (per bin, -1..1 scale) counts as none: digital silence stays silence. */
const TINY = 1e-12;

/**
 * `audio` through the Wiener filter. `isNoise(sample)` says whether the detector called the audio
 * around a sample non-speech (the noise's spectrum is estimated there); without it, or with too
 * little of it, the quietest frames are the noise.
 */
export function wiener(audio: Float32Array, o: WienerOptions, isNoise?: (sample: number) => boolean): Float32Array {
  const fft = new FFT(N);
  // HOP samples of zeros before: every sample of the audio is covered by two frames.
  const frames = Math.ceil((audio.length + HOP) / HOP);
  const padded = new Float32Array(frames * HOP + N);
  padded.set(audio, HOP);
  const spectra: Float64Array[] = [];
  const power = new Float64Array(frames);
  const input = new Float64Array(N);
  const spectrum = fft.createComplexArray() as number[];
  for (let t = 0; t < frames; t++) {
    for (let i = 0; i < N; i++) input[i] = padded[t * HOP + i]! * WINDOW[i]!;
    fft.realTransform(spectrum, input);
    const s = new Float64Array(2 * BINS);
    let p = 0;
    for (let k = 0; k < 2 * BINS; k++) {
      s[k] = spectrum[k]!;
      p += s[k]! * s[k]!;
    }
    spectra.push(s);
    power[t] = p;
  }
  const { noise, frames: noiseFrames } = noiseSpectrum(spectra, power, audio.length, isNoise);
  for (let k = 0; k < BINS; k++) noise[k] = Math.max(TINY, noise[k]! * o.overSubtraction);
  const floor = 10 ** (o.floorDb / 20);
  const fixed = o.fixed
    ? fixedGains(
        spectra.filter((_, t) => !noiseFrames.has(t)),
        noise,
        floor,
      )
    : undefined;
  const out = new Float32Array(padded.length);
  const previous = new Float64Array(BINS); // |clean|² of the previous frame
  const full = fft.createComplexArray() as number[];
  const time = fft.createComplexArray() as number[];
  for (let t = 0; t < frames; t++) {
    const s = spectra[t]!;
    for (let k = 0; k < BINS; k++) {
      const re = s[2 * k]!;
      const im = s[2 * k + 1]!;
      const py = re * re + im * im;
      const posterior = py / noise[k]!;
      const prior = t === 0 ? Math.max(posterior - 1, 0) : DD_ALPHA * (previous[k]! / noise[k]!) + (1 - DD_ALPHA) * Math.max(posterior - 1, 0);
      const gain = fixed ? fixed[k]! : Math.max(floor, prior / (1 + prior));
      previous[k] = gain * gain * py;
      full[2 * k] = re * gain;
      full[2 * k + 1] = im * gain;
    }
    // The mirror half (conjugate) for the inverse transform.
    for (let k = BINS; k < N; k++) {
      full[2 * k] = full[2 * (N - k)]!;
      full[2 * k + 1] = -full[2 * (N - k) + 1]!;
    }
    fft.inverseTransform(time, full);
    for (let i = 0; i < N; i++) out[t * HOP + i] = out[t * HOP + i]! + time[2 * i]! * WINDOW[i]!;
  }
  return out.slice(HOP, HOP + audio.length);
}

/** Each bin's Wiener gain from the long-term powers of the speech's frames: (power − noise) / power, at least `floor`. */
function fixedGains(spectra: Float64Array[], noise: Float64Array, floor: number): Float64Array {
  const mean = new Float64Array(BINS);
  for (const s of spectra) for (let k = 0; k < BINS; k++) mean[k] = mean[k]! + s[2 * k]! * s[2 * k]! + s[2 * k + 1]! * s[2 * k + 1]!;
  const gains = new Float64Array(BINS).fill(1);
  for (let k = 0; k < BINS && spectra.length > 0; k++) {
    const p = mean[k]! / spectra.length;
    if (p > noise[k]!) gains[k] = Math.max(floor, (p - noise[k]!) / p);
    else gains[k] = floor;
  }
  return gains;
}

/** The noise's power in each bin: the mean over the non-speech frames, else the quietest ones. */
function noiseSpectrum(
  spectra: Float64Array[],
  power: Float64Array,
  length: number,
  isNoise?: (sample: number) => boolean,
): { noise: Float64Array; frames: Set<number> } {
  let chosen: number[] = [];
  if (isNoise)
    for (let t = 0; t < spectra.length; t++) {
      // A frame covers the padded audio's [t·HOP, t·HOP + N): samples t·HOP − HOP … t·HOP + HOP of the audio.
      const first = t * HOP - HOP;
      const last = first + N - 1;
      if (first >= 0 && last < length && isNoise(first) && isNoise(last)) chosen.push(t);
    }
  if (chosen.length < MIN_NOISE_FRAMES) {
    const order = [...power.keys()].sort((a, b) => power[a]! - power[b]!);
    chosen = order.slice(0, Math.max(1, Math.ceil(QUIETEST * order.length)));
  }
  const noise = new Float64Array(BINS);
  for (const t of chosen) {
    const s = spectra[t]!;
    for (let k = 0; k < BINS; k++) noise[k] = noise[k]! + s[2 * k]! * s[2 * k]! + s[2 * k + 1]! * s[2 * k + 1]!;
  }
  for (let k = 0; k < BINS; k++) noise[k] = noise[k]! / chosen.length;
  return { noise, frames: new Set(chosen) };
}

const RNNOISE_RATE = 48_000;
const RNNOISE_FRAME = 480;
/** RNNoise gives each frame one call later (its window spans two frames). */
const RNNOISE_DELAY = RNNOISE_FRAME;
const SCALE = 32768;

let rnnoiseModule: Promise<RNNoiseModule> | undefined;
let speexModule: ReturnType<typeof loadResampler> | undefined;

/** `audio` through RNNoise at 48 kHz, with the dry signal mixed back as `o` says. */
export async function rnnoise(audio: Float32Array, o: RnnoiseOptions): Promise<Float32Array> {
  rnnoiseModule ??= createRNNoise();
  const m = await rnnoiseModule;
  speexModule ??= loadResampler();
  const speex = await speexModule;
  const up = new Resampler(speex, RATE, RNNOISE_RATE);
  const scaled = Float32Array.from(audio, (x) => x * SCALE);
  const at48 = concat(up.processFloat(scaled), up.flushFloat());
  up.close();
  const frames = Math.ceil((at48.length + RNNOISE_DELAY) / RNNOISE_FRAME);
  const input = new Float32Array(frames * RNNOISE_FRAME);
  input.set(at48);
  const denoised = new Float32Array(input.length);
  const state = m._rnnoise_create(0);
  const inPtr = m._malloc(4 * RNNOISE_FRAME);
  const outPtr = m._malloc(4 * RNNOISE_FRAME);
  try {
    for (let f = 0; f < frames; f++) {
      m.HEAPF32.set(input.subarray(f * RNNOISE_FRAME, (f + 1) * RNNOISE_FRAME), inPtr >> 2);
      m._rnnoise_process_frame(state, outPtr, inPtr);
      denoised.set(m.HEAPF32.subarray(outPtr >> 2, (outPtr >> 2) + RNNOISE_FRAME), f * RNNOISE_FRAME);
    }
  } finally {
    m._free(inPtr);
    m._free(outPtr);
    m._rnnoise_destroy(state);
  }
  const down = new Resampler(speex, RNNOISE_RATE, RATE);
  const aligned = denoised.subarray(RNNOISE_DELAY, RNNOISE_DELAY + at48.length);
  const back = concat(down.processFloat(aligned), down.flushFloat());
  down.close();
  const dry = o.dryDb === undefined ? 0 : 10 ** (o.dryDb / 20);
  const out = new Float32Array(audio.length);
  for (let i = 0; i < out.length; i++) out[i] = (back[i] ?? 0) / SCALE + dry * audio[i]!;
  return out;
}

function concat(a: Float32Array, b: Float32Array): Float32Array {
  const out = new Float32Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

/** The gate's gain moves over this many samples (10 ms): no click at speech's edges. */
const GATE_RAMP = 160;

/** `audio` with its non-speech (by `isNoise`) brought down by `depthDb`; without a detector, unchanged. */
export function gate(audio: Float32Array, o: GateOptions, isNoise?: (sample: number) => boolean): Float32Array {
  const out = audio.slice();
  if (!isNoise) return out;
  const low = 10 ** (o.depthDb / 20);
  const step = (1 - low) / GATE_RAMP;
  let gain = isNoise(0) ? low : 1;
  for (let i = 0; i < out.length; i++) {
    const target = isNoise(i) ? low : 1;
    gain = target > gain ? Math.min(target, gain + step) : Math.max(target, gain - step);
    out[i] = out[i]! * gain;
  }
  return out;
}

/** `audio` through the suppressor `o` names. */
export function denoise(audio: Float32Array, o: DenoiseOptions, isNoise?: (sample: number) => boolean): Promise<Float32Array> {
  if (o.method === "wiener") return Promise.resolve(wiener(audio, o, isNoise));
  if (o.method === "gate") return Promise.resolve(gate(audio, o, isNoise));
  return rnnoise(audio, o);
}
