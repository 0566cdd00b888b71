/**
 * `npm run bench -- webrtc-health`: what one `perch serve` process pays per connection and how soon
 * it notices a device that vanished. Three parts:
 *
 * - memory per connection: node-datachannel devices (worker processes, no telemetry) connected,
 *   held and released twice on a fresh server, once its RSS has settled (its engines loaded); the growth of the server's RSS (and used heap,
 *   when `/metrics` has Node's default metrics) divided by the devices, in each round;
 * - refused channels: one SDK device opens channels with unknown labels, 100 at a time; the
 *   server's growth per refused channel;
 * - liveness: SDK devices reach the server through UDP relays (test/support/udp-relay.ts) that
 *   are then cut both ways at once, as a device that lost power would go; the time from the cut
 *   to the server dropping each connection (its `perch_webrtc_connections` gauge, read every
 *   100 ms);
 * - tones: the longest the server's event loop is held (`perch_event_loop_lag_max_seconds`, the
 *   most since the previous scrape) while 20 requests for a 10 s tone arrive at once on one device
 *   (each replacing the one before), and while 20 devices each play one; tones are encoded frame
 *   by frame as they are sent, which the tests check by counting the encoder's calls.
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { generateKeyPair } from "../src/crypto/keys.ts";
import { PerchConnection } from "../src/sdk/webrtc.ts";
import { UdpRelay } from "../test/support/udp-relay.ts";
import { Crowd } from "./crowd.ts";
import { benchConfig, round, type Server, startServer, treeCpuSeconds } from "./support.ts";

const env = (name: string, fallback: number) => Number(process.env[name] ?? fallback);
const DEVICES = env("BENCH_HEALTH_DEVICES", 200);
const PROCESSES = env("BENCH_HEALTH_PROCESSES", 2);
const CHANNELS = env("BENCH_HEALTH_CHANNELS", 2000);
const LIVENESS_DEVICES = env("BENCH_HEALTH_LIVENESS_DEVICES", 4);
const LIVENESS_ROUNDS = env("BENCH_HEALTH_LIVENESS_ROUNDS", 3);
/** Past this a vanished device is counted as never noticed. */
const LIVENESS_LIMIT_S = env("BENCH_HEALTH_LIVENESS_LIMIT_S", 60);
const TONES = env("BENCH_HEALTH_TONES", 20);
const TONE_ROUNDS = env("BENCH_HEALTH_TONE_ROUNDS", 3);
/**
 * `BENCH_HEALTH_MEMORY_VARIANTS=";MALLOC_ARENA_MAX=8"`: only the memory part, on a fresh server for
 * each variant of the server's environment (`;` between variants, spaces between `NAME=value`; an
 * empty variant is the environment as it is), the variants taken in turn `BENCH_HEALTH_MEMORY_RUNS`
 * times, so that they are measured side by side.
 */
const MEMORY_VARIANTS = process.env.BENCH_HEALTH_MEMORY_VARIANTS;
const MEMORY_RUNS = env("BENCH_HEALTH_MEMORY_RUNS", 1);

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

async function gauges(server: Server): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  const text = await (await fetch(`${server.url}/metrics`)).text();
  for (const line of text.split("\n")) {
    const m = /^([a-z_]+(?:\{[^}]*\})?) (\S+)$/.exec(line);
    if (m) out.set(m[1]!, Number(m[2]));
  }
  return out;
}

/**
 * The server's resident memory (from /proc) and, when `/metrics` reports them, its used heap and
 * Node's external memory (Buffers, the native objects V8 is told about), in KB.
 */
async function memory(
  server: Server,
): Promise<{ rssKb: number; heapKb: number | null; heapTotalKb: number | null; externalKb: number | null; spacesKb: Record<string, number> }> {
  const status = readFileSync(`/proc/${server.child.pid}/status`, "utf8");
  const rssKb = Number(/^VmRSS:\s+(\d+)/m.exec(status)?.[1] ?? Number.NaN);
  const g = await gauges(server);
  const kb = (name: string) => {
    const bytes = g.get(name);
    return bytes === undefined ? null : round(bytes / 1024);
  };
  // What V8 has committed for each of its heap's spaces (new, old, code…), used or not.
  const spacesKb: Record<string, number> = {};
  for (const [name, bytes] of g) {
    const m = /^nodejs_heap_space_size_total_bytes\{space="([a-z_]+)"\}$/.exec(name);
    if (m) spacesKb[m[1]!] = round(bytes / 1024);
  }
  return {
    rssKb,
    heapKb: kb("nodejs_heap_size_used_bytes"),
    heapTotalKb: kb("nodejs_heap_size_total_bytes"),
    externalKb: kb("nodejs_external_memory_bytes"),
    spacesKb,
  };
}

