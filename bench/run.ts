/**
 * `npm run bench -- public`: load-tests one `perch serve` process with autocannon (in this process,
 * so the generator and the server each get a core) and prints JSON figures.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import autocannon from "autocannon";
import { buildAssertion } from "../src/crypto/assertion.ts";
import { decodeKey, generateKeyPair, privateKeyObject, sharedSecret } from "../src/crypto/keys.ts";
import { PerchClient } from "../src/sdk/client.ts";
import { Store } from "../src/store/index.ts";

const ROOT = new URL("../", import.meta.url).pathname;
const DURATION_S = Number(process.env.BENCH_DURATION_S ?? 10);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 32);
const TELEMETRY_SAMPLES = 100_000;

interface Figure {
  name: string;
  requests_per_second: number;
  latency_ms: { p50: number; p99: number; mean: number };
  requests: number;
  non_2xx: number;
  errors: number;
}

async function startServer(dataDir: string, env: Record<string, string> = {}): Promise<{ url: string; child: ChildProcess }> {
  const child = spawn(join(ROOT, "bin/perch"), ["serve"], {
    env: {
      ...process.env,
      PERCH_PORT: "0",
      PERCH_HOST: "127.0.0.1",
      PERCH_DATA_DIR: dataDir,
      PERCH_LOG_LEVEL: "info",
      PERCH_CONFIG: "",
      ...env,
    },
    stdio: ["ignore", "pipe", "inherit"],
  });
  let output = "";
  const url = await new Promise<string>((resolve, reject) => {
    child.stdout!.on("data", (chunk: Buffer) => {
      if (output === null) return;
      output += chunk.toString();
      const m = /"address":"([^"]+)"/.exec(output);
      if (m) resolve(`http://${m[1]}`);
    });
    child.once("exit", (code) => reject(new Error(`server exited with ${code}`)));
  });
  // Keep draining the request log (as a real deployment's log shipper would) without storing it.
  child.stdout!.removeAllListeners("data");
  child.stdout!.resume();
  return { url, child };
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

async function load(name: string, opts: autocannon.Options): Promise<Figure> {
  const r = await autocannon({ connections: CONNECTIONS, duration: DURATION_S, ...opts });
  return {
    name,
    requests_per_second: Math.round(r.requests.average),
    latency_ms: { p50: r.latency.p50, p99: r.latency.p99, mean: Math.round(r.latency.mean * 100) / 100 },
    requests: r.requests.total,
    non_2xx: r.non2xx,
    errors: r.errors,
  };
}

async function publicBench(): Promise<unknown> {
  const dataDir = mkdtempSync(join(tmpdir(), "perch-bench-"));
  const deviceKey = generateKeyPair();
  const device = new PerchClient({ baseUrl: "http://unused", keyPair: deviceKey });

  // Seed 100,000 telemetry samples (one a second, ~28 h) before the server opens the store.
  const end = Date.now();
  const start = end - TELEMETRY_SAMPLES * 1000;
  {
    const store = await Store.open(process.env.PERCH_DATABASE_URL, dataDir);
    // Samples belong to a registered peer (the login below finds it registered).
    await store.transaction(async (tx) => {
      await tx.peers.register({ public_key: device.publicKey, role: "client", status: "active", device_info: "{}", created_at: end, updated_at: end });
      await tx.telemetry.insert(
        device.publicKey,
        Array.from({ length: TELEMETRY_SAMPLES }, (_, i) => ({ field: "battery.percent", observedAt: start + i * 1000, value: (i * 7) % 101 })),
      );
    });
    await store.close();
  }

  const { url, child } = await startServer(dataDir, {
    // Limits off: the load generator is one address.
    ...rateLimitsOff(dataDir),
  });
  try {
    const client = new PerchClient({ baseUrl: url, keyPair: deviceKey });
    await client.login();
    const token = await client.createDeviceToken();
    const phone = new PerchClient({ baseUrl: url, keyPair: generateKeyPair() });
    await phone.login({ deviceToken: token.token });
    await client.putStatus({ volume: 50, battery_percent: 80, labels: { room: "lab" } });

    // Logins: 1,000 device keys, a fresh assertion (new nonce) for every request.
    const serverPublicKey = decodeKey((await client.serverInfo()).public_key);
    const keys = Array.from({ length: 1000 }, () => {
      const pair = generateKeyPair();
      const c = new PerchClient({ baseUrl: url, keyPair: pair });
      return { pair, publicKey: c.publicKey, secret: sharedSecret(privateKeyObject(pair.privateKey), serverPublicKey) };
    });
    let n = 0;
    const figures: Figure[] = [];
    figures.push(
      await load("POST /login (primary)", {
        url,
        requests: [
          {
            method: "POST",
            path: "/login",
            setupRequest: (req) => {
              const k = keys[n++ % keys.length]!;
              const assertion = buildAssertion({
                clientPublicKey: k.pair.publicKey,
                serverPublicKey,
                sharedSecret: k.secret,
                now: Math.floor(Date.now() / 1000),
              });
              return { ...req, headers: { authorization: `Bearer ${assertion}`, "x-public-key": k.publicKey } };
            },
          },
        ],
      }),
    );
    const auth = { authorization: `Bearer ${client.accessToken}` };
    figures.push(await load("GET /me/status", { url: `${url}/me/status`, headers: auth }));
    figures.push(
      await load("PUT /me/status", {
        url: `${url}/me/status`,
        method: "PUT",
        headers: { ...auth, "content-type": "application/json" },
        body: JSON.stringify({
          volume: 42,
          muted: false,
          battery_percent: 77,
          charging: true,
          gnss_latitude: 31.23,
          gnss_longitude: 121.47,
          labels: { room: "lab" },
        }),
      }),
    );
    const q = new URLSearchParams({
      field: "battery.percent",
      start_time_ms: String(start),
      end_time_ms: String(end),
      bucket_ms: String(Math.ceil((end - start) / 1000)),
      aggregate: "avg",
    });
    figures.push(
      await load(`GET /side-control/telemetry/aggregate (${TELEMETRY_SAMPLES} samples, avg, 1000 buckets)`, {
        url: `${url}/side-control/telemetry/aggregate?${q}`,
        headers: { authorization: `Bearer ${phone.accessToken}` },
        connections: 1, // a latency figure: one dashboard query at a time
      }),
    );
    const ceiling = await baseline();
    return {
      suite: "public",
      store: process.env.PERCH_DATABASE_URL ? "postgres" : "sqlite",
      node: process.version,
      duration_s: DURATION_S,
      connections: CONNECTIONS,
      figures: [...figures, ceiling],
      ratios: {
        get_status_per_baseline: round(figures[1]!.requests_per_second / ceiling.requests_per_second),
        login_per_get_status: round(figures[0]!.requests_per_second / figures[1]!.requests_per_second),
        put_status_per_get_status: round(figures[2]!.requests_per_second / figures[1]!.requests_per_second),
      },
      goals: {
        login_per_second: { goal: 4000, reached: figures[0]!.requests_per_second },
        get_status_per_second: { goal: 15000, reached: figures[1]!.requests_per_second },
        aggregate_p50_ms: { goal: 20, reached: figures[3]!.latency_ms.p50 },
      },
    };
  } finally {
    child.kill("SIGTERM");
    await new Promise((r) => child.once("exit", r));
    rmSync(dataDir, { recursive: true, force: true });
  }
}

function rateLimitsOff(dataDir: string): Record<string, string> {
  const file = join(dataDir, "bench.json");
  writeFileSync(file, JSON.stringify({ rateLimits: { loginPerKey: 0, loginPerAddress: 0, deviceTokenPerDevice: 0 } }));
  return { PERCH_CONFIG: file };
}

function round(x: number): number {
  return Math.round(x * 100) / 100;
}

const suites: Record<string, () => Promise<unknown>> = { public: publicBench };
const wanted = process.argv.slice(2).filter((a) => a !== "--");
const names = wanted.length > 0 ? wanted : Object.keys(suites);
for (const name of names) {
  const suite = suites[name];
  if (!suite) {
    process.stderr.write(`unknown bench suite ${name}; known: ${Object.keys(suites).join(", ")}\n`);
    process.exit(2);
  }
  process.stdout.write(`${JSON.stringify(await suite(), null, 2)}\n`);
}
