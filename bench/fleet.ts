import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { type BusMessage, PgEventBus } from "../src/bus/index.ts";
import { startCapacityProvider, startHaproxy, talkerOn } from "../test/support/fleet.ts";
import { freeTcpPort } from "../test/support/server.ts";
import { encodedAudio } from "./capacity.ts";
import { DeviceProcess } from "./device-process.ts";
import type { FleetCollected, FleetCommand } from "./fleet-worker.ts";
import { freshPgDatabase, round, type Server, startServer } from "./support.ts";

const PG_URL = process.env.PERCH_BENCH_DATABASE_URL || process.env.PERCH_TEST_DATABASE_URL || undefined;
const DEVICES = Number(process.env.BENCH_FLEET_DEVICES ?? 40);
const PROCESSES = 2;
const WARM_S = Number(process.env.BENCH_FLEET_WARM_S ?? 15);
const BUS_DEVICES = 600;
const BUS_PHONES = 100;
const BUS_SECONDS = Number(process.env.BENCH_FLEET_BUS_S ?? 10);

function pct(values: number[], p: number): number | null {
  if (values.length === 0) return null;
  const s = [...values].sort((a, b) => a - b);
  return round(s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!);
}

/** CPU seconds of every process whose name is `name` (PostgreSQL's backends), from /proc. */
function cpuOf(name: string): number {
  let total = 0;
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      if (stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")")) !== name) continue;
      const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      total += (Number(f[11]) + Number(f[12])) / 100;
    } catch {}
  }
  return total;
}

type Devices = DeviceProcess<FleetCommand, FleetCollected | { type: "connected" | "status"; id: number }>;

async function collect(devices: Devices[]): Promise<FleetCollected> {
  const all = await Promise.all(devices.map((d) => d.ask<FleetCollected>({ type: "collect" })));
  const sum: FleetCollected = { ...all[0]!, handOver: [], back: [], backAt: [], longestWithout: 0 };
  for (const k of ["questions", "questionsCut", "answered", "replies", "cut", "cutByClose", "failed", "lost", "open", "refused"] as const) sum[k] = 0;
  for (const c of all) {
    for (const k of ["questions", "questionsCut", "answered", "replies", "cut", "cutByClose", "failed", "lost", "open", "refused"] as const) sum[k] += c[k];
    sum.handOver.push(...c.handOver);
    sum.back.push(...c.back);
    sum.backAt.push(...c.backAt);
    sum.longestWithout = Math.max(sum.longestWithout, c.longestWithout);
  }
  return sum;
}

function turns(c: FleetCollected) {
  return {
    questions: c.questions,
    answered: c.answered,
    replies_cut: c.cut,
    replies_cut_by_the_connection_ending: c.cutByClose,
    replies_failed: c.failed,
    turns_lost: c.lost,
    questions_cut_while_spoken: c.questionsCut,
    offers_refused: c.refused,
  };
}

async function readyz(url: string): Promise<number> {
  return (await fetch(`${url}/readyz`).catch(() => undefined))?.status ?? 0;
}

async function until(check: () => Promise<boolean> | boolean, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await check()) return true;
    await new Promise((r) => setTimeout(r, 100));
  }
  return false;
}

