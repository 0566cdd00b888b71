/**
 * `npm run bench -- events`: `GET /side-control/events` under load. Devices are node-datachannel
 * WebRTC devices in worker processes (`crowd.ts`) that report battery telemetry; subscribers are
 * Side Control sessions reading the event stream with `fetch` in this process. Latency is from the
 * device's observation time (set as it sends) to the `telemetry` event being parsed here.
 *
 * Runs: many devices reporting once a second with one subscriber each, against the same devices
 * with no subscriber (the server's CPU compared); one device reporting 10 times a second with
 * many subscribers. Each on one node (SQLite) and, when a PostgreSQL URL is given
 * (`PERCH_BENCH_DATABASE_URL` or `PERCH_TEST_DATABASE_URL`), on two nodes sharing it: devices on
 * node A, subscribers on node B.
 *
 * Sizes (environment): BENCH_EVENTS_DEVICES (2000), BENCH_EVENTS_SUBSCRIBERS (1000),
 * BENCH_EVENTS_WINDOW_S (20), BENCH_EVENTS_CROWD_PROCESSES (4), BENCH_EVENTS_BUS_RATE (2000 messages a second
 * for the bus alone), BENCH_EVENTS_ONLY (`one node`, `two nodes`, `bus` or `conversations`: that part
 * only). The conversation runs (live path across nodes, reads at 1,000,000 entries) are in conversations.ts.
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { monitorEventLoopDelay } from "node:perf_hooks";
import { encodeKey, generateKeyPair, type KeyPair } from "../src/crypto/keys.ts";
import { PerchClient } from "../src/sdk/client.ts";
import { parseSseBlock, sseBlocks } from "../test/support/sse.ts";
import { conversationRuns } from "./conversations.ts";
import { Crowd } from "./crowd.ts";
import { benchConfig, freshPgDatabase, percentiles, round, type Server, startServer, treeCpuSeconds } from "./support.ts";

const DEVICES = Number(process.env.BENCH_EVENTS_DEVICES ?? 2000);
const SUBSCRIBERS = Number(process.env.BENCH_EVENTS_SUBSCRIBERS ?? 1000);
const WINDOW_S = Number(process.env.BENCH_EVENTS_WINDOW_S ?? 20);
const PROCESSES = Number(process.env.BENCH_EVENTS_CROWD_PROCESSES ?? 4);
const PG_URL = process.env.PERCH_BENCH_DATABASE_URL || process.env.PERCH_TEST_DATABASE_URL || undefined;
const SETTLE_MS = 3_000;

interface Nodes {
  /** Where the devices connect. */
  devices: Server;
  /** Where the subscribers stream from (the same node, or the other one). */
  phones: Server;
  pids: number[];
  stop(): Promise<void>;
}

async function startNodes(kind: "one node" | "two nodes"): Promise<Nodes> {
  const dir = mkdtempSync(join(tmpdir(), "perch-bench-events-"));
  const limits = { side_control_sessions_per_device: 100_000, side_control_sessions_per_controller: 100_000 };
  const env = { ...benchConfig(dir, { limits, webrtc: { max_connections: 5000 } }), PERCH_DATA_DIR: dir, PERCH_LOG_LEVEL: "warn" };
  if (kind === "one node") {
    const a = await startServer({ ...env, PERCH_NODE_NAME: "bench-a" });
    const stop = async () => {
      await a.stop();
      rmSync(dir, { recursive: true, force: true });
    };
    return { devices: a, phones: a, pids: [a.child.pid!], stop };
  }
  const db = await freshPgDatabase(PG_URL!);
  const a = await startServer({ ...env, PERCH_DATABASE_URL: db, PERCH_NODE_NAME: "bench-a" });
  const b = await startServer({ ...env, PERCH_DATABASE_URL: db, PERCH_NODE_NAME: "bench-b" });
  return {
    devices: a,
    phones: b,
    pids: [a.child.pid!, b.child.pid!],
    stop: async () => {
      await Promise.all([a.stop(), b.stop()]);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Runs `fn` over `concurrency` lanes. */
async function lanes<T>(items: T[], concurrency: number, fn: (item: T, i: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < items.length) {
        const i = next++;
        await fn(items[i] as T, i);
      }
    }),
  );
}

/** One device's key and its primary session on the devices' node. */
async function devices(nodes: Nodes, count: number): Promise<Array<{ keyPair: KeyPair; client: PerchClient }>> {
  const out: Array<{ keyPair: KeyPair; client: PerchClient }> = [];
  await lanes(
    Array.from({ length: count }, () => generateKeyPair()),
    16,
    async (keyPair) => {
      const client = new PerchClient({ baseUrl: nodes.devices.url, keyPair });
      await client.login();
      out.push({ keyPair, client });
    },
  );
  return out;
}

/** A Side Control session on the phones' node for `device`. */
async function phoneSession(nodes: Nodes, device: PerchClient): Promise<string> {
  const token = await device.createDeviceToken();
  const phone = new PerchClient({ baseUrl: nodes.phones.url, keyPair: generateKeyPair() });
  return (await phone.login({ deviceToken: token.token })).access_token;
}

