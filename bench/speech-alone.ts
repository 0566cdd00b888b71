/**
 * The speech bench's "alone" phase (issue 40): a file on an idle node, and a conversation's turns
 * beside a long file, for this checkout and, with `--base <commit>`, for that commit (a detached
 * worktree made for the run and removed after it) in the same run, one after the other.
 *
 * - RTF (wall time over audio time) of a 60 s and a 10 min file sent to
 *   `/openai/v1/audio/transcriptions` of a fresh `perch serve` (HTTP included), one at a time,
 *   the node's default recogniser processes; the server's CPU seconds per file.
 * - A conversation turn's transcript latency while a 10 min file is transcribed (in this process,
 *   on the checkout's engine: a turn needs no HTTP to meet the file in the recogniser): a 1.5–2 s
 *   utterance with 300 ms of silence after it, then `finish()` timed with
 *   `voice.max_reply_delay_ms` as its budget, a turn every 2.5 s. "After idle": the conversation
 *   counts as going on for 1 s only, so every turn finds the file on every process (the worst
 *   case: it waits for one job); "in a conversation": the default minute, one process kept.
 *   Whether the file's words equal those it gets alone is reported too.
 *
 * The audio is made offline by espeak-ng: the bench's ten sentences in two voices, 0.5 s apart
 * (58 s), clean and with white noise at 20 dB SNR, repeated to 10 minutes.
 */
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, realpathSync, rmSync, symlinkSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { concatFloat32 } from "../src/audio/samples.ts";
import { VoiceConfig } from "../src/config/schema.ts";
import { defaultRecogniserProcesses, thisMachine } from "../src/node/recogniser-processes.ts";
import { ESPEAK_VOICES, espeak, ROUND_TRIP_SENTENCES as SENTENCES, silence, wavFile, withNoise, wordErrorRate } from "../test/support/speech.ts";
import { transcriptionRequest } from "./api-load.ts";
import { benchConfig, percentiles, ROOT, round, startServer, treeCpuSeconds } from "./support.ts";

const RUNS_60_S = Number(process.env.BENCH_SPEECH_ALONE_RUNS ?? 3);
const TURNS = Number(process.env.BENCH_SPEECH_ALONE_TURNS ?? 8);
const TURN_EVERY_MS = 2_500;
const KEY = "sk-perch-bench-alone";
const RATE = 16_000;
/** Real-time factors to three places (they are around 0.05). */
const rtf3 = (x: number) => Math.round(x * 1000) / 1000;
const TURN_TEXTS = ["Turn on the kitchen lights.", "What time is it in Tokyo?", "Set a timer for ten minutes.", "Play some music, please."];

interface Audio {
  minute: Float32Array;
  minuteText: string;
  tenMinutes: Float32Array;
  turns: Float32Array[];
}

async function makeAudio(): Promise<Audio> {
  const sets: Float32Array[] = [];
  for (const v of ESPEAK_VOICES) {
    const parts: Float32Array[] = [silence(0.5)];
    for (const s of SENTENCES) parts.push(await espeak(s, v.args), silence(0.5));
    sets.push(concatFloat32(parts));
  }
  const minute = concatFloat32(sets);
  const noisy = withNoise(minute, 20);
  const long: Float32Array[] = [];
  for (let n = 0, i = 0; n < 600 * RATE; i++) {
    const part = i % 2 === 0 ? minute : noisy;
    long.push(part.subarray(0, Math.min(part.length, 600 * RATE - n)));
    n += long.at(-1)!.length;
  }
  const turns = await Promise.all(TURN_TEXTS.map((t, i) => espeak(t, ESPEAK_VOICES[i % 2]!.args)));
  return { minute, minuteText: [...SENTENCES, ...SENTENCES].join(" "), tenMinutes: concatFloat32(long), turns };
}

