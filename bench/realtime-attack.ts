/**
 * `npm run bench -- realtime-attack`: the hostile realtime provider attacks of issue 45, each on one
 * conversation's realtime activity (src/voice/realtime/activity.ts) in this process (a provider in a process of its own sends): new item ids
 * in 200,000 audio deltas and in 100,000 transcript deltas, 200,000 tiny deltas of one item, a
 * 100 MB transcript, 5 tool calls of 3.9 MB arguments. For each: the longest the event loop was
 * held (what `/healthz` would wait at most; the bound: 100 ms), and the RSS after it,
 * collected, against before (bound: back within 50 MB).
 */
import { spawn } from "node:child_process";
import { monitorEventLoopDelay } from "node:perf_hooks";
import v8 from "node:v8";
import vm from "node:vm";
import { Registry } from "prom-client";
import type { ToolKit } from "../src/ai/agents/toolbox.ts";
import { loadResampler } from "../src/audio/resampler.ts";
import { loadConfig } from "../src/config/config.ts";
import { systemClock } from "../src/voice/clock.ts";
import { VoiceMetrics } from "../src/voice/metrics.ts";
import { OpusCodec } from "../src/voice/opus.ts";
import { VoiceEvents } from "../src/voice/peer-events.ts";
import { RealtimeActivity } from "../src/voice/realtime/activity.ts";
import { realtimeAgent } from "../test/support/fake-realtime.ts";

const ATTACKS = ["audio-item-ids", "transcript-item-ids", "audio-one-item", "transcript-100mb", "tool-arguments"] as const;

export async function realtimeAttackBench(): Promise<unknown> {
  v8.setFlagsFromString("--expose-gc");
  const gc = vm.runInNewContext("gc") as () => void;
  const server = spawn(process.execPath, ["--import", "tsx", new URL("./realtime-attack-server.ts", import.meta.url).pathname], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const port = await new Promise<number>((resolve) => server.stdout!.once("data", (d: Buffer) => resolve(Number(d.toString().trim()))));
  const resampler = await loadResampler();
  const config = loadConfig({}, {});
  const results: Record<string, { max_loop_delay_ms: number; rss_before_mb: number; rss_after_mb: number; events: number }> = {};
  try {
    for (const attack of ATTACKS) {
      gc();
      const before = process.memoryUsage().rss;
      const loop = monitorEventLoopDelay({ resolution: 5 });
      let events = 0;
      let done!: () => void;
      const finished = new Promise<void>((r) => {
        done = r;
      });
      loop.enable();
      const session = new RealtimeActivity({
        agent: realtimeAgent(`ws://127.0.0.1:${port}/v1/realtime?model=m&attack=${attack}`, { toolTimeoutMs: 1_000 }),
        config: config.voice,
        events: new VoiceEvents({ sendEvent: () => void events++ } as never),
        tools: {
          definitions: () => [],
          displayName: (n: string) => n,
          run: async () => ({ text: "ok", isError: false, images: [], result: "ok" }),
        } as unknown as ToolKit,
        toolEvents: () => ({ called() {}, finished() {} }),
        activity: undefined,
        resampler,
        encoder: new OpusCodec(24_000),
        metrics: new VoiceMetrics(new Registry(), () => 1),
        clock: systemClock,
        send: () => true,
        log: (_l, _d, message) => {
          if (message === "the realtime session failed; reconnecting") done();
        },
      });
      // The attack ends when the provider closes the session (the session's failure line), at most 2 minutes.
      const timer = setTimeout(done, 120_000);
      await finished;
      clearTimeout(timer);
      session.close();
      loop.disable();
      await new Promise((r) => setTimeout(r, 500));
      gc();
      results[attack] = {
        max_loop_delay_ms: Math.round(loop.max / 1e6),
        rss_before_mb: Math.round(before / 2 ** 20),
        rss_after_mb: Math.round(process.memoryUsage().rss / 2 ** 20),
        events,
      };
    }
  } finally {
    server.kill();
  }
  return { suite: "realtime-attack", bounds: { max_loop_delay_ms: 100, rss_growth_mb: 50 }, results };
}