/** The event streams: telemetry latencies recorded while `recording`. */
class Subscribers {
  readonly latencies: number[] = [];
  recording = false;
  events = 0;
  failed = 0;
  open = 0;
  private readonly aborts: AbortController[] = [];

  async open1(url: string, bearer: string): Promise<void> {
    const abort = new AbortController();
    this.aborts.push(abort);
    const res = await fetch(`${url}/side-control/events`, { headers: { authorization: `Bearer ${bearer}` }, signal: abort.signal });
    if (res.status !== 200 || !res.body) {
      this.failed++;
      return;
    }
    this.open++;
    (async () => {
      for await (const block of sseBlocks(res.body as ReadableStream<Uint8Array>)) this.parse(block);
    })()
      .catch(() => {})
      .finally(() => this.open--);
  }

  private parse(block: string): void {
    const { event, data: text } = parseSseBlock(block);
    if (event !== "telemetry" || text === undefined) return;
    this.events++;
    if (!this.recording) return;
    const now = Date.now();
    const data = JSON.parse(text) as { values: Array<{ observed_at_unix_ms: number }> };
    for (const v of data.values) this.latencies.push(now - v.observed_at_unix_ms);
  }

  close(): void {
    for (const a of this.aborts) a.abort();
  }
}

/** The machine's CPU time so far (`/proc/stat`, in ticks): all states, and idle. */
function machineCpu(): { total: number; idle: number } {
  const f = readFileSync("/proc/stat", "utf8").split("\n")[0]!.trim().split(/\s+/).slice(1).map(Number);
  return { total: f.slice(0, 8).reduce((a, b) => a + b, 0), idle: (f[3] ?? 0) + (f[4] ?? 0) };
}

/**
 * Reports at `fps` for the window; the servers' CPU (cores used on average) over it, how busy the
 * whole machine was (other guests' work included), and this process's event-loop delay (a late
 * read here adds to every latency measured).
 */
async function window(crowd: Crowd, nodes: Nodes, fps: number, subscribers?: Subscribers, probe?: string) {
  crowd.setRate(fps);
  await new Promise((r) => setTimeout(r, SETTLE_MS));
  const sentBefore = (await crowd.stats()).sent;
  const cpuBefore = nodes.pids.reduce((n, p) => n + treeCpuSeconds(p), 0);
  const machineBefore = machineCpu();
  const loop = monitorEventLoopDelay({ resolution: 10 });
  loop.enable();
  if (subscribers) subscribers.recording = true;
  // How far behind the store is: the newest stored sample of one device, read through the API.
  const lags: number[] = [];
  const until = Date.now() + WINDOW_S * 1000;
  while (Date.now() < until) {
    if (probe) {
      const res = await fetch(`${nodes.phones.url}/side-control/telemetry/latest?fields=battery.percent`, { headers: { authorization: `Bearer ${probe}` } });
      const latest = (await res.json()) as { values?: Array<{ observed_at_unix_ms: number }> };
      const t = latest.values?.[0]?.observed_at_unix_ms;
      if (t) lags.push(Date.now() - t);
    }
    await new Promise((r) => setTimeout(r, 250));
  }
  if (subscribers) subscribers.recording = false;
  loop.disable();
  const cpu = nodes.pids.reduce((n, p) => n + treeCpuSeconds(p), 0) - cpuBefore;
  const machine = machineCpu();
  const sent = (await crowd.stats()).sent - sentBefore;
  crowd.setRate(0);
  await new Promise((r) => setTimeout(r, 1000));
  return {
    server_cores: round(cpu / WINDOW_S),
    reports_sent: sent,
    machine_busy_percent: round((1 - (machine.idle - machineBefore.idle) / Math.max(1, machine.total - machineBefore.total)) * 100),
    bench_loop_delay_p99_ms: round(loop.percentile(99) / 1e6),
    // The newest stored sample's age (one report interval of it is the device's own period).
    ...(probe ? { store_lag_ms: percentiles(lags) } : {}),
  };
}

function latency(s: Subscribers) {
  const { p50, p99 } = percentiles(s.latencies);
  return {
    p50_ms: p50,
    p99_ms: p99,
    max_ms: round(s.latencies.reduce((m, l) => Math.max(m, l), 0)),
    samples: s.latencies.length,
    over_1s: s.latencies.filter((l) => l > 1000).length,
  };
}

async function withCrowd<T>(nodes: Nodes, fn: (crowd: Crowd) => Promise<T>): Promise<T> {
  const serverKey = (await new PerchClient({ baseUrl: nodes.devices.url, keyPair: generateKeyPair() }).serverInfo()).public_key;
  const crowd = new Crowd(PROCESSES, { url: nodes.devices.url, serverKey, bindAddress: new URL(nodes.devices.url).hostname });
  try {
    return await fn(crowd);
  } finally {
    await crowd.stop().catch(() => crowd.kill());
  }
}

