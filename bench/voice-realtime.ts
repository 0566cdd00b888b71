/**
 * `npm run -s bench -- voice --engines realtime`: speech-to-speech conversations (voice.md §6)
 * against the fake realtime model (bench/realtime-fake.ts, its own process, answering its first
 * audio delta 0 ms after speech_stopped), with devices on `@roamhq/wrtc` in separate processes.
 * Figures: Perch's added latency (the fake's speech_stopped → the first reply sample audible at the
 * device, so Perch plus the WebRTC path; and at the server, speech_stopped received → first frame
 * sent), for one conversation and for 20 at once; the node's CPU and memory per conversation at
 * 20. Then the text pipeline with provider engines (bench/voice.ts `--engines provider`, phases
 * one and crowd) in the same run, and the ratios of the two.
 *
 * `--base <dir or git revision>` (issue 49): before and after side by side instead: for each count
 * of BENCH_REALTIME_COUNTS (default 20,60) realtime conversations, that checkout's server and this
 * one in turn (the order alternating), each alone on the machine with the same fake model: the
 * server's CPU per conversation, its main thread's (the event loop) share of it and CPU by thread
 * name, late frames, and the turns' latency. No text pipeline phase then.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { availableParallelism, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { threadCpu } from "./capacity.ts";
import { benchConfig, checkoutOf, ROOT, round, startServer, treeCpuSeconds } from "./support.ts";
import { devices, metric, questionFile, rssMb, turnFigures } from "./voice.ts";

const TURNS = Number(process.env.BENCH_VOICE_TURNS ?? 8);
const CONVERSATIONS = Number(process.env.BENCH_VOICE_CONVERSATIONS ?? 20);
const PROCESSES = Number(process.env.BENCH_VOICE_PROCESSES ?? 4);

export async function realtimeVoiceBench(textPipeline: () => Promise<unknown>): Promise<unknown> {
  const at = process.argv.indexOf("--base");
  if (at >= 0) return await sideBySide(process.argv[at + 1] ?? "");
  const dir = mkdtempSync(join(tmpdir(), "perch-bench-realtime-"));
  const file = await questionFile(dir);
  const fake = spawn(process.execPath, ["--import", "tsx", join(ROOT, "bench/realtime-fake.ts")], {
    env: { ...process.env, BENCH_REALTIME_STAMP: "1", BENCH_REALTIME_REPLY_MS: "2000" },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const fakeUrl = await new Promise<string>((resolve) => fake.stdout!.once("data", (d: Buffer) => resolve(d.toString().trim().split("\n")[0]!)));
  const server = await startServer({
    PERCH_DATA_DIR: dir,
    ...benchConfig(dir, {
      providers: [{ id: "fake-realtime", kind: "openai-compatible", base_url: fakeUrl }],
      models: [{ id: "live", kind: "realtime", provider: "fake-realtime", upstream_model: "gpt-realtime" }],
      agents: [{ id: "talker", model: "live", instructions: "Answer briefly.", voice: "marin" }],
      voice: { agent: "talker" },
    }),
  });
  const pid = server.child.pid!;
  let realtime: Record<string, unknown>;
  try {
    await devices(server, file, 1, 1, "turns", 2);
    const one = turnFigures(await devices(server, file, 1, 1, "turns", TURNS));
    const rssBefore = rssMb(pid);
    const cpuBefore = treeCpuSeconds(pid);
    const framesBefore = await metric(server, "perch_voice_frames_total");
    const lateBefore = await metric(server, "perch_voice_frames_late_total");
    let peakRss = rssBefore;
    const sampler = setInterval(() => {
      peakRss = Math.max(peakRss, rssMb(pid));
    }, 500);
    const started = performance.now();
    const crowd = turnFigures(await devices(server, file, CONVERSATIONS, PROCESSES, "turns", Math.max(3, Math.round(TURNS / 2))));
    clearInterval(sampler);
    const seconds = (performance.now() - started) / 1000;
    const cpu = treeCpuSeconds(pid) - cpuBefore;
    const frames = (await metric(server, "perch_voice_frames_total")) - framesBefore;
    const late = (await metric(server, "perch_voice_frames_late_total")) - lateBefore;
    realtime = {
      one_conversation: one,
      concurrent: {
        conversations: CONVERSATIONS,
        device_processes: PROCESSES,
        ...crowd,
        late_share_percent: round((late / Math.max(1, frames)) * 100),
        server_cpu_percent_per_conversation: round(((cpu / seconds) * 100) / CONVERSATIONS),
        server_rss_mb: { before: rssBefore, peak: peakRss, per_conversation: round((peakRss - rssBefore) / CONVERSATIONS) },
      },
      server_warnings: { count: server.warnings.count, last: server.warnings.last },
    };
  } finally {
    await server.stop();
    fake.kill();
  }
  const text = (await textPipeline()) as { concurrent?: { server_cpu_percent_per_conversation?: number; server_rss_mb?: { per_conversation?: number } } };
  const rc = realtime.concurrent as { server_cpu_percent_per_conversation: number; server_rss_mb: { per_conversation: number } };
  return {
    suite: "voice",
    engines: "realtime",
    machine: { cores: availableParallelism(), load_1m: round(loadavg()[0]!), shared: "yes: other engineers' work ran beside; compare the ratios" },
    goals: {
      perch_added_ms: "≤ 60 p50 over the fake's own (0 ms): model_stopped_to_heard_ms",
      server_cpu_percent_per_conversation: "≤ 1 at 20 conversations",
      server_rss_mb_per_conversation: "≤ 2 at 20 conversations",
    },
    realtime,
    text_pipeline_provider_engines: text,
    ratios_realtime_to_text_pipeline: {
      cpu_per_conversation: round(rc.server_cpu_percent_per_conversation / (text.concurrent?.server_cpu_percent_per_conversation ?? Number.NaN)),
      rss_per_conversation: round(rc.server_rss_mb.per_conversation / (text.concurrent?.server_rss_mb?.per_conversation ?? Number.NaN)),
    },
  };
}

/** The fake realtime model in its own process, and its URL. */
async function startFake(): Promise<{ url: string; child: ChildProcess }> {
  const child = spawn(process.execPath, ["--import", "tsx", join(ROOT, "bench/realtime-fake.ts")], {
    env: { ...process.env, BENCH_REALTIME_STAMP: "1", BENCH_REALTIME_REPLY_MS: "2000" },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const url = await new Promise<string>((resolve) => child.stdout!.once("data", (d: Buffer) => resolve(d.toString().trim().split("\n")[0]!)));
  return { url, child };
}

/** One side's run of `count` realtime conversations: CPU per conversation, the main thread's share, by thread, turns. */
async function realtimeCrowd(root: string, fakeUrl: string, file: string, count: number): Promise<Record<string, unknown>> {
  const dir = mkdtempSync(join(tmpdir(), "perch-bench-realtime-"));
  const server = await startServer(
    {
      PERCH_DATA_DIR: dir,
      ...benchConfig(dir, {
        providers: [{ id: "fake-realtime", kind: "openai-compatible", base_url: fakeUrl }],
        models: [{ id: "live", kind: "realtime", provider: "fake-realtime", upstream_model: "gpt-realtime" }],
        agents: [{ id: "talker", model: "live", instructions: "Answer briefly.", voice: "marin" }],
        voice: { agent: "talker" },
      }),
    },
    root,
  );
  const pid = server.child.pid!;
  try {
    await server.settled();
    await devices(server, file, 1, 1, "turns", 2);
    const cpuBefore = treeCpuSeconds(pid);
    const threadsBefore = threadCpu(pid);
    const framesBefore = await metric(server, "perch_voice_frames_total");
    const lateBefore = await metric(server, "perch_voice_frames_late_total");
    const started = performance.now();
    const crowd = turnFigures(await devices(server, file, count, PROCESSES, "turns", Math.max(3, Math.round(TURNS / 2))));
    const seconds = (performance.now() - started) / 1000;
    const cpu = treeCpuSeconds(pid) - cpuBefore;
    const threads: Record<string, number> = {};
    for (const [name, s] of threadCpu(pid)) {
      const pct = round((((s - (threadsBefore.get(name) ?? 0)) / seconds) * 100) / count);
      if (pct > 0) threads[name] = pct;
    }
    const main = threads.main ?? 0;
    const frames = (await metric(server, "perch_voice_frames_total")) - framesBefore;
    const late = (await metric(server, "perch_voice_frames_late_total")) - lateBefore;
    const perConversation = round(((cpu / seconds) * 100) / count);
    return {
      conversations: count,
      server_cpu_percent_per_conversation: perConversation,
      main_thread_cpu_percent_per_conversation: main,
      main_thread_share_percent: round((main / Math.max(perConversation, 0.001)) * 100),
      threads_cpu_percent_per_conversation: threads,
      late_share_percent: round((late / Math.max(1, frames)) * 100),
      ...crowd,
      server_warnings: server.warnings.count,
    };
  } finally {
    await server.stop();
  }
}

/** `--base`: before and after, one count at a time, the sides alternating which goes first. */
async function sideBySide(spec: string): Promise<unknown> {
  if (!spec) throw new Error("--base takes a directory or a git revision");
  const counts = (process.env.BENCH_REALTIME_COUNTS ?? "20,60").split(",").map(Number);
  const dir = mkdtempSync(join(tmpdir(), "perch-bench-realtime-"));
  const file = await questionFile(dir);
  const fake = await startFake();
  const base = checkoutOf(spec);
  const load: number[] = [round(loadavg()[0]!)];
  const steps: Array<Record<string, unknown>> = [];
  try {
    for (const [i, count] of counts.entries()) {
      const order = i % 2 === 0 ? (["base", "head"] as const) : (["head", "base"] as const);
      const step: Record<string, unknown> = { conversations: count };
      for (const side of order) {
        step[side] = await realtimeCrowd(side === "base" ? base.root : ROOT, fake.url, file, count);
        load.push(round(loadavg()[0]!));
      }
      const b = step.base as { server_cpu_percent_per_conversation: number; main_thread_cpu_percent_per_conversation: number };
      const h = step.head as typeof b;
      step.ratios_head_to_base = {
        cpu_per_conversation: round(h.server_cpu_percent_per_conversation / b.server_cpu_percent_per_conversation),
        main_thread_cpu_per_conversation: round(h.main_thread_cpu_percent_per_conversation / b.main_thread_cpu_percent_per_conversation),
      };
      steps.push(step);
    }
  } finally {
    fake.child.kill();
    base.remove();
  }
  return {
    suite: "voice",
    engines: "realtime",
    base: spec,
    machine: { cores: availableParallelism(), load_1m: load, shared: "yes: other engineers' work ran beside; compare the ratios" },
    steps,
  };
}
