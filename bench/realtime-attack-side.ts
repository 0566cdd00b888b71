/**
 * One side of `npm run bench -- realtime-attack`: one attack on one conversation's realtime session, in a
 * process of its own (its RSS is the attack's alone), with the code of the checkout at `root`
 * (this one, or a before's: its modules are imported from there). Usage:
 * realtime-attack-side.ts <root> <provider port> <attack>; prints one JSON line. The attack `idle`
 * is the control: no session, the loop of a process doing nothing for 2 s (what the load alone holds it).
 */

import { existsSync } from "node:fs";
import { join } from "node:path";
import { monitorEventLoopDelay } from "node:perf_hooks";
import { pathToFileURL } from "node:url";
import v8 from "node:v8";
import vm from "node:vm";
import { Registry } from "prom-client";

const [root, port, attack] = process.argv.slice(2) as [string, string, string];
const from = async <T>(path: string): Promise<T> => (await import(pathToFileURL(join(root, path)).href)) as T;

v8.setFlagsFromString("--expose-gc");
const gc = vm.runInNewContext("gc") as () => void;
const { loadResampler } = await from<typeof import("../src/audio/resampler.ts")>("src/audio/resampler.ts");
const { loadConfig } = await from<typeof import("../src/config/config.ts")>("src/config/config.ts");
const { systemClock } = await from<typeof import("../src/voice/clock.ts")>("src/voice/clock.ts");
const { VoiceMetrics } = await from<typeof import("../src/voice/metrics.ts")>("src/voice/metrics.ts");
const { VoiceEvents } = await from<typeof import("../src/voice/peer-events.ts")>("src/voice/peer-events.ts");
// The realtime session of one conversation: an agent activity of the conversation's pipeline (since
// issue 49), or, in older checkouts, the bridge with its own uplink and encoder.
const pipeline = existsSync(join(root, "src/voice/realtime/activity.ts"));
const Session = pipeline
  ? (await from<typeof import("../src/voice/realtime/activity.ts")>("src/voice/realtime/activity.ts")).RealtimeActivity
  : // The bridge then (gone from this checkout: typed loosely).
    ((await from("src/voice/realtime/bridge.ts")) as { RealtimeBridge: new (o: unknown) => { close(): void } }).RealtimeBridge;
const { OpusCodec } = await from<typeof import("../src/voice/opus.ts")>("src/voice/opus.ts");

const resampler = await loadResampler();
const config = loadConfig({}, {});
// What a node holds before a conversation's session: its modules loaded, collected.
gc();
const before = process.memoryUsage().rss;
// What the program holds (the heap, and buffers outside it): unlike the RSS, not what the allocator kept.
const held = () => {
  const m = process.memoryUsage();
  return m.heapUsed + m.external;
};
const heldBefore = held();
const loop = monitorEventLoopDelay({ resolution: 5 });
let events = 0;
let done!: () => void;
const finished = new Promise<void>((r) => {
  done = r;
});
const started = performance.now();
loop.enable();
// The loop's longest hold in its own thread's CPU time: between two ticks of a 2 ms timer, what the
// main thread ran. Unlike the loop's delay, it leaves out the time the process waited for a core
// (on a loaded machine an idle process's loop waits 100 ms and more).
let maxHoldCpu = 0;
let lastCpu = process.threadCpuUsage();
let lastTick = performance.now();
// The longest gap between two ticks: its wall time, the main thread's CPU in it, when it began.
let gap = { wall_ms: 0, cpu_ms: 0, at_s: 0 };
const probe = setInterval(() => {
  const used = process.threadCpuUsage(lastCpu);
  lastCpu = process.threadCpuUsage();
  const cpu = (used.user + used.system) / 1000;
  const now = performance.now();
  if (now - lastTick > gap.wall_ms) gap = { wall_ms: Math.round(now - lastTick), cpu_ms: Math.round(cpu), at_s: Math.round((lastTick - started) / 100) / 10 };
  lastTick = now;
  maxHoldCpu = Math.max(maxHoldCpu, cpu);
}, 2);
if (attack === "idle") {
  // The control: what the machine's load alone holds an idle process's loop for, over 2 s.
  await new Promise((r) => setTimeout(r, 2_000));
  loop.disable();
  clearInterval(probe);
  process.stdout.write(
    `${JSON.stringify({ max_loop_delay_ms: Math.round(loop.max / 1e6), max_hold_cpu_ms: Math.round(maxHoldCpu), attack_s: 2, rss_before_mb: 0, rss_after_mb: 0, held_growth_mb: 0, events: 0 })}\n`,
  );
  process.exit(0);
}
const agent = {
  id: "talker",
  instructions: "Be brief.",
  voice: "marin",
  turnDetection: "server_vad" as const,
  transcription: "gpt-4o-mini-transcribe",
  toolTimeoutMs: 1_000,
  maxSteps: 4,
  provider: "rt",
  url: `ws://127.0.0.1:${port}/v1/realtime?model=m&attack=${attack}`,
  apiKey: undefined,
  timeoutMs: 10_000,
};
const common = {
  agent,
  config: config.voice,
  events: new VoiceEvents({ sendEvent: () => void events++ } as never),
  tools: { definitions: () => [], displayName: (n: string) => n, run: async () => ({ text: "ok", isError: false, images: [], result: "ok" }) } as never,
  toolEvents: () => ({ called() {}, finished() {} }),
  activity: undefined,
  resampler,
  metrics: new VoiceMetrics(new Registry(), () => 1),
  clock: systemClock,
  send: () => true,
  log: (_l: string, _d: unknown, message: string) => {
    if (message === "the realtime session failed; reconnecting") done();
  },
};
const session = pipeline
  ? new (Session as typeof import("../src/voice/realtime/activity.ts").RealtimeActivity)({ ...common, encoder: new OpusCodec(24_000) })
  : new (Session as new (o: unknown) => { close(): void })({ ...common, payloadType: 111 });
// The attack ends when the provider closes the session (the session's failure line), at most 2 minutes.
const timer = setTimeout(done, 120_000);
await finished;
clearTimeout(timer);
const seconds = (performance.now() - started) / 1000;
session.close();
loop.disable();
clearInterval(probe);
await new Promise((r) => setTimeout(r, 500));
gc();
process.stdout.write(
  `${JSON.stringify({
    max_loop_delay_ms: Math.round(loop.max / 1e6),
    max_hold_cpu_ms: Math.round(maxHoldCpu),
    longest_gap: gap,
    attack_s: Math.round(seconds * 10) / 10,
    rss_before_mb: Math.round(before / 2 ** 20),
    rss_after_mb: Math.round(process.memoryUsage().rss / 2 ** 20),
    held_growth_mb: Math.round((held() - heldBefore) / 2 ** 20),
    events,
  })}\n`,
);
process.exit(0);
