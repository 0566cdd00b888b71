/**
 * `npm run bench -- voice`: voice conversations end to end. A scripted upstream (its own process),
 * `perch serve`, and devices on `@roamhq/wrtc` in separate processes speaking a synthesised
 * question. Figures: end of speech → first reply packet at the server (`turn.metrics`) and at the
 * device (last voiced sample sent → first audible sample heard), for 1 conversation and for 20
 * concurrent ones taking turns; barge-in (speech onset → reply paused at the device; → last reply packet sent, from the server's
 * EOS stamp; and → last reply sample heard); the share of downlink frames sent late; the server's
 * CPU and memory per conversation. A mixed phase (issue 24): BENCH_VOICE_MIXED_CONVERSATIONS (1)
 * conversations taking turns while BENCH_VOICE_MIXED_API (8) Compatible API clients loop on
 * 4,096-character speech and BENCH_VOICE_MIXED_FILES (2) loop on transcribing a 20 s file; a turn
 * with no reply within 60 s counts as an error. A memory phase (issue 38, bench/memory.ts): the first
 * turn with memory on versus off, and the memory rewrites a second one node sustains.
 *
 * `--engines provider`: the same phases with recognition and synthesis on a second `perch serve`
 * (its embedded engines on its Compatible API) as an `openai-compatible` provider, behind a timing
 * proxy: the provider's own time to first byte and CPU are reported apart from the node's.
 *
 * Phase `taking` (bench/voice-turns.ts): turn-taking (voice.md §7) before and after, side by side.
 * Phase `barge-ab` (bench/voice-barge.ts): barge-in (onset → reply paused at the device) before, after and
 * after with audio threads off, side by side.
 *
 * BENCH_VOICE_TURNS (default 8), BENCH_VOICE_CONVERSATIONS (20), BENCH_VOICE_PROCESSES (4),
 * BENCH_VOICE_PHASES (default "one,crowd,mixed,barge,taking": the phases to run), BENCH_VOICE_STAGGER_MS
 * (the 20 conversations start this far apart, one after another across the device processes;
 * unset: each process starts its devices 150 ms apart, the processes at once, so about 4 at a time).
 */
