/**
 * `npm run bench -- compat`: one fake OpenAI-compatible provider on loopback (its own process) and
 * one `perch serve` in front of it; every figure is measured directly against the provider and
 * through Perch side by side, in the same run. With `--anchors`, Portkey's open-source gateway (from
 * its own package, bench/anchors) is measured the same way beside them. With `--sdk`, also an
 * in-process comparison of the pass-through with the AI SDK's openai-compatible provider (see
 * docs/decisions.md). With `BENCH_COMPARE_ROOT` (another checkout of Perch, its dependencies
 * installed), that checkout's server stands beside this one in front of the same provider and is
 * measured the same way, call by call and in its own 32-connection load right after this one's.
 * `BENCH_COMPAT_ONLY=chat` measures only the chat figures (no large bodies).
 */

import { type ChildProcess, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import http from "node:http";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { JsonThread } from "../src/ai/json-thread.ts";
import { AiSdkProvider } from "../src/ai/providers/ai-sdk.ts";
import { OpenAIProvider } from "../src/ai/providers/openai.ts";
import { type Portkey, startPortkey } from "./portkey.ts";
import { benchConfig, DURATION_S, load, ROOT, round, type Server, startServer, withCpu } from "./support.ts";

const LATENCY_REQUESTS = Number(process.env.BENCH_LATENCY_REQUESTS ?? 2000);
const STREAM_REQUESTS = Number(process.env.BENCH_STREAM_REQUESTS ?? 300);
const LONG_STREAMS = Number(process.env.BENCH_LONG_STREAMS ?? 40);
const CHUNKS = 500;
/** Seconds of 32-connection load each target gets before the loads are measured. */
const WARM_LOAD_S = Number(process.env.BENCH_WARM_LOAD_S ?? 3);
const API_KEY = "sk-perch-bench";

const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });

interface Target {
  name: string;
  /** Base URL ending in /v1 (direct, Portkey) or /openai/v1 (Perch). */
  base: string;
  headers: Record<string, string>;
  /** Model names for the short answer and the 500-chunk stream, as this target knows them. */
  short: string;
  long: string;
}

