/**
 * `npm run bench -- speech`: the embedded engines measured in this process, without HTTP.
 * Speech: time to first byte and total time per format for a 30-word sentence, per voice kind
 * (alloy is flite's diphone voice, nova a clustergen one). Transcription: real-time factor
 * (recognition wall time over audio duration) and word error rate on synthesized sentences.
 */
import { availableParallelism, loadavg } from "node:os";
import { createSpeechEngine, createTranscriptionEngine, ffmpegPath, SPEECH_FORMATS } from "../src/ai/speech/index.ts";
import { ROUND_TRIP_SENTENCES as SENTENCES, wordErrorRate } from "../test/support/speech.ts";
import { percentiles, round } from "./support.ts";

const RUNS = Number(process.env.BENCH_SPEECH_RUNS ?? 7);
const SENTENCE =
  "The small device on the kitchen table reports its battery level, its temperature and its location to the server every minute, and it answers questions about the weather for today.";

export async function speechBench(): Promise<unknown> {
  const words = SENTENCE.split(" ").length;
  if (words !== 30) throw new Error(`the benchmark sentence has ${words} words`);
  const speech = createSpeechEngine();
  const warmUpStarted = performance.now();
  await speech.warmUp();
  const warmUpMs = performance.now() - warmUpStarted;

  const synthesis: Record<string, Record<string, unknown>> = {};
  for (const voice of ["alloy", "nova"]) {
    synthesis[voice] = {};
    for (const format of SPEECH_FORMATS) {
      const first: number[] = [];
      // Headers (ID3, OggS/OpusHead, RIFF, fLaC) are written once the first audio reaches ffmpeg; 1 KiB is audio in every format.
      const firstKib: number[] = [];
      const total: number[] = [];
      let bytes = 0;
      for (let i = 0; i < RUNS; i++) {
        const started = performance.now();
        let firstByte = 0;
        let kib = 0;
        bytes = 0;
        for await (const chunk of speech.synthesize({ text: SENTENCE, voice, format, speed: 1 })) {
          if (bytes === 0) firstByte = performance.now() - started;
          bytes += chunk.length;
          if (kib === 0 && bytes >= 1024) kib = performance.now() - started;
        }
        first.push(firstByte);
        firstKib.push(kib);
        total.push(performance.now() - started);
      }
      const f = percentiles(first);
      const t = percentiles(total);
      synthesis[voice][format] = {
        first_byte_ms: { p50: round(f.p50), max: round(Math.max(...first)) },
        first_kib_ms: { p50: percentiles(firstKib).p50 },
        total_ms: { p50: round(t.p50), max: round(Math.max(...total)) },
        bytes,
      };
    }
  }

  const recogniser = createTranscriptionEngine();
  let transcription: unknown;
  {
    const text = SENTENCES.join(" ");
    const chunks: Uint8Array[] = [];
    for await (const chunk of speech.synthesize({ text, voice: "echo", format: "wav", speed: 1 })) chunks.push(chunk);
    const audio = Buffer.concat(chunks);
    const factors: number[] = [];
    let wer = 0;
    let duration = 0;
    for (let i = 0; i < 3; i++) {
      const started = performance.now();
      const transcript = await recogniser.transcribe({ audio });
      factors.push((performance.now() - started) / 1000 / transcript.duration);
      wer = wordErrorRate(text, transcript.text);
      duration = transcript.duration;
    }
    transcription = {
      available: true,
      audio_seconds: round(duration),
      real_time_factor: { min: round(Math.min(...factors)), p50: percentiles(factors).p50 },
      word_error_rate: round(wer),
      goal_real_time_factor: 0.3,
    };
  }
  return {
    suite: "speech",
    cpus: availableParallelism(),
    // Other work on the machine slows everything here; read the figures with it.
    load_average: loadavg().map(round),
    ffmpeg: ffmpegPath().includes("node_modules") ? "npm (@ffmpeg-installer/ffmpeg)" : "system",
    runs: RUNS,
    sentence_words: words,
    warm_up_ms: round(warmUpMs),
    goal_first_byte_ms: 150,
    synthesis,
    transcription,
  };
}
