import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { availableParallelism, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { LibOpus } from "../src/audio/opus.ts";
import { startCapacityProvider, talkerOn } from "../test/support/fleet.ts";
import type { CapacityAudio, CapacityCollected, CapacityCommand, CapacityConnected, Mode } from "./capacity-worker.ts";
import { DeviceProcess } from "./device-process.ts";
import { OtlpSink } from "./otlp-sink.ts";
import { benchConfig, checkoutOf, ROOT, round, type Server, settledCpu, startServer } from "./support.ts";
import { metric, pct, questionFile } from "./voice.ts";

const DEFAULT_STEPS = "talk:20,talk:40,talk:80,talk:120,talk:200,idle:100,mic:100";
const STEP_S = Number(option("--step-seconds") ?? process.env.BENCH_CAPACITY_STEP_S ?? 20);
const WARMUP_S = Number(process.env.BENCH_CAPACITY_WARMUP_S ?? 4);
const PROCESSES = Number(process.env.BENCH_CAPACITY_PROCESSES ?? 4);
const CONNECT_CONCURRENCY = 4;
const FRAME = 960;

function option(name: string): string | undefined {
  const at = process.argv.indexOf(name);
  return at < 0 ? undefined : process.argv[at + 1];
}

interface Step {
  mode: Mode;
  count: number;
}

function steps(): Step[] {
  return (option("--steps") ?? process.env.BENCH_CAPACITY_STEPS ?? DEFAULT_STEPS).split(",").map((s) => {
    const [mode, n] = s.trim().split(":");
    if ((mode !== "talk" && mode !== "idle" && mode !== "mic") || !Number.isInteger(Number(n)) || Number(n) < 1)
      throw new Error(`a capacity step is talk:N, idle:N or mic:N, not ${JSON.stringify(s)}`);
    return { mode, count: Number(n) };
  });
}

/** Every process below `pid` and itself, each with its name. */
function tree(pid: number): Array<{ pid: number; name: string }> {
  const out: Array<{ pid: number; name: string }> = [];
  const visit = (p: number) => {
    try {
      const stat = readFileSync(`/proc/${p}/stat`, "utf8");
      out.push({ pid: p, name: stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")")) });
      for (const task of readdirSync(`/proc/${p}/task`))
        for (const child of readFileSync(`/proc/${p}/task/${task}/children`, "utf8").split(" ").filter(Boolean)) visit(Number(child));
    } catch {
      // Ended meanwhile.
    }
  };
  visit(pid);
  return out;
}

/**
 * CPU seconds of the tree so far: each live process's own (user + system) and those of its children
 * already waited for (cutime + cstime: an ffmpeg that ended during the step still counts).
 */
function treeCpu(pid: number): number {
  let ticks = 0;
  for (const p of tree(pid)) {
    try {
      const stat = readFileSync(`/proc/${p.pid}/stat`, "utf8");
      const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      ticks += Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14]);
    } catch {}
  }
  return ticks / 100;
}

/** CPU seconds of one /proc stat file (utime + stime). */
function statCpu(path: string): number {
  try {
    const stat = readFileSync(path, "utf8");
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(f[11]) + Number(f[12])) / 100;
  } catch {
    return 0;
  }
}

/** CPU seconds of the server process (all its threads) and of its main thread (the JavaScript event loop). */
function serverCpu(pid: number): { process: number; main: number } {
  return { process: statCpu(`/proc/${pid}/stat`), main: statCpu(`/proc/${pid}/task/${pid}/stat`) };
}

/**
 * CPU seconds of the server's threads grouped by thread name (/proc/<pid>/task/<tid>/comm): splits
 * the main thread from libuv's pool, V8's, the audio threads (Node's workers) and node-datachannel's
 * native threads (libdatachannel's, usrsctp's, libjuice's), whose names are whatever they set.
 */