/** Part 3: the bus between three nodes, at the level of the nodes' buses. */
async function busBench(url: string): Promise<unknown> {
  const buses = await Promise.all(
    [0, 1, 2].map(async (i) => {
      const bus = new PgEventBus({ url, applicationName: `bench node ${i}` });
      await bus.start();
      return bus;
    }),
  );
  const latencies: number[] = [];
  let delivered = 0;
  // Each phone watches a device held by another node than its own.
  for (let p = 0; p < BUS_PHONES; p++) {
    const device = (p * 7) % BUS_DEVICES;
    const holder = device % 3;
    buses[(holder + 1 + (p % 2)) % 3]!.subscribe(`device:bench-${device}`, {
      message: (m: BusMessage) => {
        delivered++;
        latencies.push(Date.now() - (m.at as number));
      },
    });
  }
  const before = buses.map((b) => ({ ...b.stats }));
  const pgBefore = cpuOf("postgres");
  const started = performance.now();
  let published = 0;
  // Every device once a second, spread over the second in 20 ms slices.
  await new Promise<void>((resolve) => {
    let slice = 0;
    const slices = (BUS_SECONDS * 1000) / 20;
    const timer = setInterval(() => {
      const from = Math.floor(((slice % 50) * BUS_DEVICES) / 50);
      const to = Math.floor((((slice % 50) + 1) * BUS_DEVICES) / 50);
      for (let d = from; d < to; d++) {
        buses[d % 3]!.publish(`device:bench-${d}`, {
          kind: "telemetry",
          values: [
            ["battery_percent", 50 + (d % 50), Date.now()],
            ["rssi_dbm", -60, Date.now()],
          ],
          at: Date.now(),
        });
        published++;
      }
      if (++slice >= slices) {
        clearInterval(timer);
        resolve();
      }
    }, 20);
  });
  await new Promise((r) => setTimeout(r, 500));
  const seconds = (performance.now() - started) / 1000;
  const pgCpu = cpuOf("postgres") - pgBefore;
  const after = buses.map((b) => ({ ...b.stats }));
  const sum = (k: keyof PgEventBus["stats"]) => after.reduce((n, s, i) => n + (s[k] - before[i]![k]), 0);
  for (const b of buses) await b.close();
  return {
    note: "simulated at the bus level: three nodes' PgEventBus in one process, publishing for 600 devices (no WebRTC)",
    devices: BUS_DEVICES,
    phones: BUS_PHONES,
    seconds: round(seconds),
    events_per_second: round(published / seconds),
    notifies_per_second: round(sum("notifies") / seconds),
    notify_bytes_per_second: round(sum("payloadBytes") / seconds),
    batches_through_table: sum("spilled"),
    events_received_by_nodes_per_second: round(sum("received") / seconds),
    phone_deliveries: delivered,
    postgres_cpu_percent_of_one_core: round((pgCpu / seconds) * 100),
    delivery_ms: { p50: pct(latencies, 50), p99: pct(latencies, 99), max: pct(latencies, 100) },
    goal_p99_ms: 300,
  };
}

