import { type ChildProcess, spawn } from "node:child_process";
import { createSocket } from "node:dgram";
import { mkdtempSync, rmSync } from "node:fs";
import { type AddressInfo, createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import v8 from "node:v8";
import vm from "node:vm";
import pg from "pg";
import type { Logger } from "pino";
import { type ConfigInput, loadConfig } from "../../src/config/config.ts";
import { generateKeyPair } from "../../src/crypto/keys.ts";
import type { Clock } from "../../src/domain/clock.ts";
import type { Surface } from "../../src/http/surface.ts";
import { PerchClient } from "../../src/sdk/client.ts";
import { Node, type RunningServer, type StartOptions, startServer } from "../../src/server.ts";
import { engines, TEST_ENGINES } from "./engines.ts";

export const ROOT = new URL("../../", import.meta.url).pathname;

/** The PostgreSQL server tests may use (CI sets it); undefined means SQLite only. */
export const TEST_DATABASE_URL = process.env.PERCH_TEST_DATABASE_URL || undefined;

export function tempDir(prefix = "perch-test-"): string {
  return mkdtempSync(join(tmpdir(), prefix));
}

/** A new, empty PostgreSQL database on the test server; returns its URL. */
export async function freshPostgresDatabase(): Promise<string> {
  if (!TEST_DATABASE_URL) throw new Error("PERCH_TEST_DATABASE_URL is not set");
  const name = `perch_${Date.now().toString(36)}_${Math.random().toString(36).slice(2, 8)}`;
  const admin = new pg.Client({ connectionString: TEST_DATABASE_URL });
  await admin.connect();
  try {
    await admin.query(`create database ${name}`);
  } finally {
    await admin.end();
  }
  const url = new URL(TEST_DATABASE_URL);
  url.pathname = `/${name}`;
  return url.toString();
}

/** The stores a test should run against: SQLite always, PostgreSQL when configured. */
export const STORES: Array<{ name: string; url: () => Promise<string | undefined> }> = [
  { name: "sqlite", url: async () => undefined },
  ...(TEST_DATABASE_URL ? [{ name: "postgres", url: freshPostgresDatabase }] : []),
];

export interface TestServer extends RunningServer {
  dataDir: string;
  /** A client with a new key pair. */
  client(): PerchClient;
  /** Stops the server and removes its data directory. */
  stop(): Promise<void>;
}

/** A TCP port on the loopback address that no socket holds right now. */
export async function freeTcpPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((resolve, reject) => {
    s.once("error", reject);
    s.listen(0, "127.0.0.1", resolve);
  });
  const { port } = s.address() as AddressInfo;
  await new Promise<void>((resolve) => s.close(() => resolve()));
  return port;
}

/** A UDP port on the loopback address that no socket holds right now. */
export async function freeUdpPort(): Promise<number> {
  const socket = createSocket("udp4");
  await new Promise<void>((resolve, reject) => {
    socket.once("error", reject);
    socket.bind(0, "127.0.0.1", resolve);
  });
  const { port } = socket.address();
  await new Promise<void>((resolve) => socket.close(() => resolve()));
  return port;
}

/** A test node's configuration: `config` over the loopback address, any port, no rate limits, the tests' engines. */
function testConfig(dataDir: string, config: ConfigInput = {}) {
  return loadConfig(
    {},
    {
      port: 0,
      host: "127.0.0.1",
      data_dir: dataDir,
      // PERCH_TEST_LOG=warn (or any level) shows the server's log while debugging a test.
      log_level: (process.env.PERCH_TEST_LOG as "warn" | undefined) ?? "silent",
      rate_limits: { login_per_key: 0, login_per_address: 0, device_token_per_device: 0, offer_per_key: 0 },
      ...config,
      // The CPU bound judges the whole process, here the test's own (its devices, its other servers)
      // on a machine shared with other test files: off unless a test sets it.
      fleet: { max_cpu: 0, ...config.fleet },
      engines: { ...TEST_ENGINES, ...config.engines },
    },
  );
}

