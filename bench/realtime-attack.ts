/**
 * `npm run bench -- realtime-attack`: the hostile realtime provider attacks of issue 45, each on one
 * conversation's realtime session (a provider in a process of its own sends): new item ids in 200,000 audio
 * deltas and in 100,000 transcript deltas, 200,000 tiny deltas of one item, a 100 MB transcript,
 * 5 tool calls of 3.9 MB arguments. For each: the longest the event loop was held (what `/healthz`
 * would wait at most; the bound: 100 ms), and the RSS after it, collected, against before
 * (bound: back within 50 MB). Beside the loop's delay, `max_hold_cpu_ms`: the longest hold in the
 * main thread's own CPU time, which the machine's load does not add to; beside the RSS,
 * `held_growth_mb`: the heap and the buffers outside it (what the program holds, not what the
 * allocator kept).
 *
 * Each attack runs in a process of its own (realtime-attack-side.ts), on this checkout's code and,
 * with `BENCH_REALTIME_ATTACK_BEFORE` (a checkout, or a git revision checked out into a temporary
 * worktree), on that one's, one after the other for each attack (`BENCH_REALTIME_ATTACK_ROUNDS`
 * rounds, 1 by default), and beside them `idle_process`: the longest hold of an idle process's loop
 * over 2 s, the machine's load alone (on 2 shared cores it descheduled a process for 100 ms and
 * more). `BENCH_REALTIME_ATTACK_ONLY=a,b` runs only those attacks;
 * `BENCH_CPU_PROF=<dir>` writes each side's CPU profile there.
 */
import { spawn } from "node:child_process";
import { loadavg } from "node:os";
import { checkoutOf, ROOT } from "./support.ts";

const ATTACKS = ["audio-item-ids", "transcript-item-ids", "audio-one-item", "transcript-100mb", "tool-arguments"] as const;

interface Side {
  max_loop_delay_ms: number;
  max_hold_cpu_ms: number;
  attack_s: number;
  rss_before_mb: number;
  rss_after_mb: number;
  held_growth_mb: number;
  longest_gap?: { wall_ms: number; cpu_ms: number; at_s: number };
  events: number;
}

function run(root: string, port: number, attack: string): Promise<Side> {
  const prof = process.env.BENCH_CPU_PROF;
  const child = spawn(
    process.execPath,
    [
      ...(prof ? ["--cpu-prof", `--cpu-prof-dir=${prof}`] : []),
      "--import",
      "tsx",
      new URL("./realtime-attack-side.ts", import.meta.url).pathname,
      root,
      String(port),
      attack,
    ],
    { stdio: ["ignore", "pipe", "inherit"], cwd: ROOT },
  );
  let out = "";
  child.stdout.on("data", (d: Buffer) => (out += d.toString()));
  return new Promise((resolve, reject) =>
    child.once("exit", (code) => {
      try {
        resolve(JSON.parse(out) as Side);
      } catch {
        reject(new Error(`${attack} on ${root} exited with ${code}: ${out}`));
      }
    }),
  );
}

export async function realtimeAttackBench(): Promise<unknown> {
  const spec = process.env.BENCH_REALTIME_ATTACK_BEFORE;
  const before = spec ? checkoutOf(spec) : undefined;
  const rounds = Number(process.env.BENCH_REALTIME_ATTACK_ROUNDS ?? 1);
  const only = process.env.BENCH_REALTIME_ATTACK_ONLY?.split(",");
  const server = spawn(process.execPath, ["--import", "tsx", new URL("./realtime-attack-server.ts", import.meta.url).pathname], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const port = await new Promise<number>((resolve) => server.stdout!.once("data", (d: Buffer) => resolve(Number(d.toString().trim()))));
  const sides = [...(before ? [["before", before.root] as const] : []), ["after", ROOT] as const];
  const results: Record<string, Record<string, Side[]>> = {};
  const load: number[] = [loadavg()[0]!];
  try {
    for (let r = 0; r < rounds; r++)
      for (const attack of ATTACKS.filter((a) => !only || only.includes(a)))
        for (const [name, root] of [...sides, ["idle_process", ROOT] as const]) {
          const side = await run(root, port, name === "idle_process" ? "idle" : attack);
          const byAttack = results[attack] ?? {};
          results[attack] = byAttack;
          byAttack[name] = [...(byAttack[name] ?? []), side];
        }
    load.push(loadavg()[0]!);
  } finally {
    server.kill();
    before?.remove();
  }
  const summary: Record<string, unknown> = {};
  for (const [attack, bySide] of Object.entries(results)) {
    const row: Record<string, unknown> = {};
    for (const [name, runs] of Object.entries(bySide))
      row[name] = {
        max_loop_delay_ms: runs.map((s) => s.max_loop_delay_ms),
        max_hold_cpu_ms: runs.map((s) => s.max_hold_cpu_ms),
        attack_s: runs.map((s) => s.attack_s),
        rss_growth_mb: runs.map((s) => s.rss_after_mb - s.rss_before_mb),
        held_growth_mb: runs.map((s) => s.held_growth_mb),
        longest_gap: runs.map((s) => s.longest_gap),
        events: runs.map((s) => s.events),
      };
    summary[attack] = row;
  }
  return {
    suite: "realtime-attack",
    before: spec ?? "not measured: set BENCH_REALTIME_ATTACK_BEFORE to a checkout or a git revision",
    bounds: { max_loop_delay_ms: 100, rss_growth_mb: 50 },
    load_1m: { start: load[0], end: load[1] },
    results: summary,
  };
}
