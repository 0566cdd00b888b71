/**
 * `npm run bench -- compat`: one fake OpenAI-compatible provider on loopback (its own process) and
 * one `perch serve` in front of it; every figure is measured directly against the provider and
 * through Perch side by side, in the same run. With `--sdk`, also an in-process comparison of the
 * pass-through with the AI SDK's openai-compatible provider (see docs/decisions.md).
 */
import { type ChildProcess, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import http from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AiSdkProvider } from "../src/ai/providers/ai-sdk.ts";
import { OpenAIProvider } from "../src/ai/providers/openai.ts";
import { benchConfig, DURATION_S, load, ROOT, round, startServer, withCpu } from "./support.ts";

const LATENCY_REQUESTS = Number(process.env.BENCH_LATENCY_REQUESTS ?? 2000);
const STREAM_REQUESTS = Number(process.env.BENCH_STREAM_REQUESTS ?? 300);
const LONG_STREAMS = Number(process.env.BENCH_LONG_STREAMS ?? 40);
const CHUNKS = 500;
const API_KEY = "sk-perch-bench";

const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });

interface Target {
  name: string;
  /** Base URL ending in /v1 (direct) or /openai/v1 (Perch). */
  base: string;
  headers: Record<string, string>;
}

export async function compatBench(): Promise<unknown> {
  const sdk = process.argv.includes("--sdk");
  const upstream = await startUpstream();
  const dataDir = mkdtempSync(join(tmpdir(), "perch-bench-compat-"));
  const keyHash = createHash("sha256").update(API_KEY).digest("hex");
  const perch = await startServer({
    PERCH_DATA_DIR: dataDir,
    PERCH_LOG_LEVEL: "warn",
    ...benchConfig(dataDir, {
      providers: [{ id: "upstream", kind: "openai-compatible", base_url: upstream.url, max_retries: 0 }],
      models: [
        { id: "chat", kind: "chat", provider: "upstream", upstream_model: "short" },
        { id: "long", kind: "chat", provider: "upstream", upstream_model: `chunks-${CHUNKS}` },
      ],
      api_keys: [{ name: "bench", sha256: keyHash }],
    }),
  });
  try {
    const direct: Target = { name: "direct", base: upstream.url, headers: {} };
    const through: Target = { name: "perch", base: `${perch.url}/openai/v1`, headers: { authorization: `Bearer ${API_KEY}` } };
    const body = (model: string, stream: boolean) => JSON.stringify({ model, messages: [{ role: "user", content: "Say something short." }], stream });

    // Warm both paths (JIT, keep-alive sockets).
    for (let i = 0; i < 300; i++) {
      await request(direct, body("short", false));
      await request(through, body("chat", false));
    }

    const latency = await sideBySide(LATENCY_REQUESTS, direct, through, (t) => request(t, body(t === direct ? "short" : "chat", false)));
    const ttfb = await sideBySide(STREAM_REQUESTS, direct, through, (t) => firstChunk(t, body(t === direct ? "short" : "chat", true)));
    const long = await sideBySide(LONG_STREAMS, direct, through, (t) => request(t, body(t === direct ? `chunks-${CHUNKS}` : "long", true)));

    const loadOf = (t: Target, model: string) => ({
      url: `${t.base}/chat/completions`,
      method: "POST" as const,
      headers: { ...t.headers, "content-type": "application/json" },
      body: body(model, false),
    });
    const directLoad = await withCpu(upstream.child.pid!, () => load("non-streaming chat, direct to the provider", loadOf(direct, "short")));
    const perchLoad = await withCpu(perch.child.pid!, () => load("non-streaming chat through Perch", loadOf(through, "chat")));

    const result: Record<string, unknown> = {
      suite: "compat",
      duration_s_per_load: DURATION_S,
      non_streaming_c1: {
        requests_each: LATENCY_REQUESTS,
        direct_ms: latency.direct,
        perch_ms: latency.perch,
        overhead_ms: { p50: round3(latency.perch.p50 - latency.direct.p50), p99: round3(latency.perch.p99 - latency.direct.p99) },
        ratio_p50: round(latency.perch.p50 / latency.direct.p50),
      },
      non_streaming_c32: {
        direct: directLoad,
        perch: perchLoad,
        perch_over_direct_rps: round(perchLoad.requests_per_second / directLoad.requests_per_second),
      },
      streaming_first_chunk: {
        requests_each: STREAM_REQUESTS,
        direct_ms: ttfb.direct,
        perch_ms: ttfb.perch,
        overhead_ms_p50: round3(ttfb.perch.p50 - ttfb.direct.p50),
      },
      streaming_relay: {
        chunks: CHUNKS,
        streams_each: LONG_STREAMS,
        direct_ms: long.direct,
        perch_ms: long.perch,
        overhead_us_per_chunk_p50: round3(((long.perch.p50 - long.direct.p50) * 1000) / CHUNKS),
      },
    };
    if (sdk) result.in_process_pass_through_vs_ai_sdk = await passThroughVsSdk(upstream.url);
    return result;
  } finally {
    await perch.stop();
    upstream.child.kill("SIGTERM");
    rmSync(dataDir, { recursive: true, force: true });
  }
}

function round3(x: number): number {
  return Math.round(x * 1000) / 1000;
}

async function startUpstream(): Promise<{ url: string; child: ChildProcess }> {
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

/** Alternates direct and Perch calls one by one, so drift affects both alike; milliseconds per call. */
async function sideBySide(n: number, a: Target, b: Target, call: (t: Target) => Promise<number>) {
  const times = { direct: [] as number[], perch: [] as number[] };
  for (let i = 0; i < n; i++) {
    times.direct.push(await call(a));
    times.perch.push(await call(b));
  }
  return { direct: precise(times.direct), perch: precise(times.perch) };
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
  const passThrough = new OpenAIProvider({ baseUrl: url, apiKey: undefined, timeoutMs: 60_000 });
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
      for await (const _ of s.events);
      streamTimes.push(performance.now() - t);
    }
    out[name] = { complete_ms: precise(completeTimes), stream_500_chunks_ms: precise(streamTimes) };
  }
  return out;
}
