/**
 * The hearing benchmark's speech set (issue 50), made at bench time (no audio is committed): short
 * requests to a voice device, numbers among them, each spoken by one of several voices (espeak-ng's
 * and flite's, synthesisers Perch was not tuned on and its own), some with a soft start, each
 * rendered several times as a converter and a microphone would vary it (another dither, a little
 * more or less gain, ±5 % speed), clean and with pink noise at 10 dB SNR. The recogniser is judged
 * on the mean word error rate over the renditions and their spread (max − min): one rendition can be
 * lucky or unlucky (issue 50: 0.059 to 0.119 for the same sentences).
 */
import { createSpeechEngine } from "../src/ai/speech/index.ts";
import { loadResampler, Resampler } from "../src/audio/resampler.ts";
import { ESPEAK_VOICES, espeak, ROUND_TRIP_SENTENCES, seededRandom } from "../test/support/speech.ts";

export const RATE = 16_000;

/**
 * Everyday requests, numbers among them; the README tour's question and the Compatible API's example
 * among them. The tests' round-trip sentences from the fourth on, in their order, are the set's.
 */
export const SENTENCES = [
  "What is the weather like today?",
  "Turn on the kitchen lights.",
  "Set a timer for fifteen minutes.",
  ...ROUND_TRIP_SENTENCES.slice(3),
  "Turn the volume down to three.",
  "Wake me up at seven thirty.",
  "What time is it in Tokyo?",
  "Add bread and orange juice to the shopping list.",
  "Is it going to rain this afternoon?",
  "Switch off the heating in the bedroom.",
  "How many days until Christmas?",
  "Send a message to Peter saying I am late.",
  "Read me the news headlines.",
  "What is twenty four divided by six?",
  "Lock the garage door please.",
  "Tell me a joke about penguins.",
  "Set the thermostat to twenty one degrees.",
  "Where did I park the car?",
  "Stop the kitchen timer.",
  "Book a table for four people at eight.",
  "How tall is the Eiffel Tower?",
  "Dim the lights in the hallway.",
  "Translate good morning into Spanish.",
  "Order two large pizzas for dinner.",
];

export interface Voice {
  name: string;
  /** 16 kHz mono samples (-1..1) at the voice's own rate, and that rate. */
  speak(text: string): Promise<{ samples: Float32Array; rate: number }>;
}

/** espeak-ng speaks at 22,050 Hz; test/support/speech.ts's helper resamples to 16 kHz (linear), so the rate is 16 kHz here. */
function espeakVoice(v: { name: string; args: readonly string[] }): Voice {
  return { name: v.name, speak: async (text) => ({ samples: await espeak(text, v.args), rate: RATE }) };
}

function fliteVoice(voice: string): Voice {
  const engine = createSpeechEngine({ concurrency: 1 });
  return {
    name: `flite ${voice}`,
    speak: async (text) => {
      const { samples, sampleRate } = await engine.speak(text, voice);
      return { samples: Float32Array.from(samples, (x) => x / 32768), rate: sampleRate };
    },
  };
}

export const VOICES: Voice[] = [
  // The tests' two espeak-ng voices (en-us, en-gb-x-rp), then the others.
  ...ESPEAK_VOICES.map(espeakVoice),
  fliteVoice("alloy"),
  fliteVoice("nova"),
  espeakVoice({ name: "espeak-ng en-us+f3", args: ["-v", "en-us+f3", "-s", "160"] }),
  fliteVoice("fable"),
];

/** How one rendition differs: a dither of its own, a gain and a speed. */
export interface Rendition {
  seed: number;
  gainDb: number;
  speed: number;
}

export const RENDITIONS: Rendition[] = [
  { seed: 11, gainDb: 0, speed: 1 },
  { seed: 23, gainDb: -2, speed: 0.95 },
  { seed: 37, gainDb: 2, speed: 1.05 },
];

/** One utterance of the set: its words and its source audio (the voice's rate, float). */
export interface Item {
  text: string;
  voice: string;
  softStart: boolean;
  samples: Float32Array;
  rate: number;
}

