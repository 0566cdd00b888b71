/**
 * `npm run bench -- webrtc`: the WebRTC transport of one `perch serve` process. Latency and
 * throughput are measured by the device SDK (`@roamhq/wrtc`); the crowd (devices held at once,
 * telemetry ingest) by node-datachannel devices in separate worker processes.
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { generateKeyPair } from "../src/crypto/keys.ts";
import { PerchConnection } from "../src/sdk/webrtc.ts";
import { Crowd, type CrowdStats } from "./crowd.ts";
import { benchConfig, round, type Server, startServer, treeCpuSeconds } from "./support.ts";

const env = (name: string, fallback: number) => Number(process.env[name] ?? fallback);
const CONNECTS = env("BENCH_WEBRTC_CONNECTS", 30);
const PINGS = env("BENCH_WEBRTC_PINGS", 300);
const REQUESTS = env("BENCH_WEBRTC_REQUESTS", 300);
const SPEED_BYTES = env("BENCH_WEBRTC_SPEED_MB", 8) * 1024 * 1024;
const PROCESSES = env("BENCH_WEBRTC_CROWD_PROCESSES", 4);
const STEPS = (process.env.BENCH_WEBRTC_CROWD_STEPS ?? "250,500,1000,1500,2000,2500")
  .split(",")
  .map(Number)
  .filter((n) => n > 0);
const HOLD_S = env("BENCH_WEBRTC_CROWD_HOLD_S", 6);
/** A step whose devices are not all connected by then is over (no connect starts after it). */
const STEP_CONNECT_S = env("BENCH_WEBRTC_CROWD_STEP_CONNECT_S", 30);
/** Connects in flight per worker process while the crowd grows. */
const CONNECT_CONCURRENCY = env("BENCH_WEBRTC_CROWD_CONCURRENCY", 16);
const FLOOD_DEVICES = env("BENCH_WEBRTC_FLOOD_DEVICES", 300);
const FLOOD_RATE = env("BENCH_WEBRTC_FLOOD_RATE", 100);
const FLOOD_OBSERVATIONS = env("BENCH_WEBRTC_FLOOD_OBSERVATIONS", 1);
const FLOOD_S = env("BENCH_WEBRTC_FLOOD_S", 10);
const MAX_CONNECTIONS = env("BENCH_WEBRTC_MAX_CONNECTIONS", 10_000);
/** Samples per battery observation the crowd sends (percent and charging). */
const SAMPLES_PER_OBSERVATION = 2;

const GOALS = {
  offer_handling_ms_p50: 15,
  connect_to_ready_ms_p50_loopback: 100,
  concurrent_devices: 1000,
  telemetry_frames_per_second: 30_000,
  http_stream_to_tcp_ratio: 0.5,
};

function pct(values: number[]) {
  const s = values.filter((v) => Number.isFinite(v)).sort((a, b) => a - b);
  const at = (p: number) => round(s[Math.min(s.length - 1, Math.floor(p * s.length))] ?? Number.NaN);
  return { p50: at(0.5), p99: at(0.99), n: s.length };
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * The server's Prometheus counters (`name` or `name{labels}` → value), and `at`: when they were
 * read, taken as the middle of the request (a busy server can take seconds to answer).
 */
async function metrics(server: Server): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  let text = "";
  const sent = performance.now();
  try {
    text = await (await fetch(`${server.url}/metrics`, { signal: AbortSignal.timeout(8_000) })).text();
  } catch {
    return out; // a server too busy to answer: every figure from it is unknown
  }
  out.set("at", (sent + performance.now()) / 2);
  for (const line of text.split("\n")) {
    const m = /^(perch_(?:telemetry|webrtc)_[a-z_]+(?:\{[^}]*\})?) (\S+)$/.exec(line);
    if (m) out.set(m[1]!, Number(m[2]));
  }
  return out;
}

function drops(before: Map<string, number>, after: Map<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of after) {
    const m = /^perch_telemetry_frames_dropped_total\{reason="([^"]+)"\}$/.exec(k);
    if (m && v - (before.get(k) ?? 0) > 0) out[m[1]!] = v - (before.get(k) ?? 0);
  }
  return out;
}

