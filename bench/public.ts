/**
 * `npm run bench -- public`: one `perch serve` process (SQLite, or PostgreSQL with
 * `PERCH_DATABASE_URL`) on a seeded data set, loaded by autocannon from this process.
 */

import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, rmSync, statSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import type autocannon from "autocannon";
import pg from "pg";
import { buildAssertion } from "../src/crypto/assertion.ts";
import { decodeKey, encodeKey, generateKeyPair, type KeyPair, privateKeyObject, sharedSecret } from "../src/crypto/keys.ts";
import { newPeer } from "../src/domain/auth.ts";
import { PerchClient } from "../src/sdk/client.ts";
import { Store } from "../src/store/index.ts";
import { benchConfig, CONNECTIONS, type Figure, load, percentiles, ROOT, round, type Server, startServer, withCpu } from "./support.ts";

const DATABASE_URL = process.env.PERCH_DATABASE_URL || undefined;
const PEERS = Number(process.env.BENCH_PEERS ?? 100_000);
const SAMPLES = Number(process.env.BENCH_SAMPLES ?? 10_000_000);
const DEVICE_SAMPLES = Number(process.env.BENCH_DEVICE_SAMPLES ?? 1_000_000);
/** Samples per other device: the rest of the data set is spread over this many-sample series. */
const SAMPLES_PER_OTHER_DEVICE = 10_000;
const BATCH = 20_000;

