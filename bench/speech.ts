/**
 * `npm run bench -- speech`: the embedded engines measured in this process, without HTTP.
 *
 * Speech (flite): time to first byte and total time per format for a 30-word sentence (alloy and
 * nova), time to first byte per voice, and each voice's round-trip word error rate (synthesise,
 * then recognise with the embedded recogniser) — what the voice mapping is chosen by.
 *
 * Transcription (Moonshine + Silero): word error rate on sentences espeak-ng speaks in two voices
 * (a synthesiser Perch was not tuned on), clean and with white noise at 20 dB SNR; real-time factor
 * one request at a time and four at once; model load time and the worker processes' resident
 * memory; and the end-of-turn latency of live recognition: a 2 s utterance pushed in 20 ms packets
 * with partials as a conversation asks for them, 300 ms of silence in real time (the turn
 * detector's), then `finish()` timed; "cold" is `finish()` with nothing recognised before.
 *
 * Mixed (issue 24), over HTTP on `perch serve`: a `"Hello there."` request's time to first byte
 * while 18 clients hold 4,096-character requests open without reading, and while 8 clients loop on
 * them (reading) beside 2 looping on transcription; the server's CPU per 4,096-character request
 * and per transcription of a 20 s file.
 *
 * Alone (issue 40, speech-alone.ts): a 60 s and a 10 min file's real-time factor on an idle node
 * over HTTP, and a conversation's turns beside a 10 min file; `--base <commit>` measures that commit
 * too, in the same run.
 *
 * BENCH_SPEECH_RUNS (5), BENCH_SPEECH_PHASES (default "engines,mixed,alone"; e.g. `alone` alone).
 */
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync } from "node:fs";
import { availableParallelism, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { setImmediate, setTimeout as sleep } from "node:timers/promises";
import { createSpeechEngine, createTranscriptionEngine, ffmpegPath, SPEECH_FORMATS, VOICES } from "../src/ai/speech/index.ts";
import { concatFloat32 } from "../src/audio/samples.ts";
import { ESPEAK_VOICES, espeak, ROUND_TRIP_SENTENCES as SENTENCES, silence, wavFile, withNoise, wordErrorRate } from "../test/support/speech.ts";
import { helloFirstByte, LONG_TEXT, loop, nonReader, speechRequest, transcriptionRequest } from "./api-load.ts";
import { aloneBench } from "./speech-alone.ts";
import { benchConfig, percentiles, round, startServer, treeCpuSeconds } from "./support.ts";

const RUNS = Number(process.env.BENCH_SPEECH_RUNS ?? 5);
const SENTENCE =
  "The small device on the kitchen table reports its battery level, its temperature and its location to the server every minute, and it answers questions about the weather for today.";
const SNR_DB = 20;

function rssMb(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  return round(Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0) / 1024);
}

async function bytesOf(audio: AsyncIterable<Uint8Array>): Promise<Buffer> {
  const parts: Uint8Array[] = [];
  for await (const p of audio) parts.push(p);
  return Buffer.concat(parts);
}

const PHASES = new Set((process.env.BENCH_SPEECH_PHASES ?? "engines,mixed,alone").split(","));
const BASE = process.argv.includes("--base") ? process.argv[process.argv.indexOf("--base") + 1] : undefined;
const KEYS = { load: "sk-perch-bench-load", hello: "sk-perch-bench-hello" };

/** `"Hello there."`'s first byte `runs` times, one after another, with the statuses seen. */
async function hellos(url: string, runs: number) {
  const ms: number[] = [];
  const statuses: Record<string, number> = {};
  for (let i = 0; i < runs; i++) {
    const r = await helloFirstByte(url, KEYS.hello);
    statuses[r.status] = (statuses[r.status] ?? 0) + 1;
    if (r.ms !== undefined) ms.push(r.ms);
    await sleep(200);
  }
  const sorted = [...ms].sort((a, b) => a - b);
  return { first_byte_ms_p50: ms.length ? round(sorted[Math.floor(sorted.length / 2)]!) : null, answered: ms.length, runs, statuses };
}