import { type ChildProcess, fork, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { availableParallelism, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { createSpeechEngine } from "../src/ai/speech/index.ts";
import { loadResampler, Resampler } from "../src/audio/resampler.ts";
import { wavFile } from "../src/audio/samples.ts";
import { LONG_TEXT, loop, speechRequest, transcriptionRequest } from "./api-load.ts";
import { firstTurnWithMemory, rewriteRates, withMemoryAgent } from "./memory.ts";
import { benchConfig, ROOT, round, type Server, startServer, treeCpuSeconds } from "./support.ts";
import { startTimingProxy, type Timing } from "./timing-proxy.ts";
import { bargeFigures, bargeSideBySide } from "./voice-barge.ts";
import type { BargeReport, DeviceMessage, TurnReport } from "./voice-device.ts";
import { realtimeVoiceBench } from "./voice-realtime.ts";
import { turnTaking } from "./voice-turns.ts";

const TURNS = Number(process.env.BENCH_VOICE_TURNS ?? 8);
const CONVERSATIONS = Number(process.env.BENCH_VOICE_CONVERSATIONS ?? 20);
const PROCESSES = Number(process.env.BENCH_VOICE_PROCESSES ?? 4);
const MIXED_CONVERSATIONS = Number(process.env.BENCH_VOICE_MIXED_CONVERSATIONS ?? 1);
const MIXED_API = Number(process.env.BENCH_VOICE_MIXED_API ?? 8);
const MIXED_FILES = Number(process.env.BENCH_VOICE_MIXED_FILES ?? 2);
const STAGGER_MS = process.env.BENCH_VOICE_STAGGER_MS === undefined ? undefined : Number(process.env.BENCH_VOICE_STAGGER_MS);
const PHASES = new Set((process.env.BENCH_VOICE_PHASES ?? "one,crowd,mixed,barge,memory,taking").split(","));
const QUESTION = "What is the weather like today?";
const API_KEY = "sk-perch-bench-voice";
/** `--engines provider`: both engines on a second Perch; `embedded` (the default): the node's own; `realtime`: bench/voice-realtime.ts. */
const ENGINES = engines();
const SPEECH_NODE_KEY = "sk-bench-speech-node";

function engines(): "embedded" | "provider" | "realtime" {
  const at = process.argv.indexOf("--engines");
  if (at < 0) return "embedded";
  const value = process.argv[at + 1];
  if (value !== "embedded" && value !== "provider" && value !== "realtime") throw new Error(`--engines takes embedded, provider or realtime, not ${value}`);
  return value;
}

export function pct(samples: number[]): { p50: number; p95: number; n: number } {
  const s = [...samples].sort((a, b) => a - b);
  const at = (q: number) => round(s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? Number.NaN);
  return { p50: at(0.5), p95: at(0.95), n: s.length };
}

export function rssMb(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  return round(Number(/^VmRSS:\s+(\d+)/m.exec(status)?.[1] ?? Number.NaN) / 1024);
}

export async function metric(server: Server, name: string, labels = ""): Promise<number> {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(labels ? `${name}{${labels}} ` : `${name} `));
  return Number(line?.split(" ").at(-1) ?? 0);
}

/** The recogniser's queue (engine metrics, absent before issue 24): jobs started, their mean wait and those run on the fast model, per class. */
async function recognitionQueue(server: Server): Promise<Record<string, { jobs: number; waited_s: number; degraded: number }>> {
  const out: Record<string, { jobs: number; waited_s: number; degraded: number }> = {};
  for (const cls of ["conversation", "api", "partial"]) {
    const labels = `engine="recognition",class="${cls}"`;
    out[cls] = {
      jobs: await metric(server, "perch_engine_jobs_total", labels),
      waited_s: await metric(server, "perch_engine_queue_wait_seconds_total", labels),
      degraded: await metric(server, "perch_engine_degraded_total", labels),
    };
  }
  return out;
}

/** Turns by result (answered, empty, interrupted, failed) and conversation jobs refused as overloaded, per engine. */
async function outcomes(server: Server): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const result of ["answered", "empty", "interrupted", "failed"]) out[result] = await metric(server, "perch_voice_turns_total", `result="${result}"`);
  for (const engine of ["recognition", "speech"])
    out[`${engine}_refused`] = await metric(server, "perch_engine_refused_total", `engine="${engine}",class="conversation"`);
  return out;
}

function outcomeDelta(before: Record<string, number>, after: Record<string, number>): Record<string, number> {
  return Object.fromEntries(Object.entries(after).map(([k, v]) => [k, v - (before[k] ?? 0)]));
}

type QueueFigures = Record<string, { jobs: number; waited_s: number; degraded: number }>;

function queueDelta(before: QueueFigures, after: QueueFigures) {
  const out: Record<string, { jobs: number; mean_wait_ms: number; on_fast_model: number }> = {};
  for (const [cls, a] of Object.entries(after)) {
    const jobs = a.jobs - (before[cls]?.jobs ?? 0);
    out[cls] = {
      jobs,
      mean_wait_ms: round(((a.waited_s - (before[cls]?.waited_s ?? 0)) / Math.max(1, jobs)) * 1000),
      on_fast_model: a.degraded - (before[cls]?.degraded ?? 0),
    };
  }
  return out;
}