export function threadCpu(pid: number): Map<string, number> {
  const out = new Map<string, number>();
  let tasks: string[] = [];
  try {
    tasks = readdirSync(`/proc/${pid}/task`);
  } catch {
    return out;
  }
  for (const tid of tasks) {
    let name = "?";
    try {
      name = tid === String(pid) ? "main" : readFileSync(`/proc/${pid}/task/${tid}/comm`, "utf8").trim();
    } catch {
      continue;
    }
    out.set(name, (out.get(name) ?? 0) + statCpu(`/proc/${pid}/task/${tid}/stat`));
  }
  return out;
}

function rssMb(pid: number): number {
  try {
    return Number(/^VmRSS:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1] ?? 0) / 1024;
  } catch {
    return 0;
  }
}

/** The tree's resident memory, in all and by process (`node` is the server itself; its children by their command). */
function treeRss(pid: number): { total_mb: number; processes: Array<{ name: string; rss_mb: number }> } {
  const processes = tree(pid).map((p) => {
    let name = p.name;
    try {
      const argv = readFileSync(`/proc/${p.pid}/cmdline`, "utf8").split("\0");
      const script = argv.find((a) => /\.(ts|js)$/.test(a));
      if (p.pid !== pid && script) name = script.split("/").slice(-2).join("/");
      else if (p.pid === pid) name = "perch serve";
      // A pooled worker process says its model in its data (the recogniser's processes: moonshine, silero).
      const data = /PERCH_WORKER_DATA=([^\0]*)/.exec(readFileSync(`/proc/${p.pid}/environ`, "utf8"))?.[1];
      const model = data ? (JSON.parse(data) as { model?: unknown }).model : undefined;
      if (typeof model === "string") name = `${name} (${model})`;
    } catch {}
    return { name, rss_mb: round(rssMb(p.pid)) };
  });
  return { total_mb: round(processes.reduce((s, p) => s + p.rss_mb, 0)), processes };
}

/** The question (flite, 48 kHz) as 20 ms Opus frames, the last voiced one's index, and a frame of digital silence. */
export async function encodedAudio(dir: string): Promise<string> {
  const raw = readFileSync(await questionFile(dir));
  const pcm = new Int16Array(raw.buffer, raw.byteOffset, raw.byteLength / 2);
  const opus = new LibOpus("voip");
  const question: string[] = [];
  const levels: number[] = [];
  let lastVoiced = 0;
  for (let at = 0, i = 0; at < pcm.length; at += FRAME, i++) {
    const frame = new Int16Array(FRAME);
    frame.set(pcm.subarray(at, at + FRAME));
    let sum = 0;
    for (const x of frame) sum += x * x;
    if (Math.sqrt(sum / FRAME) > 300) lastVoiced = i;
    // RFC 6464: the level in −dBov, 127 for digital silence.
    levels.push(Math.min(127, Math.round(-20 * Math.log10(Math.max(Math.sqrt(sum / FRAME), 1e-9) / 32767))));
    question.push(opus.encode(frame).toString("base64"));
  }
  let silence = "";
  for (let i = 0; i < 5; i++) silence = opus.encode(new Int16Array(FRAME)).toString("base64");
  opus.close();
  const audio: CapacityAudio = { question, levels, lastVoiced, silence };
  const file = join(dir, "capacity-audio.json");
  writeFileSync(file, JSON.stringify(audio));
  return file;
}

type DeviceProcesses = DeviceProcess<CapacityCommand, CapacityConnected | CapacityCollected>;

/** A server under test, its devices' processes, and its figures. */
interface Side {
  name: string;
  root: string;
  server: Server;
  devices: DeviceProcesses[];
  atRest: ReturnType<typeof treeRss>;
  steps: unknown[];
  data: string;
}

/**
 * `--record` (BENCH_CAPACITY_RECORD=1): the cost of turn recordings (voice.md §8): two servers of this
 * checkout, both storing transcripts, `base` without and `this` with `record.audio` on the agent,
 * side by side as with `--base`; after the steps, the recordings stored by `this` (bytes and seconds
 * of audio, bytes per minute of recorded audio and per minute of conversation).
 */
const RECORD = process.argv.includes("--record") || process.env.BENCH_CAPACITY_RECORD === "1";