export async function publicBench(): Promise<unknown> {
  if (process.env.BENCH_PUBLIC_ONLY === "status") return statusCpuBench();
  const dataDir = mkdtempSync(join(tmpdir(), "perch-bench-"));
  const deviceKey = generateKeyPair();
  const device = encodeKey(deviceKey.publicKey);
  const end = Date.now();
  const start = end - DEVICE_SAMPLES * 1000; // one sample a second
  const seeding = await seed(dataDir, device, start);

  const server = await startServer({ PERCH_DATA_DIR: dataDir, ...(DATABASE_URL ? { PERCH_DATABASE_URL: DATABASE_URL } : {}), ...benchConfig(dataDir) });
  const pid = server.child.pid!;
  try {
    await server.settled();
    const { url } = server;
    const client = new PerchClient({ baseUrl: url, keyPair: deviceKey });
    await client.login();
    const phone = new PerchClient({ baseUrl: url, keyPair: generateKeyPair() });
    await phone.login({ deviceToken: (await client.createDeviceToken()).token });
    await client.putStatus({ volume: 50, battery_percent: 80, labels: { room: "lab" } });
    await phone.sideControl.contacts.create({ name: "mom", display_name: "Mom", phone_number: "+1 555 0100" });
    const device = { authorization: `Bearer ${client.accessToken}` };
    const controller = { authorization: `Bearer ${phone.accessToken}` };
    const serverPublicKey = decodeKey((await client.serverInfo()).public_key);

    const login1k = await load("POST /login (primary), 1,000 keys in rotation", loginLoad(url, serverPublicKey, keyRing(1_000, serverPublicKey)));
    const login100k = await load("POST /login (primary), 100,000 keys in rotation", loginLoad(url, serverPublicKey, keyRing(100_000, serverPublicKey)));
    const getStatus = await withCpu(pid, () => load("GET /me/status", { url: `${url}/me/status`, headers: device }));
    const putStatus = await load("PUT /me/status", {
      url: `${url}/me/status`,
      method: "PUT",
      headers: { ...device, "content-type": "application/json" },
      body: JSON.stringify({
        volume: 42,
        muted: false,
        battery_percent: 77,
        charging: true,
        gnss_latitude: 31.23,
        gnss_longitude: 121.47,
        labels: { room: "lab" },
      }),
    });
    let flip = 0;
    const contactUpdate = await load("PUT /side-control/contacts/mom, 8 concurrent writers", {
      url,
      connections: 8,
      requests: [
        {
          method: "PUT",
          path: "/side-control/contacts/mom",
          headers: { ...controller, "content-type": "application/json" },
          setupRequest: (req) => ({ ...req, body: JSON.stringify({ display_name: `Mom ${flip++ % 100}` }) }),
        },
      ],
    });

    const step = Math.ceil((end - start) / 1000);
    const window = { field: "battery.percent", start_time_ms: String(start), end_time_ms: String(end) };
    const aggregatePath = `/side-control/telemetry/aggregate?${new URLSearchParams({ ...window, bucket_ms: String(step), aggregate: "avg" })}`;
    const rangePath = `/side-control/telemetry?${new URLSearchParams({ ...window, step_ms: String(step), limit: "1000" })}`;
    const aggregate = await timedGets(`${url}${aggregatePath}`, controller, 200);
    const range = await timedGets(`${url}${rangePath}`, controller, 200);
    // `GET /me/status` again, while 4 dashboards loop on the two heavy queries.
    const [statusUnderLoad] = await Promise.all([
      load("GET /me/status while 4 clients loop on telemetry queries", { url: `${url}/me/status`, headers: device, connections: CONNECTIONS - 4 }),
      load("telemetry aggregate loop", { url: `${url}${aggregatePath}`, headers: controller, connections: 2 }),
      load("telemetry range loop", { url: `${url}${rangePath}`, headers: controller, connections: 2 }),
    ]);
    const statusAlone = await load("GET /me/status alone, same connections", { url: `${url}/me/status`, headers: device, connections: CONNECTIONS - 4 });
    const lean = DATABASE_URL ? undefined : await leanReference(join(dataDir, "perch.db"), client.accessToken!);
    const ceiling = await baseline();

    const figures: Figure[] = [login1k, login100k, getStatus, putStatus, contactUpdate, statusAlone, statusUnderLoad, ...(lean ? [lean] : []), ceiling];
    return {
      suite: "public",
      store: DATABASE_URL ? "postgres" : "sqlite",
      node: process.version,
      duration_s: Number(process.env.BENCH_DURATION_S ?? 10),
      data_set: { peers: PEERS, samples: SAMPLES, device_samples: DEVICE_SAMPLES, ...seeding },
      figures,
      telemetry_queries_over_device_window: {
        aggregate_avg_1000_buckets_ms: aggregate,
        stepped_range_1000_steps_ms: range,
      },
      ratios: {
        get_status_per_baseline: round(getStatus.requests_per_second / ceiling.requests_per_second),
        get_status_under_telemetry_load_per_alone: round(statusUnderLoad.requests_per_second / statusAlone.requests_per_second),
        login_100k_keys_per_1k_keys: round(login100k.requests_per_second / login1k.requests_per_second),
        get_status_cpu_per_lean_reference: lean
          ? round(getStatus.server_cpu_us_per_request / (lean as { server_cpu_us_per_request: number }).server_cpu_us_per_request)
          : null,
      },
      goals: {
        login_per_second: { goal: 4000, reached: login1k.requests_per_second },
        get_status_per_second: { goal: 15000, reached: getStatus.requests_per_second },
        aggregate_p50_ms: { goal: 20, reached: aggregate.p50 },
        stepped_range_p50_ms: { goal: 20, reached: range.p50 },
        get_status_under_telemetry_load_ratio: { goal: 0.8, reached: round(statusUnderLoad.requests_per_second / statusAlone.requests_per_second) },
        get_status_cpu_per_lean_reference: {
          goal: 1.5,
          reached: lean ? round(getStatus.server_cpu_us_per_request / (lean as { server_cpu_us_per_request: number }).server_cpu_us_per_request) : null,
        },
      },
    };
  } finally {
    await server.stop();
    rmSync(dataDir, { recursive: true, force: true });
  }
}