/** Runs `total` devices over `processes` processes; collects their reports. */
export async function devices(
  server: Server,
  file: string,
  total: number,
  processes: number,
  mode: "turns" | "barge" | "filler",
  turns: number,
  env: Record<string, string> = {},
): Promise<DeviceMessage[]> {
  const reports: DeviceMessage[] = [];
  const children: ChildProcess[] = [];
  const per = Math.ceil(total / processes);
  for (let p = 0, left = total; p < processes && left > 0; p++, left -= per) {
    const child = fork(join(ROOT, "bench/voice-device.ts"), [], {
      execArgv: ["--import", "tsx"],
      env: {
        ...process.env,
        PERCH_URL: server.url,
        QUESTION_FILE: file,
        DEVICES: String(Math.min(per, left)),
        TURNS: String(turns),
        MODE: mode,
        ...env,
        // Staggered: process p's devices are the p-th, (p + processes)-th, … to start.
        ...(STAGGER_MS !== undefined ? { START_OFFSET_MS: String(p * STAGGER_MS), START_DELAY_MS: String(processes * STAGGER_MS) } : {}),
      },
      stdio: ["ignore", "inherit", "inherit", "ipc"],
    });
    children.push(child);
  }
  await Promise.all(
    children.map(
      (child) =>
        new Promise<void>((resolve) => {
          child.on("message", (m: DeviceMessage) => {
            if (m.type === "done") resolve();
            else if (m.type !== "ready") reports.push(m);
          });
          child.once("exit", () => resolve());
        }),
    ),
  );
  for (const c of children) if (c.exitCode === null) c.kill();
  return reports;
}

export function turnFigures(reports: DeviceMessage[]) {
  const turns = reports.filter((r): r is TurnReport => r.type === "turn");
  const server = turns.map((t) => t.server.speech_to_audio).filter((x): x is number => typeof x === "number");
  const stage = (k: string) => pct(turns.map((t) => t.server[k]).filter((x): x is number => typeof x === "number"));
  return {
    turns: turns.length,
    errors: reports.filter((r) => r.type === "error").map((r) => (r as { message: string }).message),
    server_speech_to_audio_ms: pct(server),
    server_beyond_silence_ms: pct(server.map((x) => x - 400)),
    device_speech_to_audio_ms: pct(turns.map((t) => t.device_ms).filter((x): x is number => typeof x === "number")),
    model_stopped_to_heard_ms: pct(turns.map((t) => t.stopped_to_heard_ms).filter((x): x is number => typeof x === "number")),
    stages_ms: {
      end_of_speech: stage("end_of_speech"),
      transcription: stage("transcription"),
      first_token: stage("first_token"),
      first_audio: stage("first_audio"),
    },
  };
}

export async function voiceBench(): Promise<unknown> {
  if (PHASES.size === 1 && PHASES.has("memory-rewrites")) return memoryRewritesOnly();
  if (ENGINES === "realtime") return await realtimeVoiceBench(() => pipelineBench("provider", new Set(["one", "crowd"])));
  return await pipelineBench(ENGINES, PHASES);
}

/** Turn an utterance into the devices' question file (48 kHz PCM), in `dir`. */
export async function questionFile(dir: string): Promise<string> {
  const speech = createSpeechEngine();
  const spoken = await speech.speak(QUESTION, "nova");
  const up = new Resampler(await loadResampler(), spoken.sampleRate, 48_000);
  const padded = new Int16Array(spoken.samples.length + spoken.sampleRate / 10);
  padded.set(spoken.samples);
  const pcm = up.process(padded);
  up.close();
  const file = join(dir, "question.pcm");
  writeFileSync(file, Buffer.from(pcm.buffer, pcm.byteOffset, pcm.byteLength));
  return file;
}