async function connections(server: Server): Promise<number> {
  return (await gauges(server)).get("perch_webrtc_connections") ?? Number.NaN;
}

async function until(what: string, check: () => Promise<boolean>, limitMs = 60_000): Promise<void> {
  const end = Date.now() + limitMs;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

/**
 * Waits until the server's RSS has grown less than 1 MB in 3 s (at most 120 s): a node loads its
 * embedded engines in the background after it listens (the recogniser's models, the speech
 * workers, about 250 MB), and a round measured meanwhile counts them as the connections' memory.
 */
async function settled(server: Server): Promise<{ waited_ms: number; rss_kb_at_start: number; rss_kb_settled: number }> {
  const started = Date.now();
  const samples = [(await memory(server)).rssKb];
  while (Date.now() - started < 120_000) {
    await sleep(500);
    samples.push((await memory(server)).rssKb);
    if (samples.length > 6 && samples.at(-1)! - samples.at(-7)! < 1024) break;
  }
  return { waited_ms: Date.now() - started, rss_kb_at_start: samples[0]!, rss_kb_settled: samples.at(-1)! };
}

/**
 * Memory while `DEVICES` devices are held, on a fresh server once its engines have loaded: the
 * first round is what connections cost a process that never held them; the second, what they cost
 * once the first round's memory is there to be reused (RSS is not given back to the system after
 * connections close).
 */
type Reading = Awaited<ReturnType<typeof memory>>;
type Round = { devices: number; before: Reading; held: Reading; after: Reading; cpuMs: number };

async function perConnection(server: Server, crowd: Crowd) {
  const settle = await settled(server);
  const rounds: Round[] = [];
  for (let round_ = 0; round_ < 2; round_++) {
    const before = await memory(server);
    const cpuBefore = treeCpuSeconds(server.child.pid!);
    const r = await crowd.connect(DEVICES, 8, Date.now() + 120_000);
    await until("every device counted", async () => (await connections(server)) >= r.ok);
    await sleep(2_000);
    const held = await memory(server);
    await crowd.release();
    await until("every device gone", async () => (await connections(server)) === 0);
    await sleep(1_000);
    const after = await memory(server);
    // The server's CPU (with its idle recogniser processes) from the first connect to the last release.
    const cpuMs = round((treeCpuSeconds(server.child.pid!) - cpuBefore) * 1000);
    rounds.push({ devices: r.ok, before, held, after, cpuMs });
  }
  const per = (a: number | null, b: number | null, n: number) => (a === null || b === null ? null : round((a - b) / n));
  const [first, second] = rounds as [Round, Round];
  const netPer = (r: Round) =>
    r.held.externalKb === null || r.before.externalKb === null
      ? null
      : round((r.held.rssKb - r.before.rssKb - (r.held.externalKb - r.before.externalKb)) / r.devices);
  return {
    devices: first.devices,
    settle,
    rss_kb_per_connection: per(first.held.rssKb, first.before.rssKb, first.devices),
    rss_kb_per_connection_second_round: per(second.held.rssKb, second.before.rssKb, second.devices),
    /**
     * The same less what Node's external memory (ArrayBuffers, Buffers) changed by meanwhile: a
     * major collection during the first round may free what the engines left behind when they
     * loaded (about 21 MB of buffers), which hides about 100 KB a connection of the round's growth.
     */
    rss_kb_per_connection_net_of_external: netPer(first),
    rss_kb_per_connection_second_round_net_of_external: netPer(second),
    cpu_ms_per_connection: round(first.cpuMs / first.devices),
    cpu_ms_per_connection_second_round: round(second.cpuMs / second.devices),
    heap_kb_per_connection: per(first.held.heapKb, first.before.heapKb, first.devices),
    heap_kb_per_connection_second_round: per(second.held.heapKb, second.before.heapKb, second.devices),
    heap_kb_left_per_connection_after_release: per(second.after.heapKb, second.before.heapKb, second.devices),
    heap_committed_kb_per_connection: per(first.held.heapTotalKb, first.before.heapTotalKb, first.devices),
    external_kb_per_connection: per(first.held.externalKb, first.before.externalKb, first.devices),
    /** The heap's spaces whose committed size changed in the first round, per connection. */
    heap_space_committed_kb_per_connection: Object.fromEntries(
      Object.entries(first.held.spacesKb)
        .map(([space, kb]) => [space, per(kb, first.before.spacesKb[space] ?? 0, first.devices)] as const)
        .filter(([, kb]) => kb !== 0),
    ),
    rounds,
  };
}

/** Memory per channel refused (an unknown label), while the connection that opened them lives on. */
async function refusedChannels(server: Server) {
  const conn = await PerchConnection.connect({ baseUrl: server.url, keyPair: generateKeyPair() });
  try {
    // Warm up: the first channels pay for structures every connection has.
    const open = async (n: number) => {
      for (let done = 0; done < n; done += 100) {
        const batch = Array.from({ length: Math.min(100, n - done) }, (_, i) => conn.pc.createDataChannel(`x-unknown-${done + i}`));
        await until("the batch refused", async () => batch.every((dc) => dc.readyState === "closed"), 30_000);
      }
    };
    await open(200);
    await sleep(1_000);
    const before = await memory(server);
    await open(CHANNELS);
    await sleep(1_000);
    const after = await memory(server);
    return {
      channels: CHANNELS,
      rss_bytes_per_channel: round(((after.rssKb - before.rssKb) * 1024) / CHANNELS),
      heap_bytes_per_channel: after.heapKb === null || before.heapKb === null ? null : round(((after.heapKb - before.heapKb) * 1024) / CHANNELS),
      before,
      after,
    };
  } finally {
    conn.close();
  }
}

/** Seconds from cutting a device's network to the server dropping its connection, for every device of every round. */
async function liveness(server: Server) {
  const seconds: number[] = [];
  for (let r = 0; r < LIVENESS_ROUNDS; r++) {
    const relays = await Promise.all(Array.from({ length: LIVENESS_DEVICES }, () => UdpRelay.start()));
    const devices = await Promise.all(relays.map((relay) => PerchConnection.connect({ baseUrl: server.url, keyPair: generateKeyPair(), rtc: relay.rtc() })));
    await until("the devices counted", async () => (await connections(server)) === LIVENESS_DEVICES);
    // Let the links settle into their idle rhythm (consent checks, RTCP) before they vanish.
    await sleep(3_000);
    const cut = performance.now();
    for (const relay of relays) relay.cut("both");
    let left = LIVENESS_DEVICES;
    while (left > 0 && performance.now() - cut < LIVENESS_LIMIT_S * 1000) {
      const now = await connections(server);
      for (; left > now; left--) seconds.push(round((performance.now() - cut) / 1000));
      await sleep(100);
    }
    for (; left > 0; left--) seconds.push(Number.POSITIVE_INFINITY);
    for (const d of devices) d.close();
    for (const relay of relays) relay.close();
    await until("the round's connections gone", async () => (await connections(server)) === 0, 60_000);
  }
  const sorted = [...seconds].sort((a, b) => a - b);
  return {
    devices: seconds.length,
    seconds_min: sorted[0],
    seconds_p50: sorted[Math.floor(sorted.length / 2)],
    seconds_max: sorted.at(-1),
    seconds: sorted.map((s) => (Number.isFinite(s) ? s : `over ${LIVENESS_LIMIT_S}`)),
  };
}

/** The server's longest event-loop hold since the previous read, in ms (each read starts a new window). */
async function lagMaxMs(server: Server): Promise<number> {
  return round(((await gauges(server)).get("perch_event_loop_lag_max_seconds") ?? Number.NaN) * 1000);
}

/** Asks `conn` for a 10 s tone over stream 1; the HTTP status. */
async function tone(conn: PerchConnection): Promise<number> {
  const res = await conn.http(1, "POST", "/me/audio/tone", {
    body: JSON.stringify({ frequency_hz: 440 + Math.random(), duration_ms: 10_000 }),
    headers: { "content-type": "application/json" },
  });
  return res.status;
}

/**
 * The event loop while tones are asked for and played: `TONES` requests at once on one device
 * (each replaces the tone before it on the device's track), then one tone on each of `TONES`
 * devices at once, each followed by 3 s of the tones playing; `TONE_ROUNDS` rounds.
 */
async function tones(server: Server) {
  const devices = await Promise.all(Array.from({ length: TONES }, () => PerchConnection.connect({ baseUrl: server.url, keyPair: generateKeyPair() })));
  try {
    await tone(devices[0]!); // the first tone pays for loading the encoder
    await sleep(1_000);
    type Round = {
      accepted: number;
      other_statuses: number[];
      one_device_lag_max_ms_while_asked: number;
      one_device_lag_max_ms_while_playing: number;
      each_device_lag_max_ms_while_asked: number;
      each_device_lag_max_ms_while_playing: number;
    };
    const rounds: Round[] = [];
    for (let r = 0; r < TONE_ROUNDS; r++) {
      await lagMaxMs(server);
      const oneDevice = await Promise.all(Array.from({ length: TONES }, () => tone(devices[0]!)));
      const oneDeviceAsked = await lagMaxMs(server);
      await sleep(3_000);
      const oneDevicePlaying = await lagMaxMs(server);
      const each = await Promise.all(devices.map((d) => tone(d)));
      const eachAsked = await lagMaxMs(server);
      await sleep(3_000);
      const eachPlaying = await lagMaxMs(server);
      const statuses = [...oneDevice, ...each];
      rounds.push({
        accepted: statuses.filter((status) => status === 202).length,
        other_statuses: statuses.filter((status) => status !== 202),
        one_device_lag_max_ms_while_asked: oneDeviceAsked,
        one_device_lag_max_ms_while_playing: oneDevicePlaying,
        each_device_lag_max_ms_while_asked: eachAsked,
        each_device_lag_max_ms_while_playing: eachPlaying,
      });
    }
    const max = (key: Exclude<keyof Round, "accepted" | "other_statuses">) => Math.max(...rounds.map((r) => r[key]));
    return {
      tones: TONES,
      rounds: TONE_ROUNDS,
      one_device_lag_max_ms: Math.max(max("one_device_lag_max_ms_while_asked"), max("one_device_lag_max_ms_while_playing")),
      each_device_lag_max_ms: Math.max(max("each_device_lag_max_ms_while_asked"), max("each_device_lag_max_ms_while_playing")),
      per_round: rounds,
    };
  } finally {
    for (const d of devices) d.close();
  }
}

/** "A=1 B=2" as an environment. */
function variantEnv(variant: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const assignment of variant.trim().split(/\s+/).filter(Boolean)) {
    const eq = assignment.indexOf("=");
    if (eq < 1) throw new Error(`BENCH_HEALTH_MEMORY_VARIANTS: ${assignment} is not NAME=value`);
    out[assignment.slice(0, eq)] = assignment.slice(eq + 1);
  }
  return out;
}

