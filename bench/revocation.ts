/**
 * `npm run bench -- revocation`: from an operator's change that ends access to the end of the
 * affected `GET /side-control/events` streams. The operator is this process acting as the command
 * line does (its own store connection and a bus that only publishes; on SQLite no bus at all: the
 * node notices the other process's commit); the nodes are `perch serve` processes. Times are from
 * the change having committed (the call returned) to the stream's `session` event being read here;
 * for `DELETE /side-control/session`, from the request being sent.
 *
 * Runs: one node on SQLite (at `webrtc.peer_poll_ms`, 500 ms by default); two nodes sharing
 * PostgreSQL (`PERCH_BENCH_DATABASE_URL` or `PERCH_TEST_DATABASE_URL`), one stream on each. Each
 * change — `sessions revoke`, `peers block`, `peers remove`, and the controller's own
 * `DELETE /side-control/session` (sent to the last node, streams on every node) — is made
 * BENCH_REVOCATION_TRIALS times (10). With PostgreSQL also: a node killed with a device on it
 * (`nodeDeath`), half as many times (`BENCH_REVOCATION_ONLY=death`: that part alone).
 */
import { once } from "node:events";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openEventBus } from "../src/bus/index.ts";
import { loadConfig } from "../src/config/config.ts";
import { loadOrCreateServerKey } from "../src/config/server-key.ts";
import { encodeKey, generateKeyPair, privateKeyObject } from "../src/crypto/keys.ts";
import { DomainEvents } from "../src/domain/changes.ts";
import { systemClock } from "../src/domain/clock.ts";
import { Domain } from "../src/domain/index.ts";
import { PerchClient } from "../src/sdk/client.ts";
import { PerchConnection } from "../src/sdk/webrtc.ts";
import { Store } from "../src/store/index.ts";
import { benchConfig, freshPgDatabase, percentiles, round, type Server, startServer } from "./support.ts";

const TRIALS = Number(process.env.BENCH_REVOCATION_TRIALS ?? 10);
const PG_URL = process.env.PERCH_BENCH_DATABASE_URL || process.env.PERCH_TEST_DATABASE_URL || undefined;
const ACTIONS = ["sessions revoke", "peers block", "peers remove", "DELETE /side-control/session"] as const;
type Action = (typeof ACTIONS)[number];

/** A stream, once its first events came; `ended`: when `marker` (default the `session` event) arrived. */
async function openStream(url: string, bearer: string, marker = "event: session"): Promise<{ ended: Promise<number>; close(): void }> {
  const abort = new AbortController();
  const res = await fetch(`${url}/side-control/events`, { headers: { authorization: `Bearer ${bearer}` }, signal: abort.signal });
  if (res.status !== 200 || !res.body) throw new Error(`events refused: ${res.status}`);
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let text = "";
  let opened: () => void = () => {};
  const first = new Promise<void>((r) => {
    opened = r;
  });
  const ended = (async () => {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) throw new Error("the stream ended without a session event");
      text += decoder.decode(value, { stream: true });
      if (text.includes("event: runtime")) opened();
      if (text.includes(marker)) return performance.now();
    }
  })();
  ended.catch(() => {});
  await first;
  return { ended, close: () => abort.abort() };
}

/** The operator, as `perch` builds it: the store of the data directory or database, a bus that does not listen. */
async function operator(env: Record<string, string>): Promise<{ domain: Domain; close(): Promise<void> }> {
  const config = loadConfig({ ...process.env, PERCH_CONFIG: "", ...env });
  const pair = loadOrCreateServerKey(config.server_key_file ?? join(config.data_dir, "server.key"));
  const store = await Store.open(config.database_url, config.data_dir, { readWorkers: 0 });
  const bus = await openEventBus(config.database_url, { listen: false });
  const serverKey = { ...pair, privateKeyObject: privateKeyObject(pair.privateKey), publicKeyText: encodeKey(pair.publicKey) };
  const domain = new Domain({ store, clock: systemClock, config, serverKey, events: new DomainEvents(bus) });
  return {
    domain,
    close: async () => {
      await bus.close();
      await store.close();
    },
  };
}