/** The recogniser → model → speech pipeline (voice.md §2, §5) with `engines`, the phases in `phases`. */
async function pipelineBench(ENGINES: "embedded" | "provider", PHASES: ReadonlySet<string>): Promise<unknown> {
  const dir = mkdtempSync(join(tmpdir(), "perch-bench-voice-"));
  // The question, spoken by another voice than the reply's, as the devices' microphones give it.
  const speech = createSpeechEngine();
  const spoken = await speech.speak(QUESTION, "nova");
  const up = new Resampler(await loadResampler(), spoken.sampleRate, 48_000);
  const padded = new Int16Array(spoken.samples.length + spoken.sampleRate / 10);
  padded.set(spoken.samples);
  const pcm = up.process(padded);
  up.close();
  const file = join(dir, "question.pcm");
  writeFileSync(file, Buffer.from(pcm.buffer, pcm.byteOffset, pcm.byteLength));
  // The transcription clients' file: 20 s of speech.
  const talk = await speech.speak(LONG_TEXT.slice(0, 340), "echo");
  const upload = wavFile(talk.samples, talk.sampleRate);

  const upstream = spawn(process.execPath, ["--import", "tsx", join(ROOT, "bench/fake-upstream.ts")], { stdio: ["ignore", "pipe", "inherit"] });
  const upstreamUrl = await new Promise<string>((resolve) => upstream.stdout!.once("data", (d: Buffer) => resolve(d.toString().trim().split("\n")[0]!)));
  const machine = () => ({ cores: availableParallelism(), load_1m: round(loadavg()[0]!) });
  let taking: unknown;
  let bargeAb: unknown;
  try {
    taking = PHASES.has("taking") ? await turnTaking({ dir, upstreamUrl, question: file }) : undefined;
    bargeAb = PHASES.has("barge-ab") ? await bargeSideBySide({ dir, upstreamUrl, question: file }) : undefined;
  } catch (err) {
    upstream.kill();
    throw err;
  }
  if ([...PHASES].every((p) => p === "taking" || p === "barge-ab")) {
    upstream.kill();
    return { suite: "voice", machine: machine(), turn_taking: taking, barge_in_side_by_side: bargeAb };
  }
  const remote = ENGINES === "provider" ? await speechNode() : undefined;
  const server = await startServer({
    PERCH_DATA_DIR: dir,
    ...(remote ? { SPEECH_NODE_KEY } : {}),
    ...benchConfig(dir, {
      providers: [
        { id: "local", kind: "openai-compatible", base_url: upstreamUrl, max_retries: 0 },
        ...(remote ? [{ id: "speech-node", kind: "openai-compatible", base_url: `${remote.proxy.url}/openai/v1`, api_key_env: "SPEECH_NODE_KEY" }] : []),
      ],
      models: [
        { id: "chat", kind: "chat", provider: "local", upstream_model: "scripted" },
        ...(remote
          ? [
              { id: "remote-tts", kind: "speech", provider: "speech-node", upstream_model: "tts-1" },
              { id: "remote-stt", kind: "transcription", provider: "speech-node", upstream_model: "whisper-1" },
            ]
          : []),
      ],
      // The memory phase's agent beside it: the same, remembering.
      agents: withMemoryAgent({
        id: "talker",
        model: "chat",
        instructions: "Answer briefly.",
        voice: "alloy",
        ...(remote ? { speech_model: "remote-tts", transcription_model: "remote-stt" } : {}),
      }),
      voice: { agent: "talker" },
      api_keys: [{ name: "bench", sha256: createHash("sha256").update(API_KEY).digest("hex") }],
    }),
  });
  const pid = server.child.pid!;
  try {
    // Warm-up: models loaded, flite compiled.
    await devices(server, file, 1, 1, "turns", 2);

    const oneFrom = remote?.proxy.timings.length ?? 0;
    const one = PHASES.has("one") ? turnFigures(await devices(server, file, 1, 1, "turns", TURNS)) : undefined;
    const oneTimings = remote?.proxy.timings.slice(oneFrom) ?? [];

    let mixed: unknown;
    if (PHASES.has("mixed")) {
      const cpuBefore = treeCpuSeconds(pid);
      const outcomesBefore = await outcomes(server);
      const started = performance.now();
      const synthesis = loop(MIXED_API, (signal) => speechRequest(server.url, API_KEY, LONG_TEXT, signal));
      const files = loop(MIXED_FILES, (signal) => transcriptionRequest(server.url, API_KEY, upload, signal));
      // The API clients are under way before the first question.
      await new Promise((r) => setTimeout(r, 3000));
      const turns = turnFigures(await devices(server, file, MIXED_CONVERSATIONS, 1, "turns", Math.max(3, Math.round(TURNS / 2))));
      const [speechReport, fileReport] = await Promise.all([synthesis.stop(), files.stop()]);
      mixed = {
        conversations: MIXED_CONVERSATIONS,
        api_speech_clients: MIXED_API,
        api_transcription_clients: MIXED_FILES,
        ...turns,
        turn_results: outcomeDelta(outcomesBefore, await outcomes(server)),
        api_speech: speechReport,
        api_transcription: fileReport,
        seconds: round((performance.now() - started) / 1000),
        server_cpu_seconds: round(treeCpuSeconds(pid) - cpuBefore),
      };
    }

    const rssBefore = rssMb(pid);
    const cpuBefore = treeCpuSeconds(pid);
    const framesBefore = await metric(server, "perch_voice_frames_total");
    const lateBefore = await metric(server, "perch_voice_frames_late_total");
    const queueBefore = await recognitionQueue(server);
    const outcomesBefore = await outcomes(server);
    const started = performance.now();
    let peakRss = rssBefore;
    const sampler = setInterval(() => {
      peakRss = Math.max(peakRss, rssMb(pid));
    }, 500);
    const remoteCpuBefore = remote ? treeCpuSeconds(remote.node.child.pid!) : 0;
    const timingsBefore = remote?.proxy.timings.length ?? 0;
    const crowd = PHASES.has("crowd")
      ? turnFigures(await devices(server, file, CONVERSATIONS, PROCESSES, "turns", Math.max(3, Math.round(TURNS / 2))))
      : undefined;
    clearInterval(sampler);
    const seconds = (performance.now() - started) / 1000;
    const cpu = treeCpuSeconds(pid) - cpuBefore;
    const remoteCpu = remote ? treeCpuSeconds(remote.node.child.pid!) - remoteCpuBefore : 0;
    const crowdTimings = remote?.proxy.timings.slice(timingsBefore) ?? [];
    const frames = (await metric(server, "perch_voice_frames_total")) - framesBefore;
    const late = (await metric(server, "perch_voice_frames_late_total")) - lateBefore;
    const queue = queueDelta(queueBefore, await recognitionQueue(server));
    const turnOutcomes = outcomeDelta(outcomesBefore, await outcomes(server));

    const memory = PHASES.has("memory")
      ? {
          goals: { first_token_p50_difference_ms: "≤ 5", rewrites_per_second: "≥ 200 on SQLite and PostgreSQL" },
          first_turn: await firstTurnWithMemory(server.url, { PERCH_DATA_DIR: dir, PERCH_CONFIG: join(dir, "bench.json") }, (key, turns) =>
            devices(server, file, 1, 1, "turns", turns, { PRIVATE_KEYS: key }),
          ),
          rewrites: await rewriteRates(upstreamUrl),
        }
      : undefined;

    const barge = PHASES.has("barge") ? (await devices(server, file, 1, 1, "barge", Math.max(3, Math.round(TURNS / 2)))).filter((r) => r.type === "barge") : [];
    return {
      suite: "voice",
      engines: ENGINES,
      ...(remote
        ? {
            provider: {
              one_conversation: providerFigures(oneTimings, one?.stages_ms.first_audio.p50 ?? Number.NaN),
              concurrent: {
                ...providerFigures(crowdTimings, crowd?.stages_ms.first_audio.p50 ?? Number.NaN),
                provider_cpu_percent_per_conversation: round(((remoteCpu / seconds) * 100) / CONVERSATIONS),
              },
              goals: { perch_overhead_on_speech_ttfb_ms: "≤ 50 p50", node_cpu_percent_per_conversation: "≤ 1" },
            },
          }
        : {}),
      machine: machine(),
      turn_taking: taking,
      goals: {
        server_beyond_silence_ms: "≤ 200 p50, ≤ 350 p95",
        device_speech_to_audio_ms: "≤ 700 p50",
        barge_in_ms: "≤ 250 p50",
        late_frames_20_conversations: "< 1 %",
        device_speech_to_audio_ms_20_conversations: "≤ 700 p50, ≤ 1200 p95",
        device_speech_to_audio_ms_beside_8_api_clients: "≤ 1000 p50",
      },
      one_conversation: one,
      mixed,
      concurrent: {
        conversations: CONVERSATIONS,
        device_processes: PROCESSES,
        start_stagger_ms: STAGGER_MS ?? "150 ms apart in each device process, the processes at once",
        ...crowd,
        frames_sent: frames,
        frames_late: late,
        late_share_percent: round((late / Math.max(1, frames)) * 100),
        recognition_queue: queue,
        turn_results: turnOutcomes,
        server_cpu_percent_per_conversation: round(((cpu / seconds) * 100) / CONVERSATIONS),
        server_rss_mb: { before: rssBefore, peak: peakRss, per_conversation: round((peakRss - rssBefore) / CONVERSATIONS) },
      },
      memory,
      barge_in: bargeFigures(barge.filter((b): b is BargeReport => b.type === "barge")),
      barge_in_side_by_side: bargeAb,
      server_warnings: { count: server.warnings.count, last: server.warnings.last },
    };
  } finally {
    await server.stop();
    upstream.kill();
    await remote?.proxy.close();
    await remote?.node.stop();
  }
}