/**
 * A fresh server (of the checkout at `root`, started with `extraEnv`) and the crowd's processes
 * connected to it, for `run`; both are stopped after it (and killed if the bench exits first).
 */
async function withServerAndCrowd<T>(
  extraEnv: Record<string, string>,
  root: string | undefined,
  run: (server: Server, crowd: Crowd) => Promise<T>,
): Promise<T> {
  const dir = mkdtempSync(join(tmpdir(), "perch-bench-health-"));
  const server = await startServer({ PERCH_DATA_DIR: dir, ...benchConfig(dir, { webrtc: { max_connections: 10_000 } }), ...extraEnv }, root);
  let crowd: Crowd | undefined;
  const killAll = () => {
    crowd?.kill();
    if (server.child.exitCode === null) server.child.kill("SIGKILL");
  };
  process.once("exit", killAll);
  try {
    const serverKey = ((await (await fetch(`${server.url}/server-info`)).json()) as { public_key: string }).public_key;
    crowd = new Crowd(PROCESSES, { url: server.url, serverKey, bindAddress: new URL(server.url).hostname });
    return await run(server, crowd);
  } finally {
    await crowd?.stop().catch(() => crowd?.kill());
    await server.stop();
    process.off("exit", killAll);
    rmSync(dir, { recursive: true, force: true });
  }
}

