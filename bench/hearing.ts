/**
 * `npm run bench -- hearing` (issue 50): how well the embedded recogniser hears, side by side in one
 * run for several configurations of the engine (`BENCH_HEARING_CONFIGS`, default "before,after":
 * `before` is greedy decoding with no front end, as before issue 50; `after` the engine's defaults;
 * the others, the experiments of issue 50: beams, the front end's parts).
 *
 * - Word error rate over the speech set (bench/speech-set.ts: `BENCH_HEARING_SENTENCES` (30)
 *   requests, six voices, three renditions each), clean and with pink noise at 10 dB SNR, through
 *   the file route (`transcribe`, as `/audio/transcriptions`): the mean over renditions and the
 *   spread (max − min), with the words most often misheard.
 * - The README tour's question, "What is the weather like today?", said by each of the six flite
 *   voices as a device's microphone sends it (48 kHz Opus) and heard as a conversation's turn is
 *   (the incremental recogniser), the uplink decoded straight at 16 kHz and at 48 kHz resampled by
 *   Speex: right in how many of the renditions.
 * - The Compatible API's own voices saying "Turn on the kitchen lights." through the file route.
 * - With `BENCH_HEARING_NOISY_LIVE=1`, the noisy set heard as a conversation's turns are.
 * - The real-time factor of the clean files, one at a time (recognition time / audio time).
 *
 * The engine has one recogniser process of two threads, as on a 2-core node. On a shared machine,
 * run it alone (one benchmark at a time).
 */
import { availableParallelism, loadavg } from "node:os";
import { FRONT_END } from "../src/ai/speech/front-end.ts";
import { createSpeechEngine, createTranscriptionEngine, type MoonshineEngineOptions } from "../src/ai/speech/index.ts";
import { IDENTITY, type View } from "../src/ai/speech/views.ts";
import { loadResampler, Resampler } from "../src/audio/resampler.ts";
import { wavFile } from "../src/audio/samples.ts";
import { FRAME_SAMPLES, OpusCodec } from "../src/voice/opus.ts";
import { wordErrorRate } from "../test/support/speech.ts";
import { type Item, RATE, RENDITIONS, render, speechSet } from "./speech-set.ts";
import { round } from "./support.ts";

/** Views for ensemble decoding: phases against the encoder's stride of 384 samples, speeds, dithers, and a mix. */
const SHIFTS: View[] = [IDENTITY, { shift: 128 }, { shift: 256 }];
const SPEEDS: View[] = [IDENTITY, { speed: 0.97 }, { speed: 1.03 }];
const DITHERS: View[] = [IDENTITY, { seed: 1, ditherDbfs: -60 }, { seed: 2, ditherDbfs: -60 }];
const MIX5: View[] = [IDENTITY, { shift: 128 }, { shift: 256 }, { speed: 0.97 }, { speed: 1.03 }];

/** A configuration: the engine's options, and what is done to each file's audio before it is sent (experiments). */
export interface HearingConfig {
  options: MoonshineEngineOptions;
  transform?: (pcm: Int16Array) => Promise<Int16Array>;
}

/** The files' front end as issue 50's first measures had it (80 Hz): the configurations measured on it keep it. */
const FRONT_END_80 = { ...FRONT_END, highPassHz: 80 };