/** Waits (up to 30 s) until the server holds no connection. */
async function drained(server: Server): Promise<void> {
  for (let i = 0; i < 60; i++) {
    if ((await metrics(server)).get("perch_webrtc_connections") === 0) return;
    await sleep(500);
  }
}

function processStatus(pid: number): { rssMb: number; threads: number; fds: number } {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const field = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+)`, "m").exec(status)?.[1] ?? Number.NaN);
  return { rssMb: round(field("VmRSS") / 1024), threads: field("Threads"), fds: readdirSync(`/proc/${pid}/fd`).length };
}

/** The per-second rate of counter `name` between two readings. */
function rate(before: Map<string, number>, after: Map<string, number>, name: string): number {
  return round(((after.get(name) ?? Number.NaN) - (before.get(name) ?? Number.NaN)) / (((after.get("at") ?? 0) - (before.get("at") ?? 0)) / 1000));
}

/** UDP receive errors of the whole machine (`/proc/net/snmp`): datagrams the kernel dropped. */
function udpErrors(): { in_errors: number; rcvbuf_errors: number } {
  const lines = readFileSync("/proc/net/snmp", "utf8")
    .split("\n")
    .filter((l) => l.startsWith("Udp:"));
  const names = lines[0]!.split(/\s+/);
  const values = lines[1]!.split(/\s+/).map(Number);
  const get = (n: string) => values[names.indexOf(n)] ?? 0;
  return { in_errors: get("InErrors"), rcvbuf_errors: get("RcvbufErrors") };
}

/** CPU ticks (1/100 s) of each thread of `pid`, summed by thread name. */
function threadTicks(pid: number): Map<string, number> {
  const out = new Map<string, number>();
  for (const task of readdirSync(`/proc/${pid}/task`)) {
    try {
      const stat = readFileSync(`/proc/${pid}/task/${task}/stat`, "utf8");
      const name = stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")"));
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      out.set(name, (out.get(name) ?? 0) + Number(fields[11]) + Number(fields[12]));
    } catch {
      // The thread ended meanwhile.
    }
  }
  return out;
}

/** Waits `ms` and returns the CPU, in % of one core, of the server (in all, and its busiest threads) and of the crowd. */
async function cpuDuring(serverPid: number, crowdPids: number[], ms: number) {
  const server0 = treeCpuSeconds(serverPid);
  const crowd0 = crowdPids.map((p) => treeCpuSeconds(p));
  const threads0 = threadTicks(serverPid);
  const machine0 = machineCpu();
  const started = performance.now();
  await sleep(ms);
  const machine1 = machineCpu();
  const s = (performance.now() - started) / 1000;
  // Ticks are hundredths of a second: ticks per second is the percentage of one core.
  const deltas = [...threadTicks(serverPid)].map(([name, ticks]) => [name, round((ticks - (threads0.get(name) ?? 0)) / s)] as const);
  const threads = Object.fromEntries(
    deltas
      .filter(([, percent]) => percent >= 1)
      .sort((a, b) => b[1] - a[1])
      .slice(0, 5),
  );
  return {
    server: round(((treeCpuSeconds(serverPid) - server0) / s) * 100),
    serverThreads: threads,
    crowd: round((crowdPids.reduce((n, p, i) => n + treeCpuSeconds(p) - crowd0[i]!, 0) / s) * 100),
    // The whole machine over the window: how busy its cores were, and how much the hypervisor gave elsewhere.
    machine: {
      busy_percent: round(100 - ((machine1.idle - machine0.idle) / Math.max(1, machine1.total - machine0.total)) * 100),
      steal_percent: stealPercent(machine0, machine1),
    },
  };
}

interface Step {
  devices: number;
  held: boolean;
  connected: number;
  connect_failed: number;
  connect_not_started: number;
  connect_retried: number;
  connects_per_second: number;
  connect_to_ready_ms: ReturnType<typeof pct>;
  offer_handling_ms_server: ReturnType<typeof pct>;
  server_connections: number;
  store_online: number;
  telemetry_frames_per_second: number;
  server_rss_mb: number;
  server_fds: number;
  server_threads: number;
  server_cpu_percent_of_one_core: number;
  /** The server's busiest threads: the JavaScript one (MainThread), libjuice's UDP mux, usrsctp's timer, libdatachannel's workers. */
  server_threads_cpu_percent: Record<string, number>;
  crowd_cpu_percent: number;
  machine: { busy_percent: number; steal_percent: number };
  crowd: CrowdStats;
  why_not_held?: string;
}

export async function webrtcBench(): Promise<unknown> {
  const dir = mkdtempSync(join(tmpdir(), "perch-bench-webrtc-"));
  const server = await startServer({
    PERCH_DATA_DIR: dir,
    PERCH_LOG_LEVEL: "warn",
    ...benchConfig(dir, {
      rate_limits: { login_per_key: 0, login_per_address: 0, device_token_per_device: 0, offer_per_key: 0 },
      webrtc: { max_connections: MAX_CONNECTIONS },
    }),
  });
  let crowd: Crowd | undefined;
  let db: DatabaseSync | undefined;
  // Whatever happens (a throw, Ctrl-C, a kill), no worker or server outlives the bench.
  const killAll = () => {
    crowd?.kill();
    if (server.child.exitCode === null) server.child.kill("SIGKILL");
  };
  const onSignal = () => {
    killAll();
    process.exit(130);
  };
  process.once("exit", killAll);
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  try {
    const serverKey = ((await (await fetch(`${server.url}/server-info`)).json()) as { public_key: string }).public_key;
    crowd = new Crowd(PROCESSES, { url: server.url, serverKey, bindAddress: new URL(server.url).hostname });
    db = new DatabaseSync(join(dir, "perch.db"), { readOnly: true });
    return await measure(server, crowd, db);
  } finally {
    db?.close();
    await crowd?.stop().catch(() => crowd?.kill());
    await server.stop();
    process.off("exit", killAll);
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
    rmSync(dir, { recursive: true, force: true });
  }
}

async function measure(server: Server, crowd: Crowd, db: DatabaseSync): Promise<unknown> {
  const benchStarted = performance.now();
  const loadStart = loadavg().map(round);
  const cpuStart = machineCpu();
  /** A line on stderr, so that a long run shows where it is. */
  const progress = (what: string) => process.stderr.write(`webrtc bench ${Math.round((performance.now() - benchStarted) / 1000)} s: ${what}\n`);
  const serverPid = server.child.pid!;
  const count = (sql: string) => Number((db.prepare(sql).get() as { n: number }).n);
  // Connect latency, one connect at a time: the device SDK (wrtc), then a node-datachannel device.
  const offer: number[] = [];
  const ready: number[] = [];
  for (let i = 0; i < CONNECTS; i++) {
    const c = await PerchConnection.connect({ baseUrl: server.url, keyPair: generateKeyPair() });
    offer.push(Number(/total;dur=([\d.]+)/.exec(c.timings.serverTiming)?.[1] ?? Number.NaN));
    ready.push(c.timings.ready);
    c.close();
  }
  progress("wrtc connects measured");
  const light = await crowd.connectSequentially(CONNECTS);
  await crowd.release();

  progress("node-datachannel connects measured");
  // One SDK connection: RPC, HTTP over a stream beside TCP, throughput both ways.
  const conn = await PerchConnection.connect({ baseUrl: server.url, keyPair: generateKeyPair() });
  const rtt: number[] = [];
  for (let i = 0; i < PINGS; i++) rtt.push((await conn.ping()).rttMs);
  let started = performance.now();
  for (let i = 0; i < REQUESTS; i++) await conn.http(1, "GET", "/healthz");
  const overStream = REQUESTS / ((performance.now() - started) / 1000);
  started = performance.now();
  for (let i = 0; i < REQUESTS; i++) await (await fetch(`${server.url}/healthz`, { headers: { connection: "close" } })).text();
  const overTcp = REQUESTS / ((performance.now() - started) / 1000);
  const speed = async (down: number, up: number) => {
    try {
      const r = await conn.speedTest(down, up);
      return round((down + up) / 2 ** 20 / (r.ms / 1000));
    } catch (err) {
      return `failed: ${(err as Error).message}`;
    }
  };
  const throughput = { down: await speed(SPEED_BYTES, 0), up: await speed(0, SPEED_BYTES), bytes: SPEED_BYTES };
  conn.close();
  await drained(server); // the SDK connection and the latency ones are gone

  progress("RPC, HTTP and throughput measured");
  // The crowd: more devices each step, every one sending a telemetry frame a second.
  const base = processStatus(serverPid);
  crowd.setRate(1, 1);
  const steps: Step[] = [];
  let held = 0;
  for (const target of STEPS) {
    const before = await crowd.stats();
    started = performance.now();
    const r = await crowd.connect(target - before.open, CONNECT_CONCURRENCY, Date.now() + STEP_CONNECT_S * 1000);
    const connectSeconds = (performance.now() - started) / 1000;
    await sleep(3000); // every device past its first frame, the activations done
    const m0 = await metrics(server);
    const cpu = await cpuDuring(serverPid, crowd.pids, HOLD_S * 1000);
    const m1 = await metrics(server);
    const stats = await crowd.stats();
    const status = processStatus(serverPid);
    const step: Step = {
      devices: target,
      held: false,
      connected: stats.open,
      connect_failed: r.failed,
      connect_not_started: r.skipped,
      connect_retried: r.retried,
      connects_per_second: round(r.ok / connectSeconds),
      connect_to_ready_ms: pct(r.ready),
      offer_handling_ms_server: pct(r.offerServer),
      server_connections: m1.get("perch_webrtc_connections") ?? Number.NaN,
      store_online: count("select count(*) as n from peer_runtime where online = 1"),
      telemetry_frames_per_second: rate(m0, m1, "perch_telemetry_frames_total"),
      server_rss_mb: status.rssMb,
      server_fds: status.fds,
      server_threads: status.threads,
      server_cpu_percent_of_one_core: cpu.server,
      server_threads_cpu_percent: cpu.serverThreads,
      crowd_cpu_percent: cpu.crowd,
      machine: cpu.machine,
      crowd: stats,
    };
    const faults: string[] = [];
    if (stats.open !== target) {
      faults.push(
        `${stats.open} of ${target} devices open (${r.failed} connects failed, ${r.skipped} not started within ${STEP_CONNECT_S} s, ${stats.lost} lost)`,
      );
    }
    if (Number.isNaN(step.server_connections)) faults.push("the server did not answer /metrics within 8 s");
    // Abandoned connect attempts stay pending on the server for a few seconds: more is not a fault.
    else if (step.server_connections < target) faults.push(`the server holds ${step.server_connections}`);
    if (step.store_online !== target) faults.push(`the store has ${step.store_online} online`);
    if (!(step.telemetry_frames_per_second >= 0.9 * target)) faults.push(`${step.telemetry_frames_per_second} telemetry frames/s ingested`);
    if (r.errors.length > 0 && r.failed > 0) faults.push(`connect errors: ${r.errors.join(" | ")}`);
    step.held = faults.length === 0;
    if (faults.length > 0) step.why_not_held = faults.join("; ");
    steps.push(step);
    progress(`crowd of ${target}: ${step.held ? "held" : `not held: ${step.why_not_held}`}`);
    if (!step.held) break;
    held = target;
  }
  const top = steps.filter((s) => s.held).at(-1);
  crowd.setRate(0);
  await crowd.release();
  await drained(server);
  const afterRelease = processStatus(serverPid);
  progress("crowd released");

  // Telemetry ingest: devices sending as fast as the server's per-connection limit allows.
  const fr = await crowd.connect(FLOOD_DEVICES, CONNECT_CONCURRENCY, Date.now() + STEP_CONNECT_S * 1000);
  crowd.setRate(FLOOD_RATE, FLOOD_OBSERVATIONS);
  await sleep(3000);
  const c0 = { ...(await crowd.stats()), at: performance.now() };
  const m0 = await metrics(server);
  const samples0 = { n: count("select count(*) as n from telemetry_samples"), at: performance.now() };
  const udp0 = udpErrors();
  const floodCpu = await cpuDuring(serverPid, crowd.pids, FLOOD_S * 1000);
  const c1 = { ...(await crowd.stats()), at: performance.now() };
  const m1 = await metrics(server);
  const samples1 = { n: count("select count(*) as n from telemetry_samples"), at: performance.now() };
  const udp1 = udpErrors();
  crowd.setRate(0);
  const accepted = rate(m0, m1, "perch_telemetry_frames_total");
  const floodSeconds = ((m1.get("at") ?? 0) - (m0.get("at") ?? 0)) / 1000;
  const dropped = drops(m0, m1);
  const flood = {
    devices: fr.ok,
    frames_per_second_per_device_sent: FLOOD_RATE,
    observations_per_frame: FLOOD_OBSERVATIONS,
    seconds: round(floodSeconds),
    frames_sent_per_second: round((c1.sent - c0.sent) / ((c1.at - c0.at) / 1000)),
    frames_accepted_per_second: round(accepted),
    /** Accepted and dropped alike: what the server's JavaScript thread got through. */
    frames_received_per_second: round(accepted + Object.values(dropped).reduce((a, b) => a + b, 0) / floodSeconds),
    samples_accepted_per_second: round(accepted * FLOOD_OBSERVATIONS * SAMPLES_PER_OBSERVATION),
    samples_stored_per_second: round((samples1.n - samples0.n) / ((samples1.at - samples0.at) / 1000)),
    dropped_by_reason: dropped,
    udp_receive_errors_machine: { in_errors: udp1.in_errors - udp0.in_errors, rcvbuf_errors: udp1.rcvbuf_errors - udp0.rcvbuf_errors },
    server_cpu_percent_of_one_core: floodCpu.server,
    server_threads_cpu_percent: floodCpu.serverThreads,
    crowd_cpu_percent: floodCpu.crowd,
    machine: floodCpu.machine,
  };
  await crowd.release();
  await drained(server);
  progress("telemetry ingest measured");

  const ratio = overStream / overTcp;
  const perConnectionKb = top ? round(((top.server_rss_mb - base.rssMb) * 1024) / top.devices) : Number.NaN;
  const previous = steps.filter((s) => s.held).at(-2);
  const marginalKb = top && previous ? round(((top.server_rss_mb - previous.server_rss_mb) * 1024) / (top.devices - previous.devices)) : Number.NaN;
  const wrtcReady = pct(ready);
  const lightReady = pct(light.ready);
  const last = steps.at(-1);
  return {
    suite: "webrtc",
    machine: {
      cores: readFileSync("/proc/cpuinfo", "utf8").match(/^processor/gm)?.length,
      open_files_limit: openFilesLimit(),
      // Other work on the machine moves every figure: the load averages at the start and the end.
      load_average: { start: loadStart, end: loadavg().map(round) },
      // CPU time the hypervisor gave to other guests (the other engineer's machine shares these cores).
      steal_percent: stealPercent(cpuStart, machineCpu()),
    },
    // Each figure the issue names, its goal beside it; the details follow.
    summary: {
      offer_handling_ms_p50: { value: pct(offer).p50, goal: `≤ ${GOALS.offer_handling_ms_p50}`, met: pct(offer).p50 <= GOALS.offer_handling_ms_p50 },
      connect_to_ready_ms_p50_wrtc_sdk: {
        value: wrtcReady.p50,
        goal: `≤ ${GOALS.connect_to_ready_ms_p50_loopback}`,
        met: wrtcReady.p50 <= GOALS.connect_to_ready_ms_p50_loopback,
      },
      connect_to_ready_ms_p50_node_datachannel: {
        value: lightReady.p50,
        goal: `≤ ${GOALS.connect_to_ready_ms_p50_loopback}`,
        met: lightReady.p50 <= GOALS.connect_to_ready_ms_p50_loopback,
      },
      rpc_ping_ms_p50: { value: pct(rtt).p50 },
      http_over_stream_to_tcp: { value: round(ratio), goal: `≥ ${GOALS.http_stream_to_tcp_ratio}`, met: ratio >= GOALS.http_stream_to_tcp_ratio },
      stream_throughput_mb_per_s: { value: { down: throughput.down, up: throughput.up } },
      telemetry_frames_per_second_accepted: {
        value: round(accepted),
        goal: `≥ ${GOALS.telemetry_frames_per_second}`,
        met: accepted >= GOALS.telemetry_frames_per_second,
      },
      concurrent_devices_held: { value: held, goal: `≥ ${GOALS.concurrent_devices}`, met: held >= GOALS.concurrent_devices },
      memory_per_connection_kb: { value: perConnectionKb },
    },
    offer_handling_ms_server: pct(offer),
    connect_to_ready_ms_client: {
      wrtc_sdk: wrtcReady,
      node_datachannel: { ...lightReady, over_500_ms: light.ready.filter((r) => r > 500).length, failed_attempts_retried: light.retried },
    },
    rpc_ping_rtt_ms: pct(rtt),
    http_sequential_requests_per_second: {
      over_stream_1: Math.round(overStream),
      over_tcp_new_connection_each: Math.round(overTcp),
      ratio: round(ratio),
    },
    stream_throughput_mb_per_s: throughput,
    telemetry_ingest: flood,
    concurrent_devices: {
      held,
      steps_tried: STEPS,
      server_rss_mb_before: base.rssMb,
      server_rss_mb_after_release: afterRelease.rssMb,
      memory_per_connection_kb: perConnectionKb,
      memory_per_connection_kb_marginal: marginalKb,
      crowd_processes: PROCESSES,
      steps,
    },
    server_warnings: server.warnings,
    limits: limits({ held, last, top, flood, wrtcReady, lightReady, lightSlow: light.ready.filter((r) => r > 500).length }),
  };
}

/** The machine's CPU time so far (`/proc/stat`): every state together, and stolen by the hypervisor. */
function machineCpu(): { total: number; idle: number; steal: number } {
  const fields = readFileSync("/proc/stat", "utf8").split("\n")[0]!.trim().split(/\s+/).slice(1).map(Number);
  // user nice system idle iowait irq softirq steal (guest time is already counted in user)
  const total = fields.slice(0, 8).reduce((a, b) => a + b, 0);
  return { total, idle: (fields[3] ?? 0) + (fields[4] ?? 0), steal: fields[7] ?? 0 };
}

function stealPercent(before: { total: number; steal: number }, after: { total: number; steal: number }): number {
  return round(((after.steal - before.steal) / Math.max(1, after.total - before.total)) * 100);
}

function openFilesLimit(): number {
  const m = /^Max open files\s+(\d+)/m.exec(readFileSync("/proc/self/limits", "utf8"));
  return Number(m?.[1] ?? Number.NaN);
}

/** What limits each figure, from what this run saw where it can tell, from the design where it cannot. */
function limits(o: {
  held: number;
  last: Step | undefined;
  top: Step | undefined;
  flood: {
    frames_accepted_per_second: number;
    frames_received_per_second: number;
    frames_sent_per_second: number;
    server_cpu_percent_of_one_core: number;
    server_threads_cpu_percent: Record<string, number>;
    crowd_cpu_percent: number;
    machine: { busy_percent: number; steal_percent: number };
    dropped_by_reason: Record<string, number>;
    udp_receive_errors_machine: { rcvbuf_errors: number };
  };
  wrtcReady: { p50: number };
  lightReady: { p50: number };
  lightSlow: number;
}): Record<string, string> {
  const threads = (t: Record<string, number>) =>
    Object.entries(t)
      .map(([k, v]) => `${k} ${v}%`)
      .join(", ");
  const at = (step: Step) =>
    `the server used ${step.server_cpu_percent_of_one_core}% of one core (${threads(step.server_threads_cpu_percent)}) and ${step.server_rss_mb} MB; the crowd's processes took ${step.crowd_cpu_percent}% of the same 2 cores, which were ${step.machine.busy_percent}% busy (${step.machine.steal_percent}% stolen by other guests)`;
  const crowd = !o.last
    ? "no step ran"
    : o.last.held
      ? `every step held, up to ${o.held} devices, the last one tried: the limit is higher. At ${o.held} ${at(o.last)}`
      : `${o.held} held; ${o.last.devices} did not: ${o.last.why_not_held}. At ${o.last.devices} ${at(o.last)}`;
  const dropped = Object.entries(o.flood.dropped_by_reason)
    .map(([k, v]) => `${k} ${v}`)
    .join(", ");
  return {
    offer_handling:
      "the server's own work per offer (open the sealed offer, apply it to node-datachannel, gather on the shared UDP port, seal the answer) on its one JavaScript thread; offers that arrive while the crowd grows wait behind that thread's other work (see the steps' offer_handling_ms_server)",
    connect_to_ready: `wrtc SDK p50 ${o.wrtcReady.p50} ms: the SDK's offer waits for libwebrtc's UDP candidates (a few ms; it no longer waits for the TCP ones, 100 ms later); after the answer, the server's ICE agent (libjuice in node-datachannel), as the controlled agent, turns connected only on a check of its own, which it arms 50 ms after the device's check and again after each of the device's repeats (every 48 ms while the pair is new), so it goes when they pause, about 150 ms after the answer. node-datachannel devices p50 ${o.lightReady.p50} ms; ${o.lightSlow} of them took about 1 s (the server's DTLS ClientHello reaching a device whose DTLS transport was not up, answered on its 1 s retransmission; since the server checks only addresses the device's own checks come from, it cannot check before the device has the answer)`,
    rpc_ping: "a new SCTP stream per call (open, request, response, close) through both stacks' event loops; on loopback the network adds nothing",
    http_over_stream:
      "one stream per request, as the contract asks (Connection: close): a stream opened and closed inside SCTP, then Node's HTTP parser on both ends; the TCP side opens a connection per request as well. Both ends are on the same 2 cores, so the stream figure suffers most from other load",
    stream_throughput:
      "one SCTP stream through usrsctp and DTLS on both sides, the channel's 1 MiB high-water mark as its window; the SDK's side runs in libwebrtc and its upload is paced by the SDK polling wrtc's bufferedAmount",
    telemetry_ingest: `${o.flood.frames_accepted_per_second} frames/s accepted of ${o.flood.frames_received_per_second} the server took in (${o.flood.frames_sent_per_second} sent), the server at ${o.flood.server_cpu_percent_of_one_core}% of one core (${threads(o.flood.server_threads_cpu_percent)}), the sending crowd at ${o.flood.crowd_cpu_percent}% of the same 2 cores (${o.flood.machine.busy_percent}% busy, ${o.flood.machine.steal_percent}% stolen by other guests). Two stages bound it: libdatachannel's "RTC worker" threads (DTLS decryption and usrsctp's receive path, per datagram) and the server's one JavaScript thread (a message callback, a protobuf decode and a queued sample per frame, the store's batched writes). Frames either stage cannot take at once wait in the library and reach JavaScript in bunches, and the per-device limit (100 a second) is counted over the server's processing time, so a device sending at the limit loses bunched frames as rate_limited: dropped ${dropped || "none"}. Before any of it, the kernel dropped ${o.flood.udp_receive_errors_machine.rcvbuf_errors} datagrams for a full receive buffer (all connections share one UDP socket, read by libjuice's one mux thread)`,
    concurrent_devices: `${crowd}. Descriptors are not the limit (every connection shares one UDP socket); CPU is: each held device costs the server's JavaScript thread its telemetry frame a second and runtime upkeep, libjuice's one mux thread its consent checks and datagrams, usrsctp's timer thread its retransmission timers, so the JavaScript thread saturates first, and offers then time out`,
  };
}
