/**
 * `npm run bench -- fleet` (issue 48): a fleet of `perch serve` nodes on one PostgreSQL database
 * (`PERCH_BENCH_DATABASE_URL` or `PERCH_TEST_DATABASE_URL`) behind a real HAProxy health-checking
 * `/readyz`, as docs/operations.md configures it.
 *
 * 1. `rolling`: BENCH_FLEET_DEVICES (40) light devices (the capacity benchmark's, bench/fleet-worker.ts,
 *    kept connected by the SDK's `StayConnected`) converse with an agent on the capacity benchmark's
 *    provider (answers at once; 1.2 s replies) while both nodes are restarted one after the other
 *    (SIGTERM: a drain; then started again): replies cut, turns lost, the longest time a device was
 *    without a node, `node.reconnect` → connected p50/p95, each drain's length.
 * 2. `kill`: the node holding most devices is killed (SIGKILL) under the same load: devices back on
 *    the other node (p50/p95), and nothing acknowledged lost: every reply a device was told whole
 *    (`TEXT_DONE assistant.text`) is in the stored transcripts (`voice.store_transcripts` on).
 * 3. `bus`: 3 nodes' buses (`PgEventBus`, the nodes' own code, in this process: the WebRTC of 600
 *    devices does not fit on two cores beside three nodes), 600 devices' telemetry each second
 *    published from the node holding each device, 100 phones watching devices held by other nodes:
 *    events and NOTIFYs per second, PostgreSQL's CPU, delivery p50/p99 across nodes (goal ≤ 300 ms).
 *
 * `fleet.max_cpu` is 0 here (the devices' processes share the two cores with the nodes: the bound
 * would refuse them, which is admission's test, not this one's).
 */
import { type ChildProcess, fork, spawn } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { loadavg, setPriority, tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { type BusMessage, PgEventBus } from "../src/bus/index.ts";
import { encodedAudio } from "./capacity.ts";
import type { FleetCollected, FleetCommand } from "./fleet-worker.ts";
import { freshPgDatabase, ROOT, round, type Server, startServer } from "./support.ts";

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

async function freePort(): Promise<number> {
  const s = createServer().listen(0, "127.0.0.1");
  await new Promise((r) => s.once("listening", r));
  const { port } = s.address() as { port: number };
  await new Promise((r) => s.close(r));
  return port;
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

class Devices {
  readonly child: ChildProcess;
  private readonly waiting = new Map<number, (r: { type: string; id: number }) => void>();
  private next = 0;

  constructor(env: Record<string, string>) {
    this.child = fork(join(ROOT, "bench/fleet-worker.ts"), [], {
      execArgv: ["--disable-warning=ExperimentalWarning"],
      env: { ...process.env, ...env },
      stdio: ["ignore", "inherit", "inherit", "ipc"],
    });
    if (this.child.pid !== undefined) setPriority(this.child.pid, 10);
    this.child.on("message", (r: { type: string; id: number }) => {
      const done = this.waiting.get(r.id);
      this.waiting.delete(r.id);
      done?.(r);
    });
  }

  ask<R>(command: FleetCommand): Promise<R> {
    const id = ++this.next;
    return new Promise((resolve) => {
      this.waiting.set(id, resolve as (r: { type: string; id: number }) => void);
      this.child.send({ ...command, id });
    });
  }

  tell(command: FleetCommand): void {
    this.child.send(command);
  }
}

async function collect(devices: Devices[]): Promise<FleetCollected> {
  const all = await Promise.all(devices.map((d) => d.ask<FleetCollected>({ type: "collect", id: 0 })));
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
  const provider = fork(join(ROOT, "bench/capacity-provider.ts"), [], { stdio: ["ignore", "pipe", "inherit", "ipc"] });
  const providerUrl = await new Promise<string>((resolve) => provider.stdout!.once("data", (c: Buffer) => resolve(c.toString().trim())));
  const config = join(dir, "perch.json");
  writeFileSync(
    config,
    JSON.stringify({
      rate_limits: { login_per_key: 0, login_per_address: 0, device_token_per_device: 0, offer_per_key: 0 },
      providers: [{ id: "fake", kind: "openai-compatible", base_url: providerUrl, max_retries: 0 }],
      models: [
        { id: "chat", kind: "chat", provider: "fake", upstream_model: "scripted" },
        { id: "voice-tts", kind: "speech", provider: "fake", upstream_model: "tts-1" },
        { id: "voice-stt", kind: "transcription", provider: "fake", upstream_model: "whisper-1" },
      ],
      agents: [{ id: "talker", model: "chat", instructions: "Answer briefly.", voice: "alloy", speech_model: "voice-tts", transcription_model: "voice-stt" }],
      voice: { agent: "talker", store_transcripts: true },
      fleet: { max_cpu: 0, drain_timeout_s: 60 },
    }),
  );
  const ports = { a: await freePort(), b: await freePort() };
  const servers: Record<"a" | "b", Server | undefined> = { a: undefined, b: undefined };
  const env = { PERCH_DATA_DIR: dir, PERCH_DATABASE_URL: url, PERCH_CONFIG: config, PERCH_LOG_LEVEL: "warn" };
  const start = async (n: "a" | "b") => {
    servers[n] = await startServer({ ...env, PERCH_NODE_NAME: `node-${n}`, PERCH_PORT: String(ports[n]) });
  };
  await Promise.all([start("a"), start("b"), db.connect()]);
  const lbPort = await freePort();
  const lb = `http://127.0.0.1:${lbPort}`;
  const cfg = join(dir, "haproxy.cfg");
  const servers_ = (check: string) =>
    `  option httpchk\n  http-check send meth GET uri ${check} ver HTTP/1.1 hdr host perch.internal\n  default-server inter 250ms fall 1 rise 1\n  server a 127.0.0.1:${ports.a} check\n  server b 127.0.0.1:${ports.b} check\n`;
  writeFileSync(
    cfg,
    `defaults\n  mode http\n  timeout connect 2s\n  timeout client 60s\n  timeout server 60s\n  timeout check 2s\n  option http-buffer-request\n  retries 3\n  option redispatch 1\n  retry-on conn-failure empty-response 503\nfrontend perch\n  bind 127.0.0.1:${lbPort}\n  use_backend any if { nbsrv(nodes) eq 0 }\n  default_backend nodes\nbackend nodes\n  balance leastconn\n${servers_("/readyz")}backend any\n  balance leastconn\n${servers_("/healthz")}`,
  );
  const proxy = spawn("haproxy", ["-db", "-f", cfg], { stdio: ["ignore", "ignore", "inherit"] });
  const devices: Devices[] = [];
  try {
    await until(async () => (await readyz(lb)) === 200, 10_000);
    await Promise.all([servers.a!.settled(), servers.b!.settled()]);
    const serverKey = ((await (await fetch(`${lb}/server-info`)).json()) as { public_key: string }).public_key;
    const audioFile = await encodedAudio(dir);
    for (let i = 0; i < PROCESSES; i++)
      devices.push(new Devices({ FLEET_URL: lb, PERCH_SERVER_KEY: serverKey, CROWD_BIND: "127.0.0.1", CAPACITY_AUDIO: audioFile }));
    await Promise.all(devices.map((d, i) => d.ask({ type: "connect", count: Math.floor(DEVICES / PROCESSES) + (i < DEVICES % PROCESSES ? 1 : 0), id: 0 })));
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
    const back = async () => (await Promise.all(devices.map((d) => d.ask<{ back: number }>({ type: "status", id: 0 })))).reduce((n, s) => n + s.back, 0);
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