const CONFIGS: Record<string, HearingConfig> = {
  before: { options: { beams: 1, turnBeams: 1, frontEnd: false } },
  after: { options: {} },
  beams2: { options: { beams: 2, frontEnd: false } },
  beams3: { options: { beams: 3, frontEnd: false } },
  beams4: { options: { beams: 4, frontEnd: false } },
  hp: { options: { beams: 1, frontEnd: { highPassHz: 80, speechDbfs: undefined, floorDbfs: undefined } } },
  // The files' defaults before the corner went to 150 Hz.
  hp80: { options: { frontEnd: FRONT_END_80 } },
  level: { options: { beams: 1, frontEnd: { highPassHz: 80, speechDbfs: -23, floorDbfs: undefined } } },
  floor: { options: { beams: 1, frontEnd: FRONT_END_80 } },
  floor50: { options: { beams: 1, frontEnd: { ...FRONT_END_80, floorDbfs: -50 } } },
  floor70: { options: { beams: 1, frontEnd: { ...FRONT_END_80, floorDbfs: -70 } } },
  floorOnly: { options: { beams: 1, frontEnd: { highPassHz: 0, speechDbfs: undefined, floorDbfs: -60 } } },
  "floor+beams3": { options: { beams: 3, frontEnd: FRONT_END_80 } },
  // Ensemble decoding (views.ts): each utterance heard several ways, decoded jointly. `one-view`
  // pins the engine's file and turn decoding before ensembles (beams 3 and the front end for files, greedy turns).
  "one-view": { options: { beams: 3, frontEnd: FRONT_END_80, views: [IDENTITY], turnBeams: 1, turnViews: [IDENTITY] } },
  "shift3+beams3": { options: { beams: 3, frontEnd: FRONT_END_80, views: SHIFTS, turnViews: SHIFTS } },
  "shift3+greedy": { options: { beams: 1, frontEnd: FRONT_END_80, views: SHIFTS, turnViews: SHIFTS } },
  "shift3mix+beams3": { options: { beams: 3, frontEnd: FRONT_END_80, views: SHIFTS, turnViews: SHIFTS, combine: "mixture" } },
  "speed3+beams3": { options: { beams: 3, frontEnd: FRONT_END_80, views: SPEEDS, turnViews: SPEEDS } },
  "speed3+greedy": { options: { beams: 1, frontEnd: FRONT_END_80, views: SPEEDS, turnViews: SPEEDS } },
  "dither3+beams3": { options: { beams: 3, frontEnd: FRONT_END_80, views: DITHERS, turnViews: DITHERS } },
  "mix5+greedy": { options: { beams: 1, frontEnd: FRONT_END_80, views: MIX5, turnViews: MIX5 } },
  // Noise suppression of files (denoise.ts), on top of the defaults (front end, beams 3).
  wiener: { options: { frontEnd: FRONT_END_80, denoise: { method: "wiener", floorDb: -15, overSubtraction: 1 } } },
  wiener10: { options: { frontEnd: FRONT_END_80, denoise: { method: "wiener", floorDb: -10, overSubtraction: 1 } } },
  wiener20: { options: { frontEnd: FRONT_END_80, denoise: { method: "wiener", floorDb: -20, overSubtraction: 1.5 } } },
  rnnoise: { options: { frontEnd: FRONT_END_80, denoise: { method: "rnnoise", dryDb: undefined } } },
  rnnoiseDry10: { options: { frontEnd: FRONT_END_80, denoise: { method: "rnnoise", dryDb: -10 } } },
  rnnoiseDry20: { options: { frontEnd: FRONT_END_80, denoise: { method: "rnnoise", dryDb: -20 } } },
  wienerFixed: { options: { frontEnd: FRONT_END_80, denoise: { method: "wiener", floorDb: -15, overSubtraction: 1, fixed: true } } },
  wienerFixed6: { options: { frontEnd: FRONT_END_80, denoise: { method: "wiener", floorDb: -6, overSubtraction: 1, fixed: true } } },
  wiener6: { options: { frontEnd: FRONT_END_80, denoise: { method: "wiener", floorDb: -6, overSubtraction: 1 } } },
  gate10: { options: { frontEnd: FRONT_END_80, denoise: { method: "gate", depthDb: -10 } } },
  gate20: { options: { frontEnd: FRONT_END_80, denoise: { method: "gate", depthDb: -20 } } },
  hpFixed: { options: { frontEnd: { ...FRONT_END_80, highPassHz: 150 }, denoise: { method: "wiener", floorDb: -15, overSubtraction: 1, fixed: true } } },
  // Turns (the incremental recogniser): the noise-shaped filter on each utterance.
  turnFixed: { options: { frontEnd: FRONT_END_80, turnDenoise: { method: "wiener", floorDb: -15, overSubtraction: 1, fixed: true } } },
  turnWiener10: { options: { frontEnd: FRONT_END_80, turnDenoise: { method: "wiener", floorDb: -10, overSubtraction: 1 } } },
  // Turns heard through a front end (off for them by default): the files', without its floor, 150 Hz.
  turnFE: { options: { frontEnd: FRONT_END_80, turnFrontEnd: FRONT_END_80 } },
  turnLevel: { options: { frontEnd: FRONT_END_80, turnFrontEnd: { ...FRONT_END_80, floorDbfs: undefined } } },
  turnHp150: { options: { frontEnd: FRONT_END_80, turnFrontEnd: { ...FRONT_END_80, highPassHz: 150, floorDbfs: undefined } } },
  // The front end's corner on noisy speech (pink noise is loudest low down).
  hp150: { options: { frontEnd: { ...FRONT_END_80, highPassHz: 150 } } },
  hp250: { options: { frontEnd: { ...FRONT_END_80, highPassHz: 250 } } },
  level18: { options: { frontEnd: { ...FRONT_END_80, speechDbfs: -18 } } },
};
const NAMES = (process.env.BENCH_HEARING_CONFIGS ?? "before,after").split(",");
const SENTENCE_COUNT = Number(process.env.BENCH_HEARING_SENTENCES ?? 30);
/** `BENCH_HEARING_NOISY_LIVE=1`: the noisy set also through a conversation's recogniser (turns). */
const NOISY_LIVE = process.env.BENCH_HEARING_NOISY_LIVE === "1";
const TOUR = "What is the weather like today?";
const COMPAT = "Turn on the kitchen lights.";
const FLITE = ["alloy", "echo", "fable", "onyx", "nova", "shimmer"];