/** Beside the talker's configuration: transcripts stored, and its turns recorded or not. */
function recording(providerUrl: string, record: boolean): Record<string, unknown> {
  const config = talkerOn(providerUrl);
  return {
    agents: config.agents.map((a) => ({ ...a, ...(record ? { record: { audio: true, retention_days: 1 } } : {}) })),
    voice: { ...config.voice, store_transcripts: true },
  };
}

/** What a server stored of the turns' recordings (its SQLite file, read beside it). */
function storedRecordings(data: string): { sides: number; bytes: number; audio_seconds: number; bytes_per_audio_minute: number } {
  const db = new DatabaseSync(join(data, "perch.db"), { readOnly: true });
  try {
    const r = db
      .prepare("select count(*) as n, coalesce(sum(length(audio)), 0) as bytes, coalesce(sum(duration_ms), 0) as ms from conversation_recordings")
      .get() as { n: number; bytes: number; ms: number };
    return {
      sides: Number(r.n),
      bytes: Number(r.bytes),
      audio_seconds: round(Number(r.ms) / 1000),
      bytes_per_audio_minute: r.ms > 0 ? Math.round((Number(r.bytes) / Number(r.ms)) * 60_000) : 0,
    };
  } finally {
    db.close();
  }
}

/** `extra`: configuration beside the talker's (a traced side's `tracing`). */
async function startSide(name: string, root: string, dir: string, providerUrl: string, audioFile: string, extra: Record<string, unknown> = {}): Promise<Side> {
  const data = mkdtempSync(join(dir, `${name}-`));
  const server = await startServer(
    {
      PERCH_DATA_DIR: data,
      PERCH_LOG_LEVEL: "warn",
      ...benchConfig(data, { ...talkerOn(providerUrl), ...extra }),
    },
    root,
  );
  await server.settled();
  const atRest = treeRss(server.child.pid!);
  const serverKey = ((await (await fetch(`${server.url}/server-info`)).json()) as { public_key: string }).public_key;
  const env = { PERCH_URL: server.url, PERCH_SERVER_KEY: serverKey, CROWD_BIND: new URL(server.url).hostname, CAPACITY_AUDIO: audioFile };
  const devices = Array.from(
    { length: PROCESSES },
    () => new DeviceProcess<CapacityCommand, CapacityConnected | CapacityCollected>("bench/capacity-worker.ts", env),
  );
  return { name, root, server, devices, atRest, steps: [], data };
}

