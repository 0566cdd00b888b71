/**
 * Views of an utterance for ensemble decoding (issue 50): the same 16 kHz audio changed in ways no
 * listener would notice — a few milliseconds dropped at its start (another phase against the
 * encoder's stride of 384 samples), a dither of its own, a slightly other speed — that Moonshine
 * nonetheless hears differently. Decoded jointly (beam-search.ts: a product of experts), the views'
 * words agree where one view alone would tip ("kitchen timer" ↔ "vacation time, er"). Deterministic:
 * the same audio and view give the same samples.
 */
import { loadResampler, Resampler } from "../../audio/resampler.ts";

export interface View {
  /** Samples dropped at the start (16 kHz). */
  shift?: number;
  /** Played this many times faster (Speex resampling), e.g. 0.97 or 1.03. */
  speed?: number;
  /** A dither of this seed added at ditherDbfs (RMS). */
  seed?: number;
  ditherDbfs?: number;
}

/** The identity: the audio as it is. */
export const IDENTITY: View = {};

const RATE = 16_000;
const DITHER_DBFS = -66;

type SpeexModule = Awaited<ReturnType<typeof loadResampler>>;
let speex: Promise<SpeexModule> | undefined;

/** Whether a view changes nothing. */
export function isIdentity(v: View): boolean {
  return !v.shift && (v.speed === undefined || v.speed === 1) && v.seed === undefined;
}

/**
 * `audio` as `view` hears it: a new array of the same length (the encoder's batch is padded to its
 * longest, and Moonshine's encoder has no mask: a view padded with more silence than the others
 * would be heard differently for that alone), or `audio` itself for the identity. A shift drops
 * samples at the start and adds as many of silence at the end; a slower view loses its end (the
 * utterance's padding of silence), a faster one gains silence there.
 */
export async function renderView(audio: Float32Array, view: View): Promise<Float32Array> {
  if (isIdentity(view)) return audio;
  const out = new Float32Array(audio.length);
  if (view.speed !== undefined && view.speed !== 1) {
    speex ??= loadResampler();
    const resampler = new Resampler(await speex, Math.round(RATE * view.speed), RATE);
    try {
      const source = view.shift ? audio.subarray(Math.min(audio.length, view.shift)) : audio;
      const moved = resampler.processFloat(source);
      out.set(moved.subarray(0, out.length));
      if (moved.length < out.length) out.set(resampler.flushFloat().subarray(0, out.length - moved.length), moved.length);
    } finally {
      resampler.close();
    }
  } else out.set(view.shift ? audio.subarray(Math.min(audio.length, view.shift)) : audio);
  if (view.seed !== undefined) {
    // Uniform noise on [-a, a] has an RMS of a / √3.
    const a = 10 ** ((view.ditherDbfs ?? DITHER_DBFS) / 20) * Math.sqrt(3);
    let s = (0x9e3779b9 ^ Math.imul(view.seed, 2654435761)) >>> 0;
    for (let i = 0; i < out.length; i++) {
      s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
      out[i] = out[i]! + (s / 2 ** 32) * 2 * a - a;
    }
  }
  return out;
}
