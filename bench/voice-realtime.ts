/**
 * `npm run -s bench -- voice --engines realtime`: speech-to-speech conversations (voice.md §6)
 * against the fake realtime model (bench/realtime-fake.ts, its own process, answering its first
 * audio delta 0 ms after speech_stopped), with devices on `@roamhq/wrtc` in separate processes.
 * Figures: Perch's added latency (the fake's speech_stopped → the first reply sample audible at the
 * device, so Perch plus the WebRTC path; and at the server, speech_stopped received → first frame
 * sent), for one conversation and for 20 at once; the node's CPU and memory per conversation at
 * 20. Then the text pipeline with provider engines (bench/voice.ts `--engines provider`, phases
 * one and crowd) in the same run, and the ratios of the two.
 */
import { spawn } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { availableParallelism, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { benchConfig, ROOT, round, startServer, treeCpuSeconds } from "./support.ts";
import { devices, metric, questionFile, rssMb, turnFigures } from "./voice.ts";

const TURNS = Number(process.env.BENCH_VOICE_TURNS ?? 8);
const CONVERSATIONS = Number(process.env.BENCH_VOICE_CONVERSATIONS ?? 20);
const PROCESSES = Number(process.env.BENCH_VOICE_PROCESSES ?? 4);

export async function realtimeVoiceBench(textPipeline: () => Promise<unknown>): Promise<unknown> {
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
