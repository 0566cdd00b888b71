/**
 * `npx tsx bench/chat-ab.ts`: the chat pass-through's CPU a call (non-streaming, 32 connections)
 * of several checkouts in front of one fake provider, rounds alternating between them after each
 * had 3 s of the same load, so that a machine whose speed moves moves them all alike. Settings:
 * `BENCH_AB_ROOTS` (checkouts, comma-separated; this one by default), `BENCH_AB_NODE_OPTIONS_<i>`
 * (`NODE_OPTIONS` of the i-th server), `BENCH_AB_TRACING_<i>=<ratio>` (the i-th server traces with
 * that `tracing.sample_ratio`, 1 for every call, to a collector in this process: bench/otlp-sink.ts), `BENCH_ROUNDS` (4), `BENCH_DURATION_S` (a round).
 * A checkout may be given twice, once traced and once not. Prints one JSON document: server CPU µs
 * a call, by server, round by round, and their means.
 */
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { OtlpSink } from "./otlp-sink.ts";
import { benchConfig, load, ROOT, round, type Server, startServer, withCpu } from "./support.ts";

const API_KEY = "sk-perch-bench";
const roots = (process.env.BENCH_AB_ROOTS ?? ROOT).split(",");
const loadBefore = loadavg();
const provider = spawn(process.execPath, [join(ROOT, "bench/fake-upstream.ts")], { stdio: ["ignore", "pipe", "inherit"] });
const upstream = await new Promise<string>((resolve) => provider.stdout!.once("data", (c: Buffer) => resolve(c.toString().split("\n")[0]!.trim())));
const servers: Array<{ name: string; server: Server; dir: string }> = [];
const ratioOf = (i: number) => (process.env[`BENCH_AB_TRACING_${i}`] ? Number(process.env[`BENCH_AB_TRACING_${i}`]) : undefined);
const sink = roots.some((_, i) => ratioOf(i) !== undefined) ? await OtlpSink.start() : undefined;
try {
  for (const [i, root] of roots.entries()) {
    const dir = mkdtempSync(join(tmpdir(), "perch-bench-ab-"));
    const nodeOptions = process.env[`BENCH_AB_NODE_OPTIONS_${i}`];
    const ratio = ratioOf(i);
    const traced = ratio !== undefined && sink;
    const server = await startServer(
      {
        ...(nodeOptions ? { NODE_OPTIONS: nodeOptions } : {}),
        PERCH_DATA_DIR: dir,
        PERCH_LOG_LEVEL: "warn",
        ...benchConfig(dir, {
          providers: [{ id: "upstream", kind: "openai-compatible", base_url: upstream, max_retries: 0 }],
          models: [{ id: "chat", kind: "chat", provider: "upstream", upstream_model: "short" }],
          api_keys: [{ name: "bench", sha256: createHash("sha256").update(API_KEY).digest("hex") }],
          ...(traced ? { tracing: { otlp: { endpoint: sink.endpoint }, sample_ratio: ratio } } : {}),
        }),
      },
      root,
    );
    servers.push({
      name: `${i}: ${root === ROOT ? "this checkout" : root.split("/").filter(Boolean).at(-1)}${nodeOptions ? ` (${nodeOptions})` : ""}${traced ? ` traced (sample_ratio ${ratio})` : ""}`,
      server,
      dir,
    });
  }
  await Promise.all(servers.map((s) => s.server.settled()));
  const loadOf = (s: Server) => ({
    url: `${s.url}/openai/v1/chat/completions`,
    method: "POST" as const,
    headers: { authorization: `Bearer ${API_KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "chat", messages: [{ role: "user", content: "Say something short." }] }),
  });
  for (const s of servers) await load("warm-up", { ...loadOf(s.server), duration: 3 });
  const cpu: Record<string, number[]> = Object.fromEntries(servers.map((s) => [s.name, []]));
  const rps: Record<string, number[]> = Object.fromEntries(servers.map((s) => [s.name, []]));
  for (let round = 0; round < Number(process.env.BENCH_ROUNDS ?? 4); round++) {
    for (const s of servers) {
      const f = await withCpu(s.server.child.pid!, () => load(s.name, loadOf(s.server)));
      if (f.non_2xx || f.errors) throw new Error(`${s.name}: ${f.non_2xx} answers not 2xx, ${f.errors} errors`);
      cpu[s.name]!.push(f.server_cpu_us_per_request);
      rps[s.name]!.push(f.requests_per_second);
    }
  }
  console.log(
    JSON.stringify(
      {
        suite: "chat-ab",
        cpu_us_per_call: cpu,
        mean_cpu_us_per_call: Object.fromEntries(Object.entries(cpu).map(([k, v]) => [k, round(v.reduce((s, x) => s + x, 0) / v.length)])),
        requests_per_second: rps,
        ...(sink ? { collector: sink.figures() } : {}),
        load_average: { before: loadBefore, after: loadavg() },
      },
      null,
      2,
    ),
  );
} finally {
  for (const s of servers) {
    await s.server.stop();
    rmSync(s.dir, { recursive: true, force: true });
  }
  provider.kill();
  await sink?.close();
}