async function runStep(side: Side, step: Step): Promise<unknown> {
  const pid = side.server.child.pid!;
  const share = (i: number) => Math.floor(step.count / side.devices.length) + (i < step.count % side.devices.length ? 1 : 0);
  const connectStarted = performance.now();
  const connected = await Promise.all(
    side.devices.map((d, i) => (share(i) > 0 ? d.ask<CapacityConnected>({ type: "connect", count: share(i), concurrency: CONNECT_CONCURRENCY }) : undefined)),
  );
  const connectS = (performance.now() - connectStarted) / 1000;
  for (const d of side.devices) d.tell({ type: "mode", mode: step.mode });
  await new Promise((r) => setTimeout(r, WARMUP_S * 1000));
  const collect = () => Promise.all(side.devices.map((d) => d.ask<CapacityCollected>({ type: "collect" })));
  await collect();
  const answeredBefore = await metric(side.server, "perch_voice_turns_total", 'result="answered"');
  const cpuBefore = treeCpu(pid);
  const serverBefore = serverCpu(pid);
  const threadsBefore = threadCpu(pid);
  const started = performance.now();
  const rss: number[] = [];
  const sampler = setInterval(() => rss.push(treeRss(pid).total_mb), 1000);
  await new Promise((r) => setTimeout(r, STEP_S * 1000));
  clearInterval(sampler);
  const cpu = treeCpu(pid) - cpuBefore;
  const serverAfter = serverCpu(pid);
  const threadsAfter = threadCpu(pid);
  const seconds = (performance.now() - started) / 1000;
  // % of a core by thread name over the step (threads that ended during it are missed; a thread's
  // name shared by several, e.g. a pool's, sums them).
  const threadsPct: Record<string, number> = {};
  for (const [name, after] of threadsAfter) {
    const pctOfCore = round(((after - (threadsBefore.get(name) ?? 0)) / seconds) * 100);
    if (pctOfCore >= 0.1) threadsPct[name] = pctOfCore;
  }
  const collected = await collect();
  const answeredServer = (await metric(side.server, "perch_voice_turns_total", 'result="answered"')) - answeredBefore;
  for (const d of side.devices) d.tell({ type: "mode", mode: "idle" });
  await Promise.all(side.devices.map((d) => d.ask({ type: "release" })));
  // The server notices the closes and lets the conversations go, and an overloaded one works off
  // its backlog, before the next step (at most 20 s).
  await new Promise((r) => setTimeout(r, 2000));
  await settledCpu(pid, 20_000);
  const latencies = collected.flatMap((c) => c.latencies);
  const sum = (k: "questions" | "unanswered" | "packetsSent" | "packetsReceived" | "open" | "lost") => collected.reduce((s, c) => s + c[k], 0);
  return {
    step: `${step.mode}:${step.count}`,
    devices: {
      asked: step.count,
      connected: connected.reduce((s, c) => s + (c?.ok ?? 0), 0),
      failed: connected.reduce((s, c) => s + (c?.failed ?? 0), 0),
      connect_s: round(connectS),
      open_at_end: sum("open"),
      lost: sum("lost"),
      errors: connected.flatMap((c) => c?.errors ?? []).slice(0, 3),
    },
    seconds: round(seconds),
    cpu_percent: round((cpu / seconds) * 100),
    cpu_percent_per_device: round((cpu / seconds / step.count) * 100),
    // The server process alone (its main thread, the audio threads, the WebRTC stack's), and its main thread: the one JavaScript thread signalling, agents and events share.
    server_process_cpu_percent: round(((serverAfter.process - serverBefore.process) / seconds) * 100),
    main_thread_cpu_percent: round(((serverAfter.main - serverBefore.main) / seconds) * 100),
    threads_cpu_percent: threadsPct,
    rss_mb: { mean: round(rss.reduce((s, x) => s + x, 0) / Math.max(1, rss.length)), peak: round(Math.max(0, ...rss)) },
    ...(step.mode === "talk"
      ? {
          turns: {
            asked: sum("questions"),
            answered: latencies.length,
            unanswered: sum("unanswered"),
            answered_at_server: answeredServer,
          },
          end_of_speech_to_first_audio_ms: pct(latencies),
          late_share_over_1s: round(latencies.filter((x) => x > 1000).length / Math.max(1, latencies.length)),
        }
      : {}),
    packets: { sent: sum("packetsSent"), received: sum("packetsReceived") },
  };
}