export async function fleetBench(): Promise<unknown> {
  if (!PG_URL) return { skipped: "set PERCH_BENCH_DATABASE_URL (or PERCH_TEST_DATABASE_URL) to a PostgreSQL server" };
  const dir = mkdtempSync(join(tmpdir(), "perch-fleet-"));
  const url = await freshPgDatabase(PG_URL);
  const db = new pg.Client({ connectionString: url });
  const { url: providerUrl, process: provider } = await startCapacityProvider();
  const config = join(dir, "perch.json");
  const talker = talkerOn(providerUrl);
  writeFileSync(config, JSON.stringify({ ...talker, voice: { ...talker.voice, store_transcripts: true }, fleet: { max_cpu: 0, drain_timeout_s: 60 } }));
  const ports = { a: await freeTcpPort(), b: await freeTcpPort() };
  const servers: Record<"a" | "b", Server | undefined> = { a: undefined, b: undefined };
  const env = { PERCH_DATA_DIR: dir, PERCH_DATABASE_URL: url, PERCH_CONFIG: config, PERCH_LOG_LEVEL: "warn" };
  const start = async (n: "a" | "b") => {
    servers[n] = await startServer({ ...env, PERCH_NODE_NAME: `node-${n}`, PERCH_PORT: String(ports[n]) });
  };
  await Promise.all([start("a"), start("b"), db.connect()]);
  const lbPort = await freeTcpPort();
  const lb = `http://127.0.0.1:${lbPort}`;
  const proxy = startHaproxy(dir, lbPort, [
    ["a", ports.a],
    ["b", ports.b],
  ]);
  const devices: Devices[] = [];
  try {
    await until(async () => (await readyz(lb)) === 200, 10_000);
    await Promise.all([servers.a!.settled(), servers.b!.settled()]);
    const serverKey = ((await (await fetch(`${lb}/server-info`)).json()) as { public_key: string }).public_key;
    const audioFile = await encodedAudio(dir);
    for (let i = 0; i < PROCESSES; i++)
      devices.push(
        new DeviceProcess("bench/fleet-worker.ts", { FLEET_URL: lb, PERCH_SERVER_KEY: serverKey, CROWD_BIND: "127.0.0.1", CAPACITY_AUDIO: audioFile }),
      );
    await Promise.all(devices.map((d, i) => d.ask({ type: "connect", count: Math.floor(DEVICES / PROCESSES) + (i < DEVICES % PROCESSES ? 1 : 0) })));
    for (const d of devices) d.tell({ type: "talk" });
    await new Promise((r) => setTimeout(r, WARM_S * 1000));
    const warm = await collect(devices);

    // 1. A rolling restart.
    const drains: Array<{ node: string; drain_s: number; exit: number | null }> = [];
    const rollStarted = performance.now();
    for (const n of ["a", "b"] as const) {
      const t0 = performance.now();
      const child = servers[n]!.child;
      const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
      child.kill("SIGTERM");
      const code = await exited;
      drains.push({ node: `node-${n}`, drain_s: round((performance.now() - t0) / 1000), exit: code });
      await start(n);
      await until(async () => (await readyz(`http://127.0.0.1:${ports[n]}`)) === 200, 30_000);
      await new Promise((r) => setTimeout(r, 2000));
    }
    await new Promise((r) => setTimeout(r, WARM_S * 1000));
    const rolling = await collect(devices);
    const rollingS = (performance.now() - rollStarted) / 1000;

    // 2. SIGKILL of the node holding most devices. What was told and stored until now, first.
    const storedNow = async () => Number((await db.query<{ n: string }>("select count(*) n from conversation_entries where role = 'assistant'")).rows[0]!.n);
    const preKill = await collect(devices);
    const toldBeforeKill = warm.replies + rolling.replies + preKill.replies;
    const storedBeforeKill = await storedNow();
    const held = (await db.query<{ node: string; n: string }>("select node, count(*) n from peer_runtime where online = 1 group by node")).rows;
    const victim = (held.sort((x, y) => Number(y.n) - Number(x.n))[0]?.node ?? "node-a") === "node-b" ? "b" : "a";
    const onVictim = Number(held.find((h) => h.node === `node-${victim}`)?.n ?? 0);
    const killedAt = Date.now();
    servers[victim]!.child.kill("SIGKILL");
    const back = async () =>
      (await Promise.all(devices.map((d) => d.ask<{ type: "status"; id: number; back: number }>({ type: "status" })))).reduce((n, s) => n + s.back, 0);
    // Every device on it notices (its liveness ping unanswered, or its WebRTC stack) and comes back.
    await until(async () => (await back()) >= onVictim, 90_000);
    await new Promise((r) => setTimeout(r, 3000));
    const killed = await collect(devices);
    await start(victim);
    await new Promise((r) => setTimeout(r, 3000));
    const tail = await collect(devices);
    const told = toldBeforeKill + killed.replies + tail.replies;
    const stored = await storedNow();

    const bus = await busBench(url);
    return {
      suite: "fleet",
      load: { loadavg: loadavg().map(round), devices: DEVICES, nodes: 2, liveness_ms: Number(process.env.BENCH_FLEET_LIVENESS_MS ?? 10_000) },
      baseline: { ...turns(warm), seconds: WARM_S, note: "the same devices before any restart: what the load alone does" },
      rolling: {
        ...turns(rolling),
        seconds: round(rollingS),
        drains,
        longest_without_node_ms: round(rolling.longestWithout),
        node_reconnect_to_connected_ms: { n: rolling.handOver.length, p50: pct(rolling.handOver, 50), p95: pct(rolling.handOver, 95) },
        lost_connection_to_connected_ms: { n: rolling.back.length, p50: pct(rolling.back, 50), p95: pct(rolling.back, 95) },
      },
      kill: {
        node: `node-${victim}`,
        devices_on_it: onVictim,
        ...turns(killed),
        back_on_other_node_since_the_kill_ms: (() => {
          const since = killed.backAt.map((at) => at - killedAt);
          return { n: since.length, p50: pct(since, 50), p95: pct(since, 95), max: pct(since, 100) };
        })(),
        noticed_to_back_ms: { p50: pct(killed.back, 50), p95: pct(killed.back, 95) },
        before_the_kill: { replies_heard_whole: toldBeforeKill, replies_stored: storedBeforeKill },
        replies_heard_whole: told,
        replies_stored: stored,
        acknowledged_lost: Math.max(0, told - stored),
      },
      bus,
    };
  } finally {
    for (const d of devices) {
      d.tell({ type: "exit" });
    }
    await new Promise((r) => setTimeout(r, 500));
    proxy.kill("SIGTERM");
    await Promise.all([servers.a?.stop(), servers.b?.stop()]);
    provider.kill();
    await db.end().catch(() => {});
  }
}