/** A checkout of `commit` beside this one (node_modules shared), removed by `remove`. */
function worktree(commit: string): { root: string; remove(): void } {
  const dir = mkdtempSync(join(tmpdir(), "perch-bench-base-"));
  execFileSync("git", ["-C", ROOT, "worktree", "add", "--detach", dir, commit], { stdio: "ignore" });
  symlinkSync(realpathSync(join(ROOT, "node_modules")), join(dir, "node_modules"));
  return {
    root: `${dir}/`,
    remove: () => {
      execFileSync("git", ["-C", ROOT, "worktree", "remove", "--force", dir], { stdio: "ignore" });
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** RTF of the files over HTTP on a fresh server of the checkout at `root`. */
async function overHttp(root: string, audio: Audio) {
  const dir = mkdtempSync(join(tmpdir(), "perch-bench-alone-"));
  const keys = [{ name: "alone", sha256: createHash("sha256").update(KEY).digest("hex") }];
  const server = await startServer({ PERCH_DATA_DIR: dir, ...benchConfig(dir, { api_keys: keys }) }, root);
  try {
    await server.settled();
    const pid = server.child.pid!;
    const send = async (samples: Float32Array) => {
      const cpu = treeCpuSeconds(pid);
      const started = performance.now();
      const response = await transcriptionRequest(server.url, KEY, wavFile(samples));
      const body = (await response.json()) as { text?: string };
      if (response.status !== 200) throw new Error(`transcription answered ${response.status}: ${JSON.stringify(body)}`);
      return { rtf: (performance.now() - started) / 1000 / (samples.length / RATE), cpu: treeCpuSeconds(pid) - cpu, text: body.text ?? "" };
    };
    // Warm-up: the first request's decoders and the models' first run.
    await send(audio.turns[0]!);
    const minute: Array<{ rtf: number; cpu: number; text: string }> = [];
    for (let i = 0; i < RUNS_60_S; i++) minute.push(await send(audio.minute));
    const long = await send(audio.tenMinutes);
    return {
      minute: {
        audio_seconds: round(audio.minute.length / RATE),
        real_time_factor: { p50: rtf3([...minute].sort((a, b) => a.rtf - b.rtf)[Math.floor(minute.length / 2)]!.rtf), runs: minute.map((m) => rtf3(m.rtf)) },
        server_cpu_seconds: round(minute.reduce((n, m) => n + m.cpu, 0) / minute.length),
        word_error_rate: round(wordErrorRate(audio.minuteText, minute[0]!.text)),
        same_words_every_run: minute.every((m) => m.text === minute[0]!.text),
      },
      ten_minutes: { audio_seconds: round(audio.tenMinutes.length / RATE), real_time_factor: rtf3(long.rtf), server_cpu_seconds: round(long.cpu) },
      long_text: long.text,
    };
  } finally {
    await server.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

interface Engine {
  start(): Promise<void>;
  close(): Promise<void>;
  transcribe(o: { audio: Uint8Array }): Promise<{ text: string }>;
  createIncrementalRecogniser(): { push(pcm: Float32Array): void; finish(o?: { maxWaitMs?: number }): Promise<string> };
}

/** Turns beside the 10 min file, on the engine of the checkout at `root`. */
async function turnsBesideFile(root: string, audio: Audio, conversingForMs: number | undefined, aloneText: string) {
  const { createTranscriptionEngine } = (await import(`${root}src/ai/speech/index.ts`)) as { createTranscriptionEngine(o: object): Engine };
  const budget = VoiceConfig.parse({}).max_reply_delay_ms;
  const engine = createTranscriptionEngine({
    processes: defaultRecogniserProcesses(thisMachine()),
    fastAfterMs: false,
    ...(conversingForMs !== undefined ? { conversingForMs } : {}),
  });
  try {
    await engine.start();
    await engine.transcribe({ audio: wavFile(audio.turns[0]!) });
    let done = false;
    const started = performance.now();
    const file = engine.transcribe({ audio: wavFile(audio.tenMinutes) }).finally(() => {
      done = true;
    });
    const latencies: number[] = [];
    const refused: string[] = [];
    let heard = 0;
    // The file's decoding and voice activity first: turns meet its recognition.
    await sleep(TURN_EVERY_MS);
    for (let i = 0; i < TURNS && !done; i++) {
      const asr = engine.createIncrementalRecogniser();
      const utterance = audio.turns[i % audio.turns.length]!;
      asr.push(utterance);
      for (let q = 0; q < 15; q++) {
        asr.push(silence(0.02));
        await sleep(20);
      }
      const asked = performance.now();
      try {
        const text = await asr.finish({ maxWaitMs: budget });
        latencies.push(performance.now() - asked);
        if (wordErrorRate(TURN_TEXTS[i % TURN_TEXTS.length]!, text) <= 0.5) heard++;
      } catch (error) {
        refused.push(error instanceof Error ? error.message : String(error));
      }
      await sleep(Math.max(0, TURN_EVERY_MS - (performance.now() - asked) - 300));
    }
    const { text } = await file;
    const wall = (performance.now() - started) / 1000;
    const sorted = [...latencies].sort((a, b) => a - b);
    return {
      turns: latencies.length + refused.length,
      transcript_ms: { p50: latencies.length ? percentiles(latencies).p50 : null, max: sorted.length ? round(sorted.at(-1)!) : null },
      within_max_reply_delay: `${latencies.filter((ms) => ms <= budget).length} of ${latencies.length + refused.length}`,
      refused: refused.length,
      turns_heard: heard,
      file_real_time_factor: rtf3(wall / (audio.tenMinutes.length / RATE)),
      file_same_words_as_alone: text === aloneText,
    };
  } finally {
    await engine.close();
  }
}

async function measure(root: string, audio: Audio) {
  const loadBefore = loadavg().map(round);
  const http = await overHttp(root, audio);
  const afterIdle = await turnsBesideFile(root, audio, 1_000, http.long_text);
  const inConversation = await turnsBesideFile(root, audio, undefined, http.long_text);
  return {
    load_average: { before: loadBefore, after: loadavg().map(round) },
    file_alone_60_s: http.minute,
    file_alone_10_min: http.ten_minutes,
    turns_beside_10_min_file: { after_idle: afterIdle, in_a_conversation: inConversation },
  };
}

/** The phase: this checkout, and `base` (a commit) before it when given. */
export async function aloneBench(base: string | undefined): Promise<unknown> {
  const audio = await makeAudio();
  const out: Record<string, unknown> = {
    goal: {
      real_time_factor: "≤ 0.10 wall, HTTP included",
      turn_transcript_ms: `≤ voice.max_reply_delay_ms (${VoiceConfig.parse({}).max_reply_delay_ms}) every time`,
    },
    recogniser_processes: defaultRecogniserProcesses(thisMachine()),
  };
  if (base) {
    const tree = worktree(base);
    try {
      if (!existsSync(join(tree.root, "bin/perch"))) throw new Error(`no bin/perch at ${base}`);
      out.before = { commit: execFileSync("git", ["-C", tree.root, "rev-parse", "--short", "HEAD"]).toString().trim(), ...(await measure(tree.root, audio)) };
    } finally {
      tree.remove();
    }
  }
  out.after = { commit: execFileSync("git", ["-C", ROOT, "rev-parse", "--short", "HEAD"]).toString().trim(), ...(await measure(ROOT, audio)) };
  if (out.before) {
    const rtf = (side: unknown, key: "file_alone_60_s" | "file_alone_10_min") => {
      const figure = (side as Record<string, { real_time_factor: number | { p50: number } }>)[key]!.real_time_factor;
      return typeof figure === "number" ? figure : figure.p50;
    };
    out.ratio_after_over_before = {
      rtf_60_s: round(rtf(out.after, "file_alone_60_s") / rtf(out.before, "file_alone_60_s")),
      rtf_10_min: round(rtf(out.after, "file_alone_10_min") / rtf(out.before, "file_alone_10_min")),
    };
  }
  return out;
}