export async function compatBench(): Promise<unknown> {
  const loadBefore = loadavg();
  const sdk = process.argv.includes("--sdk");
  const anchors = process.argv.includes("--anchors");
  const upstream = await startUpstream();
  const dataDir = mkdtempSync(join(tmpdir(), "perch-bench-compat-"));
  const keyHash = createHash("sha256").update(API_KEY).digest("hex");
  const compareRoot = process.env.BENCH_COMPARE_ROOT;
  const compareDir = compareRoot ? mkdtempSync(join(tmpdir(), "perch-bench-compat-")) : undefined;
  let portkey: Portkey | undefined;
  let compared: Server | undefined;
  const leans: LeanProxy[] = [];
  try {
    const start = (dir: string, root?: string) =>
      startServer(
        {
          PERCH_DATA_DIR: dir,
          PERCH_LOG_LEVEL: "warn",
          ...benchConfig(dir, {
            providers: [{ id: "upstream", kind: "openai-compatible", base_url: upstream.url, max_retries: 0 }],
            models: [
              { id: "chat", kind: "chat", provider: "upstream", upstream_model: "short" },
              { id: "long", kind: "chat", provider: "upstream", upstream_model: `chunks-${CHUNKS}` },
            ],
            api_keys: [{ name: "bench", sha256: keyHash }],
          }),
        },
        root,
      );
    const perch = await start(dataDir);
    try {
      const direct: Target = { name: "direct", base: upstream.url, headers: {}, short: "short", long: `chunks-${CHUNKS}` };
      const through: Target = { name: "perch", base: `${perch.url}/openai/v1`, headers: { authorization: `Bearer ${API_KEY}` }, short: "chat", long: "long" };
      const targets = [direct, through];
      let viaCompared: Target | undefined;
      if (compareRoot && compareDir) {
        compared = await start(compareDir, compareRoot);
        viaCompared = { ...through, name: "compared", base: `${compared.url}/openai/v1` };
        targets.push(viaCompared);
      }
      leans.push(await startLeanProxy(upstream.url, "http"));
      if (existsSync(join(ROOT, "bench/anchors/node_modules/undici/index.js"))) leans.push(await startLeanProxy(upstream.url, "undici"));
      let anchorStatus: Record<string, unknown> | undefined;
      let viaPortkey: Target | undefined;
      if (anchors) {
        const started = await startPortkey(upstream.url);
        if (started.ok) {
          portkey = started.portkey;
          viaPortkey = { name: "portkey", base: portkey.base, headers: portkey.headers, short: "short", long: `chunks-${CHUNKS}` };
          targets.push(viaPortkey);
          anchorStatus = { portkey: { status: "measured", ...portkey.versions } };
        } else {
          process.stderr.write(`compat bench: Portkey not measured: ${started.reason}\n`);
          anchorStatus = { portkey: { status: "unavailable", reason: started.reason } };
        }
      }
      const body = (model: string, stream: boolean) => JSON.stringify({ model, messages: [{ role: "user", content: "Say something short." }], stream });

      await Promise.all([perch.settled(), compared?.settled()]);
      // Warm every path (JIT, keep-alive sockets).
      for (let i = 0; i < 300; i++) for (const t of targets) await request(t, body(t.short, false));

      // The lean references (bench/lean-proxy.ts) relay whole answers only: measured on non-streaming calls.
      for (const l of leans) await request(l.target, body(l.target.short, false));
      const latency = await sideBySide(LATENCY_REQUESTS, [...targets, ...leans.map((l) => l.target)], (t) => request(t, body(t.short, false)));
      const ttfb = await sideBySide(STREAM_REQUESTS, targets, (t) => firstChunk(t, body(t.short, true)));
      const long = await sideBySide(LONG_STREAMS, targets, (t) => request(t, body(t.long, true)));

      const loadOf = (t: Target) => ({
        url: `${t.base}/chat/completions`,
        method: "POST" as const,
        headers: { ...t.headers, "content-type": "application/json" },
        body: body(t.short, false),
      });
      // The loads' concurrent path warmed too, every target alike: its first seconds compile code
      // on V8's background threads, which counted as the requests' CPU in the first load measured.
      for (const t of [...targets, ...leans.map((l) => l.target)]) await load("warm-up", { ...loadOf(t), duration: WARM_LOAD_S });
      const directLoad = await withCpu(upstream.child.pid!, () => load("non-streaming chat, direct to the provider", loadOf(direct)));
      const perchLoad = await withCpu(perch.child.pid!, () => load("non-streaming chat through Perch", loadOf(through)));
      const leanLoads: Record<string, unknown> = {};
      for (const l of leans) {
        const f = await withCpu(l.pid, () => load(`non-streaming chat through ${l.target.name}`, loadOf(l.target)));
        leanLoads[l.target.name] = { ...f, over_direct_rps: round(f.requests_per_second / directLoad.requests_per_second) };
      }
      // Beside another checkout, `BENCH_ROUNDS` (3) more rounds alternate the direct provider, this
      // server and that one, so that a load that moves meanwhile moves all of them alike.
      const rounds: Array<Record<string, unknown>> = [];
      if (compared && viaCompared) {
        for (let i = 0; i < Number(process.env.BENCH_ROUNDS ?? 3); i++) {
          const dr = await withCpu(upstream.child.pid!, () => load("direct", loadOf(direct)));
          const pr = await withCpu(perch.child.pid!, () => load("perch", loadOf(through)));
          const cr = await withCpu(compared.child.pid!, () => load("compared", loadOf(viaCompared)));
          const lr: Record<string, unknown> = {};
          for (const l of leans) {
            const f = await withCpu(l.pid, () => load(l.target.name, loadOf(l.target)));
            lr[l.target.name] = {
              rps: f.requests_per_second,
              cpu_us: f.server_cpu_us_per_request,
              over_direct_rps: round(f.requests_per_second / dr.requests_per_second),
            };
          }
          rounds.push({
            ...lr,
            direct: { rps: dr.requests_per_second, cpu_us: dr.server_cpu_us_per_request },
            perch: {
              rps: pr.requests_per_second,
              cpu_us: pr.server_cpu_us_per_request,
              over_direct_rps: round(pr.requests_per_second / dr.requests_per_second),
            },
            compared: {
              rps: cr.requests_per_second,
              cpu_us: cr.server_cpu_us_per_request,
              over_direct_rps: round(cr.requests_per_second / dr.requests_per_second),
            },
            perch_cpu_over_compared: round(pr.server_cpu_us_per_request / cr.server_cpu_us_per_request),
          });
        }
      }
      const comparedLoad = rounds.length > 0 ? rounds : undefined;
      const portkeyLoad =
        portkey && viaPortkey ? await withCpu(portkey.child.pid!, () => load("non-streaming chat through Portkey's gateway", loadOf(viaPortkey))) : undefined;

      const d = (m: Timings) => m.direct!;
      const result: Record<string, unknown> = {
        suite: "compat",
        duration_s_per_load: DURATION_S,
        ...(anchorStatus ? { anchors: anchorStatus } : {}),
        non_streaming_c1: {
          requests_each: LATENCY_REQUESTS,
          direct_ms: d(latency),
          perch_ms: latency.perch,
          overhead_ms: overhead(latency, "perch"),
          ratio_p50: round(latency.perch!.p50 / d(latency).p50),
          ...(latency.compared ? { compared_ms: latency.compared, compared_overhead_ms: overhead(latency, "compared") } : {}),
          ...Object.fromEntries(leans.map((l) => [`${l.target.name}_overhead_ms`, overhead(latency, l.target.name)])),
          ...(latency.portkey
            ? { portkey_ms: latency.portkey, portkey_overhead_ms: overhead(latency, "portkey"), portkey_ratio_p50: round(latency.portkey.p50 / d(latency).p50) }
            : {}),
        },
        non_streaming_c32: {
          direct: directLoad,
          perch: perchLoad,
          perch_over_direct_rps: round(perchLoad.requests_per_second / directLoad.requests_per_second),
          ...leanLoads,
          ...(comparedLoad ? { rounds_beside_compared: comparedLoad } : {}),
          ...(portkeyLoad
            ? {
                portkey: portkeyLoad,
                portkey_over_direct_rps: round(portkeyLoad.requests_per_second / directLoad.requests_per_second),
                perch_over_portkey_rps: round(perchLoad.requests_per_second / portkeyLoad.requests_per_second),
                perch_over_portkey_goal_2x_met: perchLoad.requests_per_second >= 2 * portkeyLoad.requests_per_second,
              }
            : {}),
        },
        streaming_first_chunk: {
          requests_each: STREAM_REQUESTS,
          direct_ms: d(ttfb),
          perch_ms: ttfb.perch,
          overhead_ms_p50: overhead(ttfb, "perch").p50,
          ...(ttfb.compared ? { compared_ms: ttfb.compared, compared_overhead_ms_p50: overhead(ttfb, "compared").p50 } : {}),
          ...(ttfb.portkey ? { portkey_ms: ttfb.portkey, portkey_overhead_ms_p50: overhead(ttfb, "portkey").p50 } : {}),
        },
        streaming_relay: {
          chunks: CHUNKS,
          streams_each: LONG_STREAMS,
          direct_ms: d(long),
          perch_ms: long.perch,
          overhead_us_per_chunk_p50: perChunkUs(long, "perch"),
          // The same with the first-chunk overhead (streaming_first_chunk) taken out: the relay alone.
          overhead_us_per_chunk_p50_less_first_chunk: perChunkUs(long, "perch", ttfb),
          ...(long.compared ? { compared_ms: long.compared, compared_overhead_us_per_chunk_p50: perChunkUs(long, "compared") } : {}),
          ...(long.portkey
            ? {
                portkey_ms: long.portkey,
                portkey_overhead_us_per_chunk_p50: perChunkUs(long, "portkey"),
                portkey_overhead_us_per_chunk_p50_less_first_chunk: perChunkUs(long, "portkey", ttfb),
              }
            : {}),
        },
      };
      result.load_average = { before: loadBefore.map(round), after: loadavg().map(round) };
      if (process.env.BENCH_COMPAT_ONLY !== "chat") result.large_valid_bodies = await largeBodyHolds(perch.url, through);
      if (sdk) result.in_process_pass_through_vs_ai_sdk = await passThroughVsSdk(upstream.url);
      return result;
    } finally {
      await perch.stop();
    }
  } finally {
    for (const l of leans) l.child.kill("SIGTERM");
    await compared?.stop();
    await portkey?.stop();
    upstream.child.kill("SIGTERM");
    rmSync(dataDir, { recursive: true, force: true });
    if (compareDir) rmSync(compareDir, { recursive: true, force: true });
  }
}

