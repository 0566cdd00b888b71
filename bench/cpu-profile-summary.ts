/**
 * `node bench/cpu-profile-summary.ts <file>.cpuprofile [from-regex]`: self and inclusive time by
 * function of a V8 CPU profile, from the first sample whose stack matches `from-regex` (default:
 * the telemetry writer, i.e. the ingest bench's loop, leaving start-up and packet encoding out).
 * Paths are shown from `src/` or `node_modules/`, so no machine path ends up in docs/profiles.
 */
import { readFileSync } from "node:fs";

interface Node {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
const [file, fromArg] = process.argv.slice(2);
const profile = JSON.parse(readFileSync(file!, "utf8")) as { nodes: Node[]; samples: number[]; timeDeltas: number[] };
const from = new RegExp(fromArg ?? "telemetry-writer");
const byId = new Map(profile.nodes.map((n) => [n.id, n]));
const parent = new Map<number, number>();
for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
const name = (n: Node) => {
  const url = n.callFrame.url.replace(/^.*?\/((src|node_modules|bench)\/)/, "$1");
  return `${n.callFrame.functionName || "(anonymous)"} ${url}${url ? `:${n.callFrame.lineNumber + 1}` : ""}`;
};
const stack = (id: number) => {
  const out: Node[] = [];
  for (let cur: number | undefined = id; cur !== undefined; cur = parent.get(cur)) out.push(byId.get(cur)!);
  return out;
};
const selfBy = new Map<string, number>();
const inclusive = new Map<string, number>();
let total = 0;
let started = false;
for (let i = 0; i < profile.samples.length; i++) {
  const frames = stack(profile.samples[i]!);
  started ||= frames.some((n) => from.test(n.callFrame.url));
  if (!started) continue;
  const t = profile.timeDeltas[i] ?? 0;
  total += t;
  const self = name(frames[0]!);
  selfBy.set(self, (selfBy.get(self) ?? 0) + t);
  for (const key of new Set(frames.map(name))) inclusive.set(key, (inclusive.get(key) ?? 0) + t);
}
const top = (m: Map<string, number>, k: number) =>
  [...m]
    .sort((a, b) => b[1] - a[1])
    .slice(0, k)
    .map(([n, t]) => `${((100 * t) / total).toFixed(1).padStart(5)}%  ${n}`)
    .join("\n");
process.stdout.write(`${(total / 1e6).toFixed(2)} s of samples from the loop's start\n\nSelf time:\n${top(selfBy, 30)}\n\nInclusive:\n${top(inclusive, 30)}\n`);