interface Scored {
  wer: number;
  said: string;
  heard: string;
}

function percentiles(ms: number[]) {
  const sorted = [...ms].sort((a, b) => a - b);
  const at = (q: number) => Math.round(sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? 0);
  return { n: sorted.length, p50: at(0.5), p95: at(0.95) };
}

function summary(perRendition: Scored[][]) {
  const means = perRendition.map((r) => r.reduce((s, x) => s + x.wer, 0) / Math.max(1, r.length));
  const mean = means.reduce((s, x) => s + x, 0) / Math.max(1, means.length);
  const misheard = new Map<string, number>();
  for (const r of perRendition) for (const x of r) if (x.wer > 0) misheard.set(`${x.said} → ${x.heard}`, (misheard.get(`${x.said} → ${x.heard}`) ?? 0) + 1);
  return {
    wer_mean: round(mean),
    wer_spread: round(Math.max(...means) - Math.min(...means)),
    wer_by_rendition: means.map(round),
    misheard: [...misheard.entries()]
      .sort((a, b) => b[1] - a[1])
      .slice(0, 6)
      .map(([k, n]) => `${n}× ${k}`),
  };
}

/** A device's microphone: 16 kHz → 48 kHz → Opus packets of 20 ms → decoded as the uplink does (at 16 kHz, or at 48 kHz then Speex). */
export async function throughUplink(pcm16k: Int16Array, decodeAt: 16_000 | 48_000): Promise<Int16Array> {
  const module = await loadResampler();
  const up = new Resampler(module, RATE, 48_000);
  const at48 = up.process(pcm16k);
  up.close();
  const encoder = new OpusCodec();
  const decoder = new OpusCodec(decodeAt);
  const down = decodeAt === 48_000 ? new Resampler(module, 48_000, RATE) : undefined;
  const out: Int16Array[] = [];
  for (let at = 0; at + FRAME_SAMPLES <= at48.length; at += FRAME_SAMPLES) {
    const decoded = decoder.decode(encoder.encode(at48.subarray(at, at + FRAME_SAMPLES)));
    if (decoded) out.push(down ? down.process(decoded) : decoded);
  }
  encoder.close();
  decoder.close();
  down?.close();
  const n = out.reduce((s, x) => s + x.length, 0);
  const all = new Int16Array(n);
  let k = 0;
  for (const x of out) {
    all.set(x, k);
    k += x.length;
  }
  return all;
}