/** Many devices, once a second: with no subscriber, then one subscriber each. */
async function manyDevices(kind: "one node" | "two nodes") {
  const nodes = await startNodes(kind);
  try {
    const all = await devices(nodes, DEVICES);
    const bearers = new Array<string>(all.length);
    await lanes(all, 16, async (d, i) => {
      bearers[i] = await phoneSession(nodes, d.client);
    });
    return await withCrowd(nodes, async (crowd) => {
      const connected = await crowd.connect(
        all.length,
        16,
        Date.now() + 240_000,
        all.map((d) => encodeKey(d.keyPair.privateKey)),
      );
      const without = await window(crowd, nodes, 1, undefined, bearers[0]);
      const subs = new Subscribers();
      await lanes(bearers, 32, (b) => subs.open1(nodes.phones.url, b));
      const withSubs = await window(crowd, nodes, 1, subs, bearers[0]);
      subs.close();
      return {
        name: `${kind}: ${connected.ok} devices reporting once a second, one subscriber each`,
        devices_connected: connected.ok,
        subscribers_open: subs.open + 0,
        subscribers_refused: subs.failed,
        latency: latency(subs),
        no_subscribers: without,
        with_subscribers: withSubs,
        cpu_increase_percent: round(((withSubs.server_cores - without.server_cores) / Math.max(0.001, without.server_cores)) * 100),
        server_warnings: [...new Set([nodes.devices, nodes.phones])].map((n) => n.warnings),
      };
    });
  } finally {
    await nodes.stop();
  }
}

/** One device, 10 reports a second, many subscribers (a session each). */
async function manySubscribers(kind: "one node" | "two nodes") {
  const nodes = await startNodes(kind);
  try {
    const [device] = await devices(nodes, 1);
    const bearers: string[] = [];
    for (let i = 0; i < SUBSCRIBERS; i++) bearers.push(await phoneSession(nodes, device!.client));
    return await withCrowd(nodes, async (crowd) => {
      const connected = await crowd.connect(1, 1, undefined, [encodeKey(device!.keyPair.privateKey)]);
      const subs = new Subscribers();
      await lanes(bearers, 32, (b) => subs.open1(nodes.phones.url, b));
      const w = await window(crowd, nodes, 10, subs);
      subs.close();
      return {
        name: `${kind}: 1 device reporting 10 times a second, ${subs.open} subscribers`,
        devices_connected: connected.ok,
        subscribers_refused: subs.failed,
        latency: latency(subs),
        ...w,
      };
    });
  } finally {
    await nodes.stop();
  }
}

/** The bus alone: two PostgreSQL buses (two nodes' listening connections), messages of telemetry's size from one to the other. */
async function busAlone(perSecond: number) {
  const { PgEventBus } = await import("../src/bus/index.ts");
  const url = await freshPgDatabase(PG_URL!);
  const a = new PgEventBus({ url });
  const b = new PgEventBus({ url });
  await Promise.all([a.start(), b.start()]);
  const lat: number[] = [];
  const keys = Array.from({ length: 300 }, (_, i) => `device:${String(i).padStart(44, "k")}`);
  for (const k of keys) b.subscribe(k, { message: (m) => lat.push(Date.now() - (m.t as number)) });
  let sent = 0;
  const perTick = Math.max(1, Math.round(perSecond / 20));
  const timer = setInterval(() => {
    for (let i = 0; i < perTick; i++) {
      const k = keys[sent % keys.length] as string;
      a.publish(k, { kind: "telemetry", t: Date.now(), values: [["battery.percent", 50, Date.now()]] });
      sent++;
    }
  }, 50);
  await new Promise((r) => setTimeout(r, WINDOW_S * 1000));
  clearInterval(timer);
  await new Promise((r) => setTimeout(r, 2000));
  await Promise.all([a.close(), b.close()]);
  return {
    name: `the PostgreSQL bus alone: ${perTick * 20} messages a second between two nodes' connections`,
    sent,
    received: lat.length,
    latency_ms: percentiles(lat),
  };
}

export async function eventsBench(): Promise<unknown> {
  const only = process.env.BENCH_EVENTS_ONLY;
  const kinds = (PG_URL ? (["one node", "two nodes"] as const) : (["one node"] as const)).filter((k) => !only || k === only);
  const conversations = !only || only === "conversations";
  const runs: unknown[] = [];
  for (const kind of kinds) {
    for (const run of [manyDevices, manySubscribers]) {
      const r = await run(kind);
      // Each run as it ends (the whole takes minutes).
      process.stderr.write(`${JSON.stringify(r)}\n`);
      runs.push(r);
    }
  }
  if (PG_URL && (!only || only === "bus")) runs.push(await busAlone(Number(process.env.BENCH_EVENTS_BUS_RATE ?? 2000)));
  if (conversations) runs.push(...(await conversationRuns(PG_URL, freshPgDatabase)));
  return {
    suite: "events",
    window_s: WINDOW_S,
    note: PG_URL ? undefined : "two nodes skipped: set PERCH_BENCH_DATABASE_URL (or PERCH_TEST_DATABASE_URL) to a PostgreSQL server",
    goals: { p99_ms: 1000, cpu_increase_percent: 10 },
    runs,
  };
}