export async function capacityBench(): Promise<unknown> {
  const plan = steps();
  const spec = option("--base") ?? process.env.BENCH_CAPACITY_BASE;
  const dir = mkdtempSync(join(tmpdir(), "perch-bench-capacity-"));
  const audioFile = await encodedAudio(dir);
  const { url: providerUrl, process: provider } = await startCapacityProvider();
  const base = spec ? checkoutOf(spec) : undefined;
  // BENCH_CAPACITY_TRACING=1: this checkout a second time, tracing to a collector in this process (the cost of tracing).
  const sink = process.env.BENCH_CAPACITY_TRACING === "1" ? await OtlpSink.start() : undefined;
  const sides: Side[] = [];
  const killAll = () => {
    for (const s of sides) {
      for (const d of s.devices) if (d.child.exitCode === null) d.child.kill("SIGKILL");
      if (s.server.child.exitCode === null) s.server.child.kill("SIGKILL");
    }
    if (provider.exitCode === null) provider.kill("SIGKILL");
  };
  process.once("exit", killAll);
  const load = [round(loadavg()[0]!)];
  try {
    if (RECORD) {
      sides.push(await startSide("base", ROOT, dir, providerUrl, audioFile, recording(providerUrl, false)));
      sides.push(await startSide("this", ROOT, dir, providerUrl, audioFile, recording(providerUrl, true)));
    } else {
      if (base) sides.push(await startSide("base", base.root, dir, providerUrl, audioFile));
      sides.push(await startSide("this", ROOT, dir, providerUrl, audioFile));
      if (sink) sides.push(await startSide("traced", ROOT, dir, providerUrl, audioFile, { tracing: { otlp: { endpoint: sink.endpoint } } }));
    }
    for (const [i, step] of plan.entries()) {
      const order = i % 2 === 0 ? sides : [...sides].reverse();
      for (const side of order) side.steps.push(await runStep(side, step));
      load.push(round(loadavg()[0]!));
    }
    const out: Record<string, unknown> = {
      suite: "capacity",
      machine: { cores: availableParallelism(), load_1m: { first: load[0], max: Math.max(...load), last: load.at(-1) } },
      step_seconds: STEP_S,
      warmup_seconds: WARMUP_S,
      device_processes: PROCESSES,
      base: RECORD ? "this checkout, recording off (both store transcripts; this: record.audio on)" : (spec ?? "not measured: --base <dir or git revision>"),
      goals: {
        talk_120: "every turn answered, end of speech → first reply audio p95 ≤ 1000 ms; CPU ≤ 0.8 % of a core per conversation",
        mic_100: "≤ 15 % of a core in all",
        at_rest: "a provider-only node's process tree ≤ 600 MB",
      },
    };
    for (const side of sides) {
      out[side.name] = {
        ...(side.name === "base" ? { root: side.root } : {}),
        at_rest: side.atRest,
        steps: side.steps,
        server_warnings: side.server.warnings,
      };
    }
    if (RECORD) {
      const on = sides.find((x) => x.name === "this")!;
      // The writes of the last turns settle first.
      await new Promise((r) => setTimeout(r, 2_000));
      const stored = storedRecordings(on.data);
      const talkSeconds = plan.filter((p) => p.mode === "talk").reduce((sum, p) => sum + p.count * (STEP_S + WARMUP_S), 0);
      out.recordings = {
        ...stored,
        conversation_minutes: round(talkSeconds / 60),
        bytes_per_conversation_minute: talkSeconds > 0 ? Math.round(stored.bytes / (talkSeconds / 60)) : 0,
      };
    }
    type Figures = {
      step: string;
      cpu_percent: number;
      main_thread_cpu_percent: number;
      rss_mb: { mean: number };
      end_of_speech_to_first_audio_ms?: { p50: number; p95: number };
    };
    const ratio = (x: number | undefined, y: number | undefined) => (x !== undefined && y !== undefined && y > 0 ? round(x / y) : undefined);
    const over = (a: Side, b: Side) => ({
      at_rest_rss: ratio(a.atRest.total_mb, b.atRest.total_mb),
      steps: (a.steps as Figures[]).map((s, i) => {
        const o = b.steps[i] as Figures;
        return {
          step: s.step,
          cpu: ratio(s.cpu_percent, o.cpu_percent),
          main_thread_cpu: ratio(s.main_thread_cpu_percent, o.main_thread_cpu_percent),
          rss: ratio(s.rss_mb.mean, o.rss_mb.mean),
          ...(s.end_of_speech_to_first_audio_ms
            ? {
                latency_p50: ratio(s.end_of_speech_to_first_audio_ms.p50, o.end_of_speech_to_first_audio_ms?.p50),
                latency_p95: ratio(s.end_of_speech_to_first_audio_ms.p95, o.end_of_speech_to_first_audio_ms?.p95),
              }
            : {}),
        };
      }),
    });
    const side = (name: string) => sides.find((s) => s.name === name);
    const [before, now, traced] = [side("base"), side("this")!, side("traced")];
    if (before) out.this_over_base = over(now, before);
    if (traced) out.traced_over_this = over(traced, now);
    if (sink) out.collector = sink.figures();
    return out;
  } finally {
    for (const s of sides) {
      for (const d of s.devices) d.tell({ type: "exit" });
      await s.server.stop();
    }
    killAll();
    base?.remove();
    await sink?.close();
  }
}