type Timings = Record<string, { p50: number; p99: number }>;

interface LeanProxy {
  target: Target;
  pid: number;
  child: ChildProcess;
}

/** The lean pass-through reference (bench/lean-proxy.ts) with `client` (`http` or `undici`) in front of the provider. */
async function startLeanProxy(upstreamUrl: string, client: "http" | "undici"): Promise<LeanProxy> {
  const child = spawn(process.execPath, [join(ROOT, "bench/lean-proxy.ts"), upstreamUrl, client, "short"], { stdio: ["ignore", "pipe", "inherit"] });
  const port = await new Promise<string>((resolve, reject) => {
    child.stdout!.once("data", (d: Buffer) => resolve(d.toString().trim()));
    child.once("exit", (code) => reject(new Error(`lean proxy (${client}) exited with ${code}`)));
  });
  return { target: { name: `lean_${client}`, base: `http://127.0.0.1:${port}`, headers: {}, short: "chat", long: "long" }, pid: child.pid!, child };
}

/**
 * How long the node's event loop was held while it took one valid chat body of 30 MiB (the issue's
 * bound: about 50 ms), read from its own `perch_event_loop_lag_max_seconds` (reading resets it),
 * `BENCH_LARGE_BODY_RUNS` (5) of each shape, one at a time.
 */