/** The memory part alone on a fresh server (of the checkout at `root`) started with `extraEnv`. */
function memoryOnFreshServer(extraEnv: Record<string, string>, root: string | undefined) {
  return withServerAndCrowd(extraEnv, root, perConnection);
}

/** With `BENCH_COMPARE_ROOT` (another checkout), that checkout's server, as it is, is one more case of each run. */
async function memoryVariants(variants: string[]) {
  const compareRoot = process.env.BENCH_COMPARE_ROOT;
  const cases = [
    ...(compareRoot ? [{ name: "BENCH_COMPARE_ROOT", variant: "", root: compareRoot as string | undefined }] : []),
    ...variants.map((variant) => ({ name: variant || "(as is)", variant, root: undefined as string | undefined })),
  ];
  const runs: Record<string, unknown[]> = Object.fromEntries(cases.map((c) => [c.name, []]));
  for (let run = 0; run < MEMORY_RUNS; run++) {
    for (const { name, variant, root } of cases) {
      const loadBefore = loadavg()[0]!;
      const m = await memoryOnFreshServer(variantEnv(variant), root);
      const figure = {
        fresh_rss_kb: m.rss_kb_per_connection,
        warm_rss_kb: m.rss_kb_per_connection_second_round,
        fresh_rss_kb_net_of_external: m.rss_kb_per_connection_net_of_external,
        warm_rss_kb_net_of_external: m.rss_kb_per_connection_second_round_net_of_external,
        fresh_heap_kb: m.heap_kb_per_connection,
        cpu_ms_per_connection: [m.cpu_ms_per_connection, m.cpu_ms_per_connection_second_round],
        fresh_heap_committed_kb: m.heap_committed_kb_per_connection,
        fresh_external_kb: m.external_kb_per_connection,
        fresh_heap_spaces_kb: m.heap_space_committed_kb_per_connection,
        load: [round(loadBefore), round(loadavg()[0]!)],
        devices: m.devices,
        rss_kb_settled: m.settle.rss_kb_settled,
      };
      process.stderr.write(`webrtc-health bench: ${name}: ${JSON.stringify(figure)}\n`);
      runs[name]!.push(figure);
    }
  }
  return { suite: "webrtc-health", part: "memory per connection, by server environment", devices: DEVICES, variants: runs };
}