/** Starts the real server in this process on a random port, with a temporary data directory. */
export async function startTestServer(
  o: {
    config?: ConfigInput;
    clock?: Clock;
    dataDir?: string;
    logger?: Logger;
    surfaces?: () => Surface[];
    cleanupIntervalMs?: number;
    liveKeepAliveMs?: number;
    engines?: StartOptions["engines"];
    cpuShare?: () => number;
  } = {},
): Promise<TestServer> {
  const dataDir = o.dataDir ?? tempDir();
  // The UDP port defaults to the HTTP port's number, which another process on this machine (a
  // WebRTC peer of a test running beside) may hold as its UDP port: a free UDP port is picked here.
  const udpPort = o.config?.webrtc?.udp_port ?? (await freeUdpPort());
  const config = testConfig(dataDir, { ...o.config, webrtc: { ...o.config?.webrtc, udp_port: udpPort } });
  const server = await startServer({
    config,
    ...(o.clock ? { clock: o.clock } : {}),
    ...(o.logger ? { logger: o.logger } : {}),
    ...(o.surfaces ? { surfaces: o.surfaces } : {}),
    ...(o.cleanupIntervalMs ? { cleanupIntervalMs: o.cleanupIntervalMs } : {}),
    ...(o.liveKeepAliveMs ? { liveKeepAliveMs: o.liveKeepAliveMs } : {}),
    ...(o.cpuShare ? { cpuShare: o.cpuShare } : {}),
    // The test process's shared engine host unless the test brings its own.
    engines: o.engines ?? engines(),
  });
  const now = o.clock ? () => o.clock!.now() : undefined;
  return {
    ...server,
    dataDir,
    client: () => new PerchClient({ baseUrl: server.url, keyPair: generateKeyPair(), ...(now ? { now } : {}) }),
    async stop() {
      await server.close();
      if (server.transport) await collectClosedConnections();
      if (!o.dataDir) rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** A node built as startTestServer's, listening on nothing: every request is served in process. */
export interface TestNode {
  node: Node;
  /** The base URL the node's clients are given; it names no socket: `fetch` below serves it in process. */
  url: string;
  /** `fetch` for this node's URLs, served in process (`Node.request`: Node's HTTP parser and the exchange, as over TCP). */
  fetch: typeof fetch;
  request: Node["request"];
  domain: Node["domain"];
  store: Node["store"];
  config: Node["config"];
  dataDir: string;
  /** A client with a new key pair, whose requests are served in process. */
  client(): PerchClient;
  /** Closes the node and removes its data directory. */
  stop(): Promise<void>;
}

/**
 * The fast layer's node (no port, no WebRTC transport, no periodic jobs, no presence heartbeat):
 * for tests of HTTP behaviour that need no socket; startTestServer's configuration and options.
 */
export async function startTestNode(o: Parameters<typeof startTestServer>[0] = {}): Promise<TestNode> {
  const dataDir = o.dataDir ?? tempDir();
  const config = testConfig(dataDir, o.config);
  const node = await Node.build({
    config,
    ...(o.clock ? { clock: o.clock } : {}),
    ...(o.logger ? { logger: o.logger } : {}),
    ...(o.surfaces ? { surfaces: o.surfaces } : {}),
    ...(o.cpuShare ? { cpuShare: o.cpuShare } : {}),
    engines: o.engines ?? engines(),
  });
  const url = "http://in-process";
  const served: typeof fetch = (input, init) => {
    const target = new URL(input instanceof Request ? input.url : String(input), url);
    if (target.origin !== url) throw new Error(`${target.origin} is not this in-process node's (${url})`);
    const request = input instanceof Request ? input : undefined;
    return node.request(
      `${target.pathname}${target.search}`,
      request ? ({ method: request.method, headers: request.headers, body: request.body, duplex: "half", ...init } as RequestInit) : init,
    );
  };
  const now = o.clock ? () => o.clock!.now() : undefined;
  return {
    node,
    url,
    fetch: served,
    request: node.request,
    domain: node.domain,
    store: node.store,
    config: node.config,
    dataDir,
    client: () => new PerchClient({ baseUrl: url, keyPair: generateKeyPair(), fetch: served, ...(now ? { now } : {}) }),
    async stop() {
      await node.close();
      if (!o.dataDir) rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/**
 * node-datachannel releases what keeps the event loop alive only when a closed peer connection
 * object is garbage-collected; a test process would otherwise linger after its last test.
 */
async function collectClosedConnections(): Promise<void> {
  v8.setFlagsFromString("--expose-gc");
  const gc = vm.runInNewContext("gc") as () => void;
  gc();
  await new Promise((r) => setTimeout(r, 50));
  gc();
}

export interface ServerProcess {
  url: string;
  process: ChildProcess;
  output(): string;
  /** SIGTERM, then wait for the exit code. */
  stop(): Promise<number | null>;
}

/**
 * Starts `perch serve` as its own process (on the pinned Node) and waits for its listening line.
 * With `cwd`, it runs there and its port, address and configuration file are that directory's
 * (`./perch.yaml`, PERCH_CONFIG unset) unless `env` says otherwise.
 */
export async function spawnServer(env: Record<string, string>, o: { cwd?: string } = {}): Promise<ServerProcess> {
  const environment: Record<string, string | undefined> = {
    // A perch.yaml in the checkout (the README's tour writes one) is not this server's.
    ...(o.cwd ? {} : { PERCH_CONFIG: "" }),
    ...process.env,
    ...(o.cwd ? { PERCH_CONFIG: undefined } : { PERCH_PORT: "0", PERCH_HOST: "127.0.0.1" }),
    PERCH_LOG_LEVEL: "info",
    // One recogniser process, as the in-process servers (support/engines.ts), unless the test says.
    PERCH_RECOGNISER_PROCESSES: "1",
    PERCH_FAST_RECOGNITION_AFTER_MS: "false",
    ...env,
  };
  for (const [k, v] of Object.entries(environment)) if (v === undefined) delete environment[k];
  const child = spawn(join(ROOT, "bin/perch"), ["serve"], {
    env: environment,
    stdio: ["ignore", "pipe", "pipe"],
    ...(o.cwd ? { cwd: o.cwd } : {}),
  });
  let output = "";
  // No deadline of its own (a loaded machine once took over 20 s to start one): the server prints
  // its listening line or exits, and a start that hangs is bounded by the test's timeout.
  const url = await new Promise<string>((resolve, reject) => {
    const onData = (chunk: Buffer) => {
      output += chunk.toString();
      const m = /"address":"([^"]+)","scheme":"(https?)".*"msg":"perch listening"/.exec(output);
      if (m) resolve(`${m[2]}://${m[1]}`);
    };
    child.stdout.on("data", onData);
    child.stderr.on("data", (c: Buffer) => (output += c.toString()));
    child.once("exit", (code) => reject(new Error(`server exited with ${code}:\n${output}`)));
  });
  process.once("exit", () => child.exitCode === null && child.signalCode === null && child.kill("SIGKILL"));
  return {
    url,
    process: child,
    output: () => output,
    stop: () =>
      new Promise((resolve) => {
        if (child.exitCode !== null || child.signalCode !== null) return resolve(child.exitCode);
        // A shutdown that cannot finish (its store halted by the test) is killed, never left running.
        const kill = setTimeout(() => child.kill("SIGKILL"), 60_000);
        child.once("exit", (code) => {
          clearTimeout(kill);
          resolve(code);
        });
        child.kill("SIGTERM");
      }),
  };
}
