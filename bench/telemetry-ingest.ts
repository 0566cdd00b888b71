/**
 * `npm run bench -- telemetry-ingest`: what a node's JavaScript thread spends per telemetry frame,
 * from the packet to the stored sample, without WebRTC (bench/ingest-worker.ts, one process per
 * run): `BENCH_INGEST_DEVICES` (2,000) devices at `BENCH_INGEST_RATE` (15) frames a second each
 * for `BENCH_INGEST_S` (5) seconds of traffic, in `BENCH_ROUNDS` (2) rounds. With `BENCH_COMPARE_ROOT`
 * (another checkout) each round runs that checkout's modules too, right after this one's. With
 * `BENCH_INGEST_DATABASE_URL` (a PostgreSQL server) each run gets a fresh database there instead of SQLite.
 */
import { spawn } from "node:child_process";
import { loadavg } from "node:os";
import { join } from "node:path";
import { freshPgDatabase, ROOT, round } from "./support.ts";

const env = (name: string, fallback: number) => Number(process.env[name] ?? fallback);
const DEVICES = env("BENCH_INGEST_DEVICES", 2_000);
const RATE = env("BENCH_INGEST_RATE", 15);
const SECONDS = env("BENCH_INGEST_S", 5);
const ROUNDS = env("BENCH_ROUNDS", 2);

type Run = Record<string, unknown> & { cpu_us_per_frame: number; frames_stored_per_second: number };

const DATABASE_URL = process.env.BENCH_INGEST_DATABASE_URL;

async function run(root: string): Promise<Run> {
  const database = DATABASE_URL ? await freshPgDatabase(DATABASE_URL) : "";
  const child = spawn(
    process.execPath,
    ["--disable-warning=ExperimentalWarning", join(import.meta.dirname, "ingest-worker.ts"), root, String(DEVICES), String(RATE), String(SECONDS), database],
    {
      stdio: ["ignore", "pipe", "inherit"],
    },
  );
  let out = "";
  child.stdout.on("data", (d: Buffer) => {
    out += d.toString();
  });
  try {
    return await new Promise((resolve, reject) =>
      child.once("exit", (code) => (code === 0 ? resolve(JSON.parse(out) as Run) : reject(new Error(`ingest worker exited with ${code}`)))),
    );
  } finally {
    if (database) await dropDatabase(database);
  }
}

async function dropDatabase(url: string): Promise<void> {
  const pg = (await import("pg")).default;
  const u = new URL(url);
  const name = u.pathname.slice(1);
  u.pathname = "/postgres";
  const admin = new pg.Client({ connectionString: u.toString() });
  await admin.connect();
  try {
    await admin.query(`drop database if exists ${name}`);
  } finally {
    await admin.end();
  }
}

export async function telemetryIngestBench(): Promise<unknown> {
  const loadBefore = loadavg();
  const compareRoot = process.env.BENCH_COMPARE_ROOT;
  const rounds: Array<Record<string, Run | number>> = [];
  for (let i = 0; i < ROUNDS; i++) {
    const r: Record<string, Run | number> = { perch: await run(ROOT) };
    if (compareRoot) {
      const compared = await run(compareRoot);
      r.compared = compared;
      r.cpu_per_frame_compared_over_perch = round(compared.cpu_us_per_frame / (r.perch as Run).cpu_us_per_frame);
    }
    rounds.push(r);
  }
  const best = (name: string) => Math.min(...rounds.map((r) => (r[name] as Run).cpu_us_per_frame));
  return {
    suite: "telemetry-ingest",
    node: process.version,
    store: DATABASE_URL ? "postgres" : "sqlite",
    devices: DEVICES,
    frames_per_second_per_device: RATE,
    seconds: SECONDS,
    load_average: { before: loadBefore.map(round), after: loadavg().map(round) },
    rounds,
    // One core of JavaScript at the lowest cost per frame measured: what the thread could absorb alone.
    frames_per_second_per_core: {
      goal: 30_000,
      perch: Math.round(1e6 / best("perch")),
      ...(compareRoot ? { compared: Math.round(1e6 / best("compared")) } : {}),
    },
  };
}