async function largeBodyHolds(perchUrl: string, t: Target) {
  const runs = Number(process.env.BENCH_LARGE_BODY_RUNS ?? 5);
  const lagMs = async () => {
    const text = await (await fetch(`${perchUrl}/metrics`)).text();
    return Number(/^perch_event_loop_lag_max_seconds (\S+)$/m.exec(text)?.[1] ?? Number.NaN) * 1000;
  };
  const shapes: Record<string, () => string> = {
    one_message_of_30_mib: () => JSON.stringify({ model: t.short, messages: [{ role: "user", content: "hello world ".repeat(2_600_000) }] }),
    messages_4000_of_7_5_kib: () =>
      JSON.stringify({
        model: t.short,
        messages: Array.from({ length: 4000 }, (_, i) => ({ role: i % 2 ? "assistant" : "user", content: "hello world ".repeat(650) })),
      }),
  };
  const out: Record<string, unknown> = {};
  for (const [name, make] of Object.entries(shapes)) {
    const body = make();
    const holds: number[] = [];
    const statuses = new Set<number>();
    for (let r = 0; r < runs; r++) {
      await lagMs();
      const res = await fetch(`${t.base}/chat/completions`, { method: "POST", headers: { ...t.headers, "content-type": "application/json" }, body });
      await res.arrayBuffer();
      statuses.add(res.status);
      holds.push(await lagMs());
    }
    holds.sort((a, b) => a - b);
    out[name] = {
      mib: round(body.length / 2 ** 20),
      statuses: [...statuses],
      event_loop_held_ms: { p50: round(holds[Math.floor(holds.length / 2)]!), max: round(holds.at(-1)!) },
    };
  }
  return out;
}

/** A target's p50 and p99 minus the direct call's (milliseconds). */
function overhead(m: Timings, name: string): { p50: number; p99: number } {
  return { p50: round3(m[name]!.p50 - m.direct!.p50), p99: round3(m[name]!.p99 - m.direct!.p99) };
}

/** A target's p50 over the direct 500-chunk stream, in microseconds a chunk; less its first-chunk overhead when given. */
function perChunkUs(m: Timings, name: string, first?: Timings): number {
  const fixed = first ? first[name]!.p50 - first.direct!.p50 : 0;
  return round3(((m[name]!.p50 - m.direct!.p50 - fixed) * 1000) / CHUNKS);
}