/** The mixed phase: the server under a Compatible API crowd. */
async function mixedBench(): Promise<unknown> {
  const dir = mkdtempSync(join(tmpdir(), "perch-bench-speech-"));
  const keys = Object.entries(KEYS).map(([name, key]) => ({ name, sha256: createHash("sha256").update(key).digest("hex") }));
  const server = await startServer({ PERCH_DATA_DIR: dir, ...benchConfig(dir, { api_keys: keys }) });
  const pid = server.child.pid!;
  try {
    const speech = createSpeechEngine({ concurrency: 1 });
    const talk = await speech.speak(LONG_TEXT.slice(0, 340), "echo");
    const upload = wavFile(Float32Array.from(talk.samples, (x) => x / 32768));
    // Warm-up: flite compiled, the recogniser loaded.
    await (await speechRequest(server.url, KEYS.load, "Ready.")).arrayBuffer();
    await (await transcriptionRequest(server.url, KEYS.load, upload)).arrayBuffer();
    const quiet = await hellos(server.url, RUNS);

    // CPU per request, four at once.
    let cpu = treeCpuSeconds(pid);
    await Promise.all(Array.from({ length: 4 }, async () => (await speechRequest(server.url, KEYS.load, LONG_TEXT)).arrayBuffer()));
    const perSpeech = (treeCpuSeconds(pid) - cpu) / 4;
    cpu = treeCpuSeconds(pid);
    await Promise.all(Array.from({ length: 4 }, async () => (await transcriptionRequest(server.url, KEYS.load, upload)).arrayBuffer()));
    const perTranscription = (treeCpuSeconds(pid) - cpu) / 4;

    const stalled = Array.from({ length: 18 }, () => nonReader(server.url, KEYS.load));
    await sleep(2000);
    const besideNonReaders = await hellos(server.url, RUNS);
    for (const s of stalled) s.destroy();
    await sleep(1000);

    const synthesis = loop(8, (signal) => speechRequest(server.url, KEYS.load, LONG_TEXT, signal));
    const files = loop(2, (signal) => transcriptionRequest(server.url, KEYS.load, upload, signal));
    await sleep(2000);
    const besideReaders = await hellos(server.url, RUNS);
    const [speechReport, fileReport] = await Promise.all([synthesis.stop(), files.stop()]);
    return {
      hello_there_quiet: quiet,
      hello_there_beside_18_non_readers: besideNonReaders,
      hello_there_beside_8_long_speech_and_2_transcription_clients: { ...besideReaders, load: { speech: speechReport, transcription: fileReport } },
      server_cpu_seconds_per_request: { speech_4096_characters_mp3: round(perSpeech), transcription_20_s: round(perTranscription) },
      goal: { hello_there_first_byte_ms_beside_18_non_readers: "≤ 300 p50" },
    };
  } finally {
    await server.stop();
  }
}

