/**
 * The recogniser's front end: what is done to 16 kHz audio before Moonshine hears it (issue 50).
 * Moonshine reads the raw waveform, and it is at a knife's edge: the same sentence converted three
 * times with a dither that differs by a few least-significant bits gave word error rates of 0.06 to
 * 0.12. The front end takes away what says nothing of the words: a DC offset and rumble (a
 * high-pass filter), the level (speech brought to one loudness), and the near-silence whose last
 * bits are a converter's noise (a floor of our own noise, the same every time, well above them).
 * Deterministic: the same audio gives the same samples.
 */

export interface FrontEndOptions {
  /** The high-pass filter's corner (Hz); 0: none. */
  highPassHz: number;
  /** Speech's level after the front end (RMS of the loud part, dBFS); undefined: left as it is. */
  speechDbfs: number | undefined;
  /** A floor of noise (RMS, dBFS) added after the level is set; undefined: none. */
  floorDbfs: number | undefined;
}

/**
 * The files' front end. The corner is 150 Hz rather than 80 (the hearing benchmark, docs/benchmarks.md):
 * clean WER 0.13 → 0.10 with a spread of 0.04 → 0.02 over the renditions, noisy unchanged (0.35 → 0.36
 * on 30 sentences, 0.35 → 0.34 on 24); 250 Hz took too much (clean 0.16, "kitchen lights" 8 of 18).
 */
export const FRONT_END: FrontEndOptions = { highPassHz: 150, speechDbfs: -23, floorDbfs: -60 };

const RATE = 16_000;
/** Loudness is judged in blocks of 20 ms; the speech's level is that of its loud blocks (this quantile). */
const BLOCK = 320;
const LOUD_QUANTILE = 0.8;
/** The level is changed by at most this much either way (dB): a whisper is not made a shout. */
const MAX_GAIN_DB = 24;

/** `audio` (16 kHz mono, -1..1) through the front end, as a new array. */
export function frontEnd(audio: Float32Array, o: FrontEndOptions = FRONT_END): Float32Array {
  const out = o.highPassHz > 0 ? highPass(audio, o.highPassHz) : audio.slice();
  if (o.speechDbfs !== undefined) {
    const level = speechLevel(out);
    if (level > 0) {
      const gainDb = Math.max(-MAX_GAIN_DB, Math.min(MAX_GAIN_DB, o.speechDbfs - 20 * Math.log10(level)));
      const gain = 10 ** (gainDb / 20);
      for (let i = 0; i < out.length; i++) out[i] = Math.max(-1, Math.min(1, out[i]! * gain));
    }
  }
  if (o.floorDbfs !== undefined) {
    // Uniform noise on [-a, a] has an RMS of a / √3; seeded: the same floor for the same length.
    const a = 10 ** (o.floorDbfs / 20) * Math.sqrt(3);
    let s = 0x9e3779b9;
    for (let i = 0; i < out.length; i++) {
      s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
      out[i] = out[i]! + (s / 2 ** 32) * 2 * a - a;
    }
  }
  return out;
}

/** A second-order Butterworth high-pass (the RBJ cookbook's biquad), from rest. */
function highPass(x: Float32Array, hz: number): Float32Array {
  const w = (2 * Math.PI * hz) / RATE;
  const alpha = Math.sin(w) / (2 * Math.SQRT1_2);
  const cos = Math.cos(w);
  const a0 = 1 + alpha;
  const b0 = (1 + cos) / 2 / a0;
  const b1 = -(1 + cos) / a0;
  const b2 = b0;
  const a1 = (-2 * cos) / a0;
  const a2 = (1 - alpha) / a0;
  const y = new Float32Array(x.length);
  let [x1, x2, y1, y2] = [0, 0, 0, 0];
  for (let i = 0; i < x.length; i++) {
    const v = b0 * x[i]! + b1 * x1 + b2 * x2 - a1 * y1 - a2 * y2;
    x2 = x1;
    x1 = x[i]!;
    y2 = y1;
    y1 = v;
    y[i] = v;
  }
  return y;
}

/** The RMS of the audio's loud blocks (LOUD_QUANTILE of the 20 ms blocks' RMS): its speech's level. */
function speechLevel(x: Float32Array): number {
  const levels: number[] = [];
  for (let at = 0; at + BLOCK <= x.length; at += BLOCK) {
    let sum = 0;
    for (let i = at; i < at + BLOCK; i++) sum += x[i]! * x[i]!;
    levels.push(Math.sqrt(sum / BLOCK));
  }
  if (levels.length === 0) return 0;
  levels.sort((a, b) => a - b);
  return levels[Math.min(levels.length - 1, Math.floor(LOUD_QUANTILE * levels.length))]!;
}