/** Seeds peers and telemetry before the server opens the store; returns timing and size figures. */
async function seed(dataDir: string, device: string, start: number): Promise<Record<string, number | null>> {
  const started = performance.now();
  const now = Date.now();
  const keys = await registerPeers(dataDir, device, now);
  const sizeBefore = await storeBytes(dataDir);
  await withStore(dataDir, Store, async (store) => {
    await insertSeries(store, device, start, DEVICE_SAMPLES);
    let remaining = SAMPLES - DEVICE_SAMPLES;
    for (let k = 1; remaining > 0; k = (k % (keys.length - 1)) + 1) {
      const n = Math.min(SAMPLES_PER_OTHER_DEVICE, remaining);
      await insertSeries(store, keys[k]!, start, n);
      remaining -= n;
    }
  });
  const sizeAfter = await storeBytes(dataDir);
  return { seed_seconds: round((performance.now() - started) / 1000), bytes_per_sample: round((sizeAfter - sizeBefore) / SAMPLES) };
}

/**
 * `PEERS` registered peers, `device` first; returns their keys. With `root`, through that
 * checkout's own store (its migrations are the ones its server expects).
 */
async function registerPeers(dataDir: string, device: string, now: number, root?: string): Promise<string[]> {
  const keys = [device, ...Array.from({ length: PEERS - 1 }, () => encodeKey(canonicalRandomKey()))];
  const modules = root
    ? {
        Store: (await import(join(root, "src/store/index.ts"))).Store as typeof Store,
        newPeer: (await import(join(root, "src/domain/auth.ts"))).newPeer as typeof newPeer,
      }
    : { Store, newPeer };
  await withStore(dataDir, modules.Store, async (store) => {
    for (let i = 0; i < keys.length; i += BATCH) {
      await store.transaction(async (tx) => {
        for (const key of keys.slice(i, i + BATCH)) await tx.peers.register(modules.newPeer(key, now));
      });
    }
  });
  return keys;
}

async function withStore(dataDir: string, StoreClass: typeof Store, fn: (store: Store) => Promise<void>): Promise<void> {
  // No read workers: seeding reads nothing, and closing a pool whose worker is still starting
  // sometimes never settled under load, which left the bench with nothing to wait on (it exited 13).
  const store = await StoreClass.open(DATABASE_URL, dataDir, { readWorkers: 0 });
  try {
    await fn(store);
  } finally {
    await store.close(); // on SQLite, the last connection's close checkpoints the WAL into the file
  }
}

async function insertSeries(store: Store, key: string, start: number, count: number): Promise<void> {
  for (let i = 0; i < count; i += BATCH) {
    const samples = Array.from({ length: Math.min(BATCH, count - i) }, (_, j) => ({
      field: "battery.percent",
      observedAt: start + (i + j) * 1000,
      value: ((i + j) * 7) % 101,
    }));
    await store.transaction((tx) => tx.telemetry.insert(key, samples));
  }
}

/** The bytes the store occupies: SQLite's files (closed, so checkpointed), or PostgreSQL's database size. */
async function storeBytes(dataDir: string): Promise<number> {
  if (DATABASE_URL) {
    const client = new pg.Client({ connectionString: DATABASE_URL });
    await client.connect();
    try {
      await client.query("checkpoint").catch(() => undefined);
      const { rows } = await client.query<{ n: string }>("select pg_database_size(current_database()) as n");
      return Number(rows[0]!.n);
    } finally {
      await client.end();
    }
  }
  const file = join(dataDir, "perch.db");
  return [file, `${file}-wal`].filter(existsSync).reduce((sum, f) => sum + statSync(f).size, 0);
}

/** 32 random bytes that are a canonical X25519 public key (top bit clear; below p with overwhelming odds). */
function canonicalRandomKey(): Uint8Array {
  const raw = randomBytes(32);
  raw[31]! &= 0x7f;
  return raw;
}

interface RingKey {
  pair: KeyPair;
  publicKey: string;
  secret: Uint8Array;
}