function round3(x: number): number {
  return Math.round(x * 1000) / 1000;
}

export async function startUpstream(): Promise<{ url: string; child: ChildProcess }> {
  const child = spawn(process.execPath, [join(ROOT, "bench/fake-upstream.ts")], { stdio: ["ignore", "pipe", "inherit"] });
  const url = await new Promise<string>((resolve, reject) => {
    let out = "";
    child.stdout!.on("data", (c: Buffer) => {
      out += c.toString();
      const line = out.split("\n")[0];
      if (out.includes("\n") && line) resolve(line.trim());
    });
    child.once("exit", (code) => reject(new Error(`fake upstream exited with ${code}`)));
  });
  return { url, child };
}

/** Alternates the targets call by call, so drift affects all alike; milliseconds per call, by target name. */
async function sideBySide(n: number, targets: Target[], call: (t: Target) => Promise<number>): Promise<Timings> {
  const times = new Map<Target, number[]>(targets.map((t) => [t, []]));
  for (let i = 0; i < n; i++) for (const t of targets) times.get(t)!.push(await call(t));
  return Object.fromEntries(targets.map((t) => [t.name, precise(times.get(t)!)]));
}

function precise(samples: number[]): { p50: number; p99: number } {
  const s = [...samples].sort((x, y) => x - y);
  const at = (q: number) => round3(s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? Number.NaN);
  return { p50: at(0.5), p99: at(0.99) };
}

/** One POST, read to its end; milliseconds. */
function request(t: Target, body: string): Promise<number> {
  return exchange(t, body, false);
}

/** One streaming POST; milliseconds to the first body bytes (the first chunk), then the rest is drained. */
function firstChunk(t: Target, body: string): Promise<number> {
  return exchange(t, body, true);
}

function exchange(t: Target, body: string, toFirstByte: boolean): Promise<number> {
  return new Promise((resolve, reject) => {
    const started = performance.now();
    let first = 0;
    const req = http.request(
      `${t.base}/chat/completions`,
      { method: "POST", agent, headers: { ...t.headers, "content-type": "application/json", "content-length": Buffer.byteLength(body) } },
      (res) => {
        if (res.statusCode !== 200) reject(new Error(`${t.name}: status ${res.statusCode}`));
        res.on("data", () => {
          if (!first) first = performance.now();
        });
        res.on("end", () => resolve((toFirstByte ? first : performance.now()) - started));
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

/**
 * Both provider implementations in this process against the same provider: the same non-streaming
 * call and the same 500-chunk stream, consumed as the HTTP layer would.
 */
async function passThroughVsSdk(url: string) {
  const signal = new AbortController().signal;
  const passThrough = new OpenAIProvider({ baseUrl: url, apiKey: undefined, timeoutMs: 60_000, json: new JsonThread() });
  const viaSdk = new AiSdkProvider({ kind: "openai-compatible", baseUrl: url, apiKey: undefined, timeoutMs: 60_000 });
  const messages = [{ role: "user" as const, content: "Say something short." }];
  const out: Record<string, unknown> = {};
  for (const [name, provider] of [
    ["pass_through", passThrough],
    ["ai_sdk", viaSdk],
  ] as const) {
    const o = { signal, publicModel: "chat" };
    for (let i = 0; i < 200; i++) await provider.complete({ model: "short", messages }, o);
    const completeTimes: number[] = [];
    for (let i = 0; i < 1000; i++) {
      const t = performance.now();
      await provider.complete({ model: "short", messages }, o);
      completeTimes.push(performance.now() - t);
    }
    const streamTimes: number[] = [];
    for (let i = 0; i < 30; i++) {
      const t = performance.now();
      const s = await provider.stream({ model: `chunks-${CHUNKS}`, messages, stream: true }, o);
      for await (const _ of s.sse());
      streamTimes.push(performance.now() - t);
    }
    out[name] = { complete_ms: precise(completeTimes), stream_500_chunks_ms: precise(streamTimes) };
  }
  return out;
}