export async function hearingBench(extra: Record<string, HearingConfig> = {}): Promise<unknown> {
  const configs = { ...CONFIGS, ...extra };
  const started = performance.now();
  const items = await speechSet(SENTENCE_COUNT);
  const flite = createSpeechEngine({ concurrency: 1 });
  const said = async (text: string, voice: string): Promise<Item> => {
    const { samples, sampleRate } = await flite.speak(text, voice);
    return { text, voice, softStart: false, samples: Float32Array.from(samples, (x) => x / 32768), rate: sampleRate };
  };
  const tour = await Promise.all(FLITE.map((v) => said(TOUR, v)));
  const compat = await Promise.all(FLITE.map((v) => said(COMPAT, v)));
  // Every rendition made once, shared by the configurations.
  const clean = await Promise.all(RENDITIONS.map((r) => Promise.all(items.map((item) => render(item, r)))));
  const noisy = await Promise.all(RENDITIONS.map((r) => Promise.all(items.map((item) => render(item, r, 10)))));
  const tourAudio = await Promise.all(RENDITIONS.map((r) => Promise.all(tour.map((item) => render(item, r)))));
  const compatAudio = await Promise.all(RENDITIONS.map((r) => Promise.all(compat.map((item) => render(item, r)))));
  const uplink = {
    16000: await Promise.all(tourAudio.map((rs) => Promise.all(rs.map((pcm) => throughUplink(pcm, 16_000))))),
    48000: await Promise.all(tourAudio.map((rs) => Promise.all(rs.map((pcm) => throughUplink(pcm, 48_000))))),
  };
  const audioSeconds = clean[0]!.reduce((s, x) => s + x.length, 0) / RATE;

  const out: Record<string, unknown> = {
    suite: "hearing",
    machine: { cores: availableParallelism(), load_1m_at_start: round(loadavg()[0]!) },
    set: { sentences: items.length, voices: [...new Set(items.map((i) => i.voice))], renditions: RENDITIONS, noisy_snr_db: 10 },
  };
  for (const name of NAMES) {
    const config = configs[name];
    if (!config) throw new Error(`unknown configuration ${name}; known: ${Object.keys(configs).join(", ")}`);
    const { options } = config;
    const transform = config.transform ?? (async (pcm: Int16Array) => pcm);
    const engine = createTranscriptionEngine({ processes: 1, threads: 2, fastAfterMs: false, ...options });
    try {
      await engine.start();
      // Warm-up.
      await engine.transcribe({ audio: wavFile(clean[0]![0]!, RATE) });
      const file = async (pcm: Int16Array, text: string): Promise<Scored> => {
        const heard = (await engine.transcribe({ audio: wavFile(await transform(pcm), RATE) })).text;
        return { wer: wordErrorRate(text, heard), said: text, heard };
      };
      let recognising = 0;
      const cleanScores: Scored[][] = [];
      for (const rendition of clean) {
        const scores: Scored[] = [];
        for (const [i, pcm] of rendition.entries()) {
          const t = performance.now();
          scores.push(await file(pcm, items[i]!.text));
          recognising += performance.now() - t;
        }
        cleanScores.push(scores);
      }
      const noisyScores: Scored[][] = [];
      for (const rendition of noisy) {
        const scores: Scored[] = [];
        for (const [i, pcm] of rendition.entries()) scores.push(await file(pcm, items[i]!.text));
        noisyScores.push(scores);
      }
      // A turn's words: the audio pushed at once (its recognition starts at its trailing silence, as
      // live), then finish(); the time from the last push to the words is the recognition's share of a
      // turn's speech → first audio (the device waits ~0.3–0.43 s of silence besides).
      const turnMs: number[] = [];
      const live = async (pcm: Int16Array) => {
        const asr = engine.createIncrementalRecogniser();
        const heard = await transform(pcm);
        for (let at = 0; at < heard.length; at += 320) asr.push(heard.subarray(at, at + 320));
        const t = performance.now();
        const words = await asr.finish();
        turnMs.push(performance.now() - t);
        return words;
      };
      // The noisy set as a conversation's turns hear it (the incremental recogniser, 20 ms pushes).
      const noisyLiveScores: Scored[][] = [];
      if (NOISY_LIVE)
        for (const rendition of noisy) {
          const scores: Scored[] = [];
          for (const [i, pcm] of rendition.entries()) {
            const heard = await live(pcm);
            scores.push({ wer: wordErrorRate(items[i]!.text, heard), said: items[i]!.text, heard });
          }
          noisyLiveScores.push(scores);
        }
      const right = (text: string, heard: string) => wordErrorRate(text, heard) === 0;
      const tourBy = async (rate: 16_000 | 48_000) => {
        const wrong: string[] = [];
        let ok = 0;
        for (const rendition of uplink[rate])
          for (const [v, pcm] of rendition.entries()) {
            const heard = await live(pcm);
            if (right(TOUR, heard)) ok++;
            else wrong.push(`${FLITE[v]}: ${heard}`);
          }
        return { right: ok, of: uplink[rate].length * FLITE.length, wrong };
      };
      const compatWrong: string[] = [];
      let compatRight = 0;
      for (const rendition of compatAudio)
        for (const [v, pcm] of rendition.entries()) {
          const { heard } = await file(pcm, COMPAT);
          if (right(COMPAT, heard)) compatRight++;
          else compatWrong.push(`${FLITE[v]}: ${heard}`);
        }
      out[name] = {
        options,
        clean: summary(cleanScores),
        noisy_pink_10db: summary(noisyScores),
        ...(NOISY_LIVE ? { noisy_pink_10db_live: summary(noisyLiveScores) } : {}),
        tour_question_live: { uplink_16k: await tourBy(16_000), uplink_48k_speex: await tourBy(48_000) },
        compat_voices_kitchen_lights: { right: compatRight, of: compatAudio.length * FLITE.length, wrong: compatWrong },
        file_rtf: round(recognising / 1000 / (audioSeconds * clean.length)),
        turn_words_ms: percentiles(turnMs),
      };
      process.stderr.write(`hearing: ${name} done (${round((performance.now() - started) / 1000)} s)\n`);
    } finally {
      await engine.close();
    }
  }
  out.machine = { ...(out.machine as object), load_1m_at_end: round(loadavg()[0]!) };
  return out;
}