function keyRing(n: number, serverPublicKey: Uint8Array): RingKey[] {
  return Array.from({ length: n }, () => {
    const pair = generateKeyPair();
    return { pair, publicKey: encodeKey(pair.publicKey), secret: sharedSecret(privateKeyObject(pair.privateKey), serverPublicKey) };
  });
}

/** Logins in rotation over `keys`, a fresh assertion (new nonce) for every request. */
function loginLoad(url: string, serverPublicKey: Uint8Array, keys: RingKey[]): autocannon.Options {
  let n = 0;
  return {
    url,
    requests: [
      {
        method: "POST",
        path: "/login",
        setupRequest: (req) => {
          const k = keys[n++ % keys.length]!;
          const now = Math.floor(Date.now() / 1000);
          const assertion = buildAssertion({ clientPublicKey: k.pair.publicKey, serverPublicKey, sharedSecret: k.secret, now });
          return { ...req, headers: { authorization: `Bearer ${assertion}`, "x-public-key": k.publicKey } };
        },
      },
    ],
  };
}

/** Latency of `count` sequential GETs (a dashboard waiting for each answer). */
async function timedGets(url: string, headers: Record<string, string>, count: number): Promise<{ p50: number; p99: number; points: number }> {
  const times: number[] = [];
  let points = 0;
  for (let i = 0; i < count; i++) {
    const t = performance.now();
    // One retry: a kept-alive socket the server closed between two requests is not a slow answer.
    const res = await fetch(url, { headers }).catch(() => fetch(url, { headers }));
    const body = (await res.json()) as { points?: unknown[] };
    if (res.status !== 200) throw new Error(`${url}: ${res.status} ${JSON.stringify(body)}`);
    times.push(performance.now() - t);
    points = body.points?.length ?? 0;
  }
  return { ...percentiles(times), points };
}

/**
 * `BENCH_PUBLIC_ONLY=status`: only the CPU of `GET /me/status` against the lean reference, in
 * `BENCH_ROUNDS` (default 3) rounds that alternate them, on a data set of peers only (telemetry is
 * not on this path), after a warm-up. With `BENCH_COMPARE_ROOT` (another checkout of Perch, its
 * dependencies installed) that checkout's server is measured too, in the same rounds: a change
 * compared with the code before it side by side, on a machine whose load moves.
 */