/** `BENCH_VOICE_PHASES=memory-rewrites`: the memory phase's rewrites a second alone (no devices). */
async function memoryRewritesOnly(): Promise<unknown> {
  const upstream = spawn(process.execPath, ["--import", "tsx", join(ROOT, "bench/fake-upstream.ts")], { stdio: ["ignore", "pipe", "inherit"] });
  try {
    const upstreamUrl = await new Promise<string>((resolve) => upstream.stdout!.once("data", (d: Buffer) => resolve(d.toString().trim().split("\n")[0]!)));
    return { suite: "voice", machine: { cores: availableParallelism(), load_1m: round(loadavg()[0]!) }, memory: { rewrites: await rewriteRates(upstreamUrl) } };
  } finally {
    upstream.kill();
  }
}

/** The speech node: a second `perch serve` whose embedded engines answer on its Compatible API, behind the timing proxy. */
async function speechNode(): Promise<{ node: Server; proxy: Awaited<ReturnType<typeof startTimingProxy>> }> {
  const dir = mkdtempSync(join(tmpdir(), "perch-bench-speech-node-"));
  const sha256 = createHash("sha256").update(SPEECH_NODE_KEY).digest("hex");
  const node = await startServer({
    PERCH_DATA_DIR: dir,
    PERCH_NODE_NAME: "speech-node",
    ...benchConfig(dir, { webrtc: { enabled: false }, api_keys: [{ name: "front", sha256, models: ["tts-1", "whisper-1"] }] }),
  });
  return { node, proxy: await startTimingProxy(node.url) };
}

/** The provider's own times (at the proxy) and what Perch adds to the speech's first byte before the device's first packet leaves. */
function providerFigures(timings: Timing[], firstAudioP50: number) {
  const ok = timings.filter((t) => t.status === 200);
  const speech = ok.filter((t) => t.path.endsWith("/audio/speech"));
  const transcription = ok.filter((t) => t.path.endsWith("/audio/transcriptions"));
  const ttfb = pct(speech.map((t) => t.firstByteMs));
  return {
    requests: { speech: speech.length, transcription: transcription.length, failed: timings.length - ok.length },
    speech_first_byte_ms: ttfb,
    transcription_ms: pct(transcription.map((t) => t.totalMs)),
    // turn.metrics first_audio runs from the first sentence ready to the first packet sent: the provider's first byte is inside it.
    perch_overhead_on_speech_ttfb_ms: { p50: round(firstAudioP50 - ttfb.p50) },
  };
}