async function run(kind: "sqlite" | "postgres"): Promise<Record<string, unknown>> {
  const dir = mkdtempSync(join(tmpdir(), "perch-bench-revocation-"));
  const env: Record<string, string> = { ...benchConfig(dir), PERCH_DATA_DIR: dir, PERCH_LOG_LEVEL: "warn" };
  if (kind === "postgres") env.PERCH_DATABASE_URL = await freshPgDatabase(PG_URL!);
  const nodes: Server[] = [await startServer({ ...env, PERCH_NODE_NAME: "rev-a" })];
  if (kind === "postgres") nodes.push(await startServer({ ...env, PERCH_NODE_NAME: "rev-b" }));
  const op = await operator(env);
  const a = nodes[0]!;
  const results: Record<string, unknown> = {};
  try {
    for (const action of ACTIONS) {
      const times: number[][] = nodes.map(() => []);
      for (let t = 0; t < TRIALS; t++) {
        const device = new PerchClient({ baseUrl: a.url, keyPair: generateKeyPair() });
        await device.login();
        const phone = new PerchClient({ baseUrl: a.url, keyPair: generateKeyPair() });
        const login = await phone.login({ deviceToken: (await device.createDeviceToken()).token });
        const streams = await Promise.all(nodes.map((n) => openStream(n.url, phone.accessToken!)));
        const sent = performance.now();
        await change(action, op.domain, { device: device.publicKey, session: login.session_id, bearer: phone.accessToken!, url: nodes.at(-1)!.url });
        // The node that takes the DELETE ends its own streams before it answers: timed from the request sent.
        const committed = action === "DELETE /side-control/session" ? sent : performance.now();
        const ends = await Promise.all(streams.map((s) => s.ended));
        for (const [i, end] of ends.entries()) times[i]!.push(end - committed);
        for (const s of streams) s.close();
      }
      results[action] = Object.fromEntries(
        nodes.map((_, i) => {
          const ms = times[i]!;
          return [i === 0 ? "node A" : "node B", { ...percentiles(ms), max: round(Math.max(...ms)), mean: round(ms.reduce((x, y) => x + y, 0) / ms.length) }];
        }),
      );
    }
  } finally {
    await op.close();
    await Promise.all(nodes.map((n) => n.stop()));
    rmSync(dir, { recursive: true, force: true });
  }
  return results;
}

/** Makes the change; resolves once it committed (and, on PostgreSQL, was published). */
async function change(action: Action, domain: Domain, o: { device: string; session: string; bearer: string; url: string }): Promise<void> {
  if (action === "sessions revoke") await domain.auth.revokeSession(o.session);
  else if (action === "peers block") await domain.peers.setBlocked(o.device, true);
  else if (action === "peers remove") await domain.peers.remove(o.device);
  else {
    const res = await fetch(`${o.url}/side-control/session`, { method: "DELETE", headers: { authorization: `Bearer ${o.bearer}` } });
    if (res.status !== 204) throw new Error(`DELETE /side-control/session answered ${res.status}`);
  }
}

/**
 * A node dying (`kill -9`) with a device connected to it: from the kill to the offline `runtime`
 * event on a stream held by the other node, beside the first moment the other node's REST
 * `GET /side-control/runtime` says offline (polled every 50 ms). The store's view changes once the
 * dead node's heartbeat is 8 s old, so both are at most 8 s (+ the last beat's age, up to 2 s
 * before the kill).
 */
async function nodeDeath(): Promise<Record<string, unknown>> {
  const dir = mkdtempSync(join(tmpdir(), "perch-bench-death-"));
  const env: Record<string, string> = { ...benchConfig(dir), PERCH_DATA_DIR: dir, PERCH_LOG_LEVEL: "warn", PERCH_DATABASE_URL: await freshPgDatabase(PG_URL!) };
  const b = await startServer({ ...env, PERCH_NODE_NAME: "death-b" });
  const event: number[] = [];
  const rest: number[] = [];
  try {
    for (let t = 0; t < Math.max(1, Math.round(TRIALS / 2)); t++) {
      const a = await startServer({ ...env, PERCH_NODE_NAME: "death-a" });
      const keyPair = generateKeyPair();
      const conn = await PerchConnection.connect({ baseUrl: a.url, keyPair });
      const device = new PerchClient({ baseUrl: a.url, keyPair });
      await device.login();
      const phone = new PerchClient({ baseUrl: b.url, keyPair: generateKeyPair() });
      await phone.login({ deviceToken: (await device.createDeviceToken()).token });
      const offline = await openStream(b.url, phone.accessToken!, '{"online":false');
      const killed = performance.now();
      a.child.kill("SIGKILL");
      let restAt: number | undefined;
      while (restAt === undefined) {
        if (!(await phone.sideControl.runtime()).online) restAt = performance.now();
        else await new Promise((r) => setTimeout(r, 50));
      }
      event.push((await offline.ended) - killed);
      rest.push(restAt - killed);
      offline.close();
      conn.close();
      // Killed: its exit may have come already (`stop()` would wait for another one).
      if (a.child.exitCode === null && a.child.signalCode === null) await once(a.child, "exit");
    }
  } finally {
    await b.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  const figure = (ms: number[]) => ({ ...percentiles(ms), max: round(Math.max(...ms)), min: round(Math.min(...ms)) });
  return { trials: event.length, offline_event_after_kill: figure(event), rest_offline_after_kill: figure(rest) };
}

export async function revocationBench(): Promise<unknown> {
  const [load1] = (await import("node:os")).loadavg();
  // BENCH_REVOCATION_ONLY=death: the node killed, nothing else.
  if (process.env.BENCH_REVOCATION_ONLY === "death") {
    return { suite: "revocation", load_average_1m: round(load1 ?? 0), node_killed_runtime_ms: PG_URL ? await nodeDeath() : "skipped: no PostgreSQL URL" };
  }
  return {
    suite: "revocation",
    unit: "ms from the change committed (DELETE: the request sent) to the stream's session event read by the client",
    trials: TRIALS,
    load_average_1m: round(load1 ?? 0),
    sqlite_one_node: await run("sqlite"),
    ...(PG_URL
      ? { postgres_two_nodes: await run("postgres"), node_killed_runtime_ms: await nodeDeath() }
      : { postgres_two_nodes: "skipped: no PERCH_BENCH_DATABASE_URL / PERCH_TEST_DATABASE_URL" }),
  };
}