async function statusCpuBench(): Promise<unknown> {
  const loadBefore = loadavg();
  const compareRoot = process.env.BENCH_COMPARE_ROOT;
  const subjects = [{ name: "perch", root: ROOT }, ...(compareRoot ? [{ name: "compared", root: compareRoot }] : [])];
  const started: Array<{ name: string; server: Server; dataDir: string; url: string; headers: Record<string, string>; serverKey: Uint8Array }> = [];
  let lean: Awaited<ReturnType<typeof startLean>> | undefined;
  try {
    for (const s of subjects) {
      const dataDir = mkdtempSync(join(tmpdir(), "perch-bench-"));
      const deviceKey = generateKeyPair();
      await registerPeers(dataDir, encodeKey(deviceKey.publicKey), Date.now(), s.root === ROOT ? undefined : s.root);
      const server = await startServer({ PERCH_DATA_DIR: dataDir, ...benchConfig(dataDir) }, s.root);
      const client = new PerchClient({ baseUrl: server.url, keyPair: deviceKey });
      started.push({ name: s.name, server, dataDir, url: server.url, headers: {}, serverKey: decodeKey((await client.serverInfo()).public_key) });
      await client.login();
      await client.putStatus({ volume: 50, battery_percent: 80, labels: { room: "lab" } });
      started.at(-1)!.headers = { authorization: `Bearer ${client.accessToken}` };
    }
    await Promise.all(started.map((s) => s.server.settled()));
    const first = started[0]!;
    lean = await startLean(join(first.dataDir, "perch.db"));
    const leanUrl = lean.url;
    const leanPid = lean.pid;
    for (const s of started) await load("warm-up", { url: `${s.url}/me/status`, headers: s.headers, duration: 3 });
    await load("warm-up", { url: `${leanUrl}/me/status`, headers: first.headers, duration: 3 });
    const rounds: Array<Record<string, unknown>> = [];
    for (let i = 0; i < Number(process.env.BENCH_ROUNDS ?? 3); i++) {
      const ref = await withCpu(leanPid, () => load("reference: node:http + prepared node:sqlite", { url: `${leanUrl}/me/status`, headers: first.headers }));
      const round_: Record<string, unknown> = { lean: ref };
      for (const s of started) {
        const f = await withCpu(s.server.child.pid!, () => load(`GET /me/status (${s.name})`, { url: `${s.url}/me/status`, headers: s.headers }));
        round_[s.name] = f;
        round_[`${s.name}_per_lean`] = round(f.server_cpu_us_per_request / ref.server_cpu_us_per_request);
      }
      // Logins beside it: they write (a session, a nonce) where the status read only reads.
      for (const s of started) {
        const logins = await load(`POST /login (${s.name}), 1,000 keys in rotation`, loginLoad(s.url, s.serverKey, keyRing(1_000, s.serverKey)));
        round_[`${s.name}_logins_per_second`] = logins.requests_per_second;
      }
      rounds.push(round_);
    }
    const median = (name: string) => {
      const r = rounds.map((x) => x[`${name}_per_lean`] as number).sort((a, b) => a - b);
      return { median: r[Math.floor(r.length / 2)], rounds: r };
    };
    return {
      suite: "public (status only)",
      node: process.version,
      duration_s: Number(process.env.BENCH_DURATION_S ?? 10),
      peers: PEERS,
      load_average: { before: loadBefore.map(round), after: loadavg().map(round) },
      rounds,
      get_status_cpu_per_lean_reference: { goal: 1.5, ...Object.fromEntries(started.map((s) => [s.name, median(s.name)])) },
    };
  } finally {
    lean?.stop();
    for (const s of started) {
      await s.server.stop();
      rmSync(s.dataDir, { recursive: true, force: true });
    }
  }
}

/** The lean `GET /me/status` reference (bench/lean-status.ts) on `file`, in its own process. */
async function startLean(file: string): Promise<{ url: string; pid: number; stop(): void }> {
  const child = spawn(process.execPath, ["--disable-warning=ExperimentalWarning", join(import.meta.dirname, "lean-status.ts"), file], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const port = await new Promise<string>((resolve) => child.stdout!.once("data", (d: Buffer) => resolve(d.toString().trim())));
  return { url: `http://127.0.0.1:${port}`, pid: child.pid!, stop: () => child.kill() };
}

/** The lean `GET /me/status` reference on the same database, with its CPU per request. */
async function leanReference(file: string, accessToken: string): Promise<Figure & { server_cpu_us_per_request: number }> {
  const lean = await startLean(file);
  try {
    return await withCpu(lean.pid, () =>
      load("reference: node:http + prepared node:sqlite, GET /me/status reads", {
        url: `${lean.url}/me/status`,
        headers: { authorization: `Bearer ${accessToken}` },
      }),
    );
  } finally {
    lean.stop();
  }
}

/** The ceiling of this machine: node:http answering a fixed JSON body, no framework, no store. */
async function baseline(): Promise<Figure> {
  const script = `require("node:http").createServer((q, s) => { s.writeHead(200, { "content-type": "application/json" }); s.end('{"volume":42}'); }).listen(0, "127.0.0.1", function () { console.log(this.address().port); });`;
  const child = spawn(process.execPath, ["-e", script], { stdio: ["ignore", "pipe", "inherit"] });
  const port = await new Promise<string>((resolve) => child.stdout!.once("data", (d: Buffer) => resolve(d.toString().trim())));
  try {
    return await load("baseline: bare node:http, fixed JSON", { url: `http://127.0.0.1:${port}/` });
  } finally {
    child.kill();
  }
}