/** Every `every`-th item starts softly: its first 250 ms fade in from −30 dB. */
const SOFT_EVERY = 4;
const SOFT_S = 0.25;

/** The set: sentence i spoken by voice i mod the voices (`count` sentences). */
export async function speechSet(count = SENTENCES.length): Promise<Item[]> {
  const items: Item[] = [];
  for (const [i, text] of SENTENCES.slice(0, count).entries()) {
    const voice = VOICES[i % VOICES.length]!;
    const { samples, rate } = await voice.speak(text);
    const softStart = i % SOFT_EVERY === SOFT_EVERY - 1;
    if (softStart) {
      let on = 0;
      while (on < samples.length && Math.abs(samples[on]!) < 0.01) on++;
      const n = Math.round(SOFT_S * rate);
      for (let k = 0; k < n && on + k < samples.length; k++) samples[on + k] = samples[on + k]! * 10 ** ((-30 * (1 - k / n)) / 20);
    }
    items.push({ text, voice: voice.name, softStart, samples, rate });
  }
  return items;
}

/** Pink noise (Paul Kellet's filter over white noise), seeded. */
export function pinkNoise(n: number, seed: number): Float32Array {
  const random = seededRandom(seed);
  const out = new Float32Array(n);
  let [b0, b1, b2, b3, b4, b5, b6] = [0, 0, 0, 0, 0, 0, 0];
  for (let i = 0; i < n; i++) {
    const w = random() * 2 - 1;
    b0 = 0.99886 * b0 + w * 0.0555179;
    b1 = 0.99332 * b1 + w * 0.0750759;
    b2 = 0.969 * b2 + w * 0.153852;
    b3 = 0.8665 * b3 + w * 0.3104856;
    b4 = 0.55 * b4 + w * 0.5329522;
    b5 = -0.7616 * b5 - w * 0.016898;
    out[i] = b0 + b1 + b2 + b3 + b4 + b5 + b6 + w * 0.5362;
    b6 = w * 0.115926;
  }
  return out;
}

/** Silence around each utterance, as a recording has. */
const LEAD_S = 0.3;

/**
 * One rendition of an item as 16-bit samples at 16 kHz: its speed changed (resampled as if played
 * faster or slower), its gain, pink noise at `snrDb` below the speech (computed where it is not
 * silent) when given, then quantised with a triangular dither of its own seed.
 */
export async function render(item: Item, r: Rendition, snrDb?: number): Promise<Int16Array> {
  const module = await loadResampler();
  // Played `speed` times faster: the source's samples taken as if its rate were rate × speed.
  const from = Math.round(item.rate * r.speed);
  const resampler = new Resampler(module, from, RATE);
  const source = Int16Array.from(item.samples, (x) => Math.max(-32768, Math.min(32767, Math.round(x * 32767))));
  const moved = from === RATE ? source : resampler.process(source);
  resampler.close();
  const lead = Math.round(LEAD_S * RATE);
  const audio = new Float32Array(moved.length + 2 * lead);
  const gain = 10 ** (r.gainDb / 20);
  for (let i = 0; i < moved.length; i++) audio[lead + i] = (moved[i]! / 32768) * gain;
  if (snrDb !== undefined) {
    let power = 0;
    let n = 0;
    for (const x of audio)
      if (Math.abs(x) > 0.01) {
        power += x * x;
        n++;
      }
    const noise = pinkNoise(audio.length, r.seed * 7 + 1);
    let noisePower = 0;
    for (const x of noise) noisePower += x * x;
    const scale = Math.sqrt(power / Math.max(1, n) / 10 ** (snrDb / 10) / (noisePower / noise.length));
    for (let i = 0; i < audio.length; i++) audio[i] = audio[i]! + noise[i]! * scale;
  }
  const random = seededRandom(r.seed);
  return Int16Array.from(audio, (x) => Math.max(-32768, Math.min(32767, Math.round(x * 32767 + random() - random()))));
}