export async function speechBench(): Promise<unknown> {
  const mixed = PHASES.has("mixed") ? await mixedBench() : undefined;
  const alone = PHASES.has("alone") ? await aloneBench(BASE) : undefined;
  if (!PHASES.has("engines")) return { suite: "speech", cpus: availableParallelism(), load_average: loadavg().map(round), mixed, alone };
  const words = SENTENCE.split(" ").length;
  if (words !== 30) throw new Error(`the benchmark sentence has ${words} words`);
  const speech = createSpeechEngine();
  const warmUpStarted = performance.now();
  await speech.warmUp();
  const warmUpMs = performance.now() - warmUpStarted;

  const timeSynthesis = async (voice: string, format: (typeof SPEECH_FORMATS)[number]) => {
    const first: number[] = [];
    const total: number[] = [];
    let bytes = 0;
    for (let i = 0; i < RUNS; i++) {
      const started = performance.now();
      let firstByte = 0;
      bytes = 0;
      for await (const chunk of speech.synthesize({ text: SENTENCE, voice, format, speed: 1 })) {
        if (bytes === 0) firstByte = performance.now() - started;
        bytes += chunk.length;
      }
      first.push(firstByte);
      total.push(performance.now() - started);
    }
    return { first_byte_ms: { p50: percentiles(first).p50, max: round(Math.max(...first)) }, total_ms: { p50: percentiles(total).p50 }, bytes };
  };

  const synthesis: Record<string, Record<string, unknown>> = {};
  for (const voice of ["alloy", "nova"]) {
    synthesis[voice] = {};
    for (const format of SPEECH_FORMATS) synthesis[voice][format] = await timeSynthesis(voice, format);
  }

  const recogniser = createTranscriptionEngine();
  const loadStarted = performance.now();
  await recogniser.start();
  const loadMs = performance.now() - loadStarted;

  // Per voice: time to first byte (mp3) and the round trip through the recogniser.
  const voices: Record<string, unknown> = {};
  const roundTripText = SENTENCES.join(" ");
  for (const [voice, flite] of Object.entries(VOICES)) {
    const timing = await timeSynthesis(voice, "mp3");
    const wav = await bytesOf(speech.synthesize({ text: roundTripText, voice, format: "wav", speed: 1 }));
    const heard = await recogniser.transcribe({ audio: wav });
    voices[voice] = {
      flite_voice: flite.name,
      ...(flite.features ? { features: flite.features } : {}),
      first_byte_ms: timing.first_byte_ms,
      round_trip_wer: round(wordErrorRate(roundTripText, heard.text)),
    };
  }

  // espeak-ng: the ten sentences half a second apart, per voice.
  const sets: Array<{ name: string; clean: Float32Array; noisy: Float32Array }> = [];
  for (const v of ESPEAK_VOICES) {
    const parts: Float32Array[] = [silence(0.5)];
    for (const s of SENTENCES) parts.push(await espeak(s, v.args), silence(0.5));
    const clean = concatFloat32(parts);
    sets.push({ name: v.name, clean, noisy: withNoise(clean, SNR_DB) });
  }
  const werOf = async (audio: Float32Array) => wordErrorRate(roundTripText, (await recogniser.transcribe({ audio: wavFile(audio) })).text);
  const accuracy: Record<string, unknown> = {};
  let cleanSum = 0;
  let noisySum = 0;
  for (const set of sets) {
    const clean = await werOf(set.clean);
    const noisy = await werOf(set.noisy);
    cleanSum += clean;
    noisySum += noisy;
    accuracy[set.name] = { clean: round(clean), noisy: round(noisy) };
  }

  // Real-time factor: wall time over audio duration, one at a time, then four at once.
  const files = sets.map((s) => wavFile(s.clean));
  const audioSeconds = sets.reduce((n, s) => n + s.clean.length / 16_000, 0);
  const sequential: number[] = [];
  for (let r = 0; r < 2; r++) {
    const started = performance.now();
    for (const f of files) await recogniser.transcribe({ audio: f });
    sequential.push((performance.now() - started) / 1000 / audioSeconds);
  }
  const concurrent = createTranscriptionEngine({ concurrency: 4, maxQueued: 4 });
  await concurrent.start();
  const four = [...files, ...files];
  const concurrentStarted = performance.now();
  await Promise.all(four.map((f) => concurrent.transcribe({ audio: f })));
  const concurrentRtf = (performance.now() - concurrentStarted) / 1000 / (audioSeconds * 2);
  await concurrent.close();

  // End of turn: a 2 s utterance, as a conversation feeds it.
  const endOfTurn: number[] = [];
  const coldFinish: number[] = [];
  let utteranceSeconds = 0;
  let heardText = "";
  const utteranceText = "Turn on the kitchen lights.";
  for (const v of ESPEAK_VOICES) {
    const utterance = await espeak(utteranceText, v.args);
    utteranceSeconds = utterance.length / 16_000;
    for (let r = 0; r < 3; r++) {
      const asr = recogniser.createIncrementalRecogniser();
      // 20 ms packets; a conversation asks for a partial every 0.5 s of audio and does not wait for it.
      for (let at = 0; at < utterance.length; at += 320) {
        asr.push(utterance.subarray(at, at + 320));
        if (at % 8000 < 320) void asr.partial().catch(() => {});
        await setImmediate();
      }
      // The turn detector reports the end of speech after 300 ms of silence, arriving in real time.
      for (let i = 0; i < 15; i++) {
        asr.push(silence(0.02));
        await sleep(20);
      }
      const started = performance.now();
      heardText = await asr.finish();
      endOfTurn.push(performance.now() - started);
      const cold = recogniser.createIncrementalRecogniser();
      cold.push(utterance);
      const coldStarted = performance.now();
      await cold.finish();
      coldFinish.push(performance.now() - coldStarted);
    }
  }

  const pids = recogniser.pids();
  const memory = {
    recogniser_process_rss_mb: pids.recogniser.map(rssMb)[0],
    vad_process_rss_mb: pids.vad.map(rssMb)[0],
    server_process_rss_mb: round(process.memoryUsage().rss / 1024 / 1024),
  };
  await recogniser.close();

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
    voices,
    mixed,
    alone,
    transcription: {
      engine: "moonshine base int8 + silero vad v5 (onnxruntime-node, cpu)",
      load_ms: round(loadMs),
      memory,
      espeak_sentences: SENTENCES.length,
      audio_seconds: round(audioSeconds),
      word_error_rate: { clean: round(cleanSum / sets.length), noisy: round(noisySum / sets.length), noise: `white, ${SNR_DB} dB SNR`, per_voice: accuracy },
      real_time_factor: { one_at_a_time: percentiles(sequential).p50, four_concurrent: round(concurrentRtf) },
      end_of_turn_ms: {
        utterance_seconds: round(utteranceSeconds),
        after_partials: { p50: percentiles(endOfTurn).p50, max: round(Math.max(...endOfTurn)) },
        cold: { p50: percentiles(coldFinish).p50, max: round(Math.max(...coldFinish)) },
        text: heardText,
      },
      goals: { wer_clean: 0.08, wer_noisy: 0.15, real_time_factor: 0.1, end_of_turn_ms: 150 },
    },
  };
}
