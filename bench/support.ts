/** What every benchmark suite shares: a `perch serve` process, autocannon loads, and CPU readings. */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import autocannon from "autocannon";

export const ROOT = new URL("../", import.meta.url).pathname;
export const DURATION_S = Number(process.env.BENCH_DURATION_S ?? 10);
export const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 32);

export interface Figure {
  name: string;
  requests_per_second: number;
  latency_ms: { p50: number; p99: number; mean: number };
  requests: number;
  non_2xx: number;
  errors: number;
}

export interface Server {
  url: string;
  child: ChildProcess;
  /** Log lines at warn level or above since the start, and the last few of them. */
  warnings: { count: number; last: string[] };
  /**
   * Resolves once the server's start-up work is over: its speech engines load and warm up in
   * worker threads and recogniser processes for seconds after it listens, on the same cores, and a
   * load measured meanwhile counts their CPU as the requests'.
   */
  settled(): Promise<void>;
  stop(): Promise<void>;
}

/** Starts `perch serve` (of the checkout at `root`, by default this one) on a free port and waits for its listening line. */
/**
 * A checkout to measure beside this one (a benchmark's `before` or `base`): a directory as is, or a
 * git revision in a temporary worktree sharing this checkout's node_modules (`remove` deletes it).
 */
export function checkoutOf(spec: string): { root: string; remove: () => void } {
  if (existsSync(join(spec, "bin/perch"))) return { root: spec, remove: () => {} };
  const root = mkdtempSync(join(tmpdir(), "perch-bench-before-"));
  execFileSync("git", ["-C", ROOT, "worktree", "add", "--detach", root, spec], { stdio: "ignore" });
  symlinkSync(join(ROOT, "node_modules"), join(root, "node_modules"));
  return { root, remove: () => execFileSync("git", ["-C", ROOT, "worktree", "remove", "--force", root], { stdio: "ignore" }) };
}

export async function startServer(env: Record<string, string>, root = ROOT): Promise<Server> {
  const child = spawn(join(root, "bin/perch"), ["serve"], {
    env: { ...process.env, PERCH_PORT: "0", PERCH_HOST: "127.0.0.1", PERCH_LOG_LEVEL: "info", PERCH_CONFIG: "", ...cpuProfile(), ...env },
    stdio: ["ignore", "pipe", "inherit"],
  });
  let output = "";
  const url = await new Promise<string>((resolve, reject) => {
    child.stdout!.on("data", (chunk: Buffer) => {
      output += chunk.toString();
      const m = /"address":"([^"]+)"/.exec(output);
      if (m) resolve(`http://${m[1]}`);
    });
    child.once("exit", (code) => reject(new Error(`server exited with ${code}`)));
  });
  // Keep draining the request log (as a real deployment's log shipper would), storing only warnings.
  child.stdout!.removeAllListeners("data");
  const warnings = { count: 0, last: [] as string[] };
  child.stdout!.on("data", (chunk: Buffer) => {
    const text = chunk.toString();
    if (!/"level":[4-6]0/.test(text)) return;
    for (const line of text.split("\n")) {
      if (!/"level":[4-6]0/.test(line)) continue;
      warnings.count++;
      warnings.last = [...warnings.last.slice(-2), line.slice(0, 300)];
    }
  });
  return {
    url,
    child,
    warnings,
    settled: () => settledCpu(child.pid!),
    stop: async () => {
      if (child.exitCode !== null) return;
      child.kill("SIGTERM");
      await new Promise((r) => child.once("exit", r));
    },
  };
}

/**
 * With `BENCH_CPU_PROF=<dir>`, the server writes a V8 CPU profile there when it exits (one file per
 * thread): `npx flamebearer@2.1.0 <dir>` summarises them (docs/profiles/ holds the ones taken).
 */
function cpuProfile(): Record<string, string> {
  const dir = process.env.BENCH_CPU_PROF;
  return dir ? { NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ""} --cpu-prof --cpu-prof-dir=${dir}`.trim() } : {};
}

/** A config file in `dir` with rate limits off (the load generator is one address and few keys). */
export function benchConfig(dir: string, extra: Record<string, unknown> = {}): Record<string, string> {
  const file = join(dir, "bench.json");
  writeFileSync(file, JSON.stringify({ rate_limits: { login_per_key: 0, login_per_address: 0, device_token_per_device: 0 }, ...extra }));
  return { PERCH_CONFIG: file };
}

export async function load(name: string, opts: autocannon.Options): Promise<Figure> {
  const r = await autocannon({ connections: CONNECTIONS, duration: DURATION_S, ...opts });
  return {
    name,
    requests_per_second: Math.round(r.requests.average),
    latency_ms: { p50: r.latency.p50, p99: r.latency.p99, mean: round(r.latency.mean) },
    requests: r.requests.total,
    non_2xx: r.non2xx,
    errors: r.errors,
  };
}

const TICKS_PER_SECOND = 100; // USER_HZ on Linux

/** CPU seconds (user + system) used so far by `pid` and every process below it. */
export function treeCpuSeconds(pid: number): number {
  let ticks = 0;
  const visit = (p: number) => {
    try {
      const stat = readFileSync(`/proc/${p}/stat`, "utf8");
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      ticks += Number(fields[11]) + Number(fields[12]); // utime, stime
      for (const task of readdirSync(`/proc/${p}/task`)) {
        for (const child of readFileSync(`/proc/${p}/task/${task}/children`, "utf8").split(" ").filter(Boolean)) visit(Number(child));
      }
    } catch {
      // The process ended meanwhile.
    }
  };
  visit(pid);
  return ticks / TICKS_PER_SECOND;
}

/** Runs `fn` and returns its figure with the server's CPU microseconds per request. */
export async function withCpu(pid: number, fn: () => Promise<Figure>): Promise<Figure & { server_cpu_us_per_request: number }> {
  const before = treeCpuSeconds(pid);
  const figure = await fn();
  const cpu = treeCpuSeconds(pid) - before;
  return { ...figure, server_cpu_us_per_request: round((cpu * 1e6) / Math.max(1, figure.requests)) };
}

/** Waits until `pid`'s process tree uses under 5 % of a core over half a second (at most `maxMs`). */
export async function settledCpu(pid: number, maxMs = 120_000): Promise<void> {
  const until = performance.now() + maxMs;
  let before = treeCpuSeconds(pid);
  while (performance.now() < until) {
    await new Promise((r) => setTimeout(r, 500));
    const now = treeCpuSeconds(pid);
    if (now - before < 0.025) return;
    before = now;
  }
}

export function round(x: number): number {
  return Math.round(x * 100) / 100;
}

/** p50 and p99 of `samples` (milliseconds). */
export function percentiles(samples: number[]): { p50: number; p99: number } {
  const s = [...samples].sort((a, b) => a - b);
  const at = (q: number) => round(s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? Number.NaN);
  return { p50: at(0.5), p99: at(0.99) };
}

/** A new, empty database on the PostgreSQL server of `url`; its URL. */
export async function freshPgDatabase(url: string): Promise<string> {
  const pg = (await import("pg")).default;
  const name = `perch_bench_${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`;
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  try {
    await admin.query(`create database ${name}`);
  } finally {
    await admin.end();
  }
  const u = new URL(url);
  u.pathname = `/${name}`;
  return u.toString();
}