export async function webrtcHealthBench(): Promise<unknown> {
  if (MEMORY_VARIANTS !== undefined) return await memoryVariants(MEMORY_VARIANTS.split(";"));
  return await withServerAndCrowd({}, undefined, async (server, crowd) => {
    const progress = (what: string) => process.stderr.write(`webrtc-health bench: ${what}\n`);
    // Memory first, on the fresh process; then refused channels; then liveness.
    const memoryPerConnection = await perConnection(server, crowd);
    progress(`memory per connection measured: ${memoryPerConnection.rss_kb_per_connection} KB RSS`);
    await crowd.stop();
    const channels = await refusedChannels(server);
    progress(`refused channels measured: ${channels.rss_bytes_per_channel} B RSS each`);
    const live = await liveness(server);
    progress(`liveness measured: ${JSON.stringify(live.seconds)}`);
    const toneLag = await tones(server);
    progress(`tones measured: event loop held at most ${toneLag.one_device_lag_max_ms} ms (one device), ${toneLag.each_device_lag_max_ms} ms (each device)`);
    return {
      suite: "webrtc-health",
      note: "one run; the machine's two cores are shared with other work, figures move with it",
      load_average: loadavg().map(round),
      liveness: live,
      tones: toneLag,
      memory_per_connection: memoryPerConnection,
      refused_channels: channels,
      server_warnings: server.warnings,
    };
  });
}
