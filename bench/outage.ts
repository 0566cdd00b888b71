/**
 * `npm run bench -- outage`: two `perch serve` nodes on a PostgreSQL cluster of their own, under
 * load, while the cluster has every connection ended, is restarted, and is stopped for 10 s. Prints
 * what the clients saw in each phase: status codes (with the envelope's code), the slowest request,
 * and when failures began and ended relative to the event; then whether both nodes are alive and
 * every acknowledged write is stored.
 */

import { OutageLoad, summarise } from "../test/support/outage-load.ts";
import { OwnCluster } from "../test/support/pg-cluster.ts";
import { spawnServer, tempDir } from "../test/support/server.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export async function outageBench(): Promise<unknown> {
  const cluster = await OwnCluster.start();
  const dataDir = tempDir();
  const env = { PERCH_DATA_DIR: dataDir, PERCH_DATABASE_URL: cluster.url, PERCH_LOG_LEVEL: "warn" };
  const nodes = [await spawnServer({ ...env, PERCH_NODE_NAME: "node-a" }), await spawnServer({ ...env, PERCH_NODE_NAME: "node-b" })];
  const exits: string[] = [];
  const t0 = Date.now();
  let stopping = false;
  for (const [i, n] of nodes.entries()) {
    n.process.once("exit", (code, signal) => {
      if (!stopping)
        exits.push(`node ${i} exited (${code ?? signal}) at ${((Date.now() - t0) / 1000).toFixed(1)} s after the load began: ${n.output().slice(-4000)}`);
    });
  }
  const load = await OutageLoad.start(
    nodes.map((n) => n.url),
    { perNode: Number(process.env.BENCH_OUTAGE_CLIENTS ?? 4) },
  );
  const phases: Array<{ name: string; from: number; to: number }> = [];
  const phase = async (name: string, event: () => Promise<unknown>, settleMs: number) => {
    const from = load.now();
    process.stderr.write(`outage bench: ${name}\n`);
    await event();
    await sleep(settleMs);
    phases.push({ name, from, to: load.now() });
  };
  await phase("baseline", async () => {}, 3000);
  await phase("pg_terminate_backend (every connection)", () => cluster.terminateAll(), 5000);
  await phase("pg_ctl restart -m fast", () => cluster.restart(), 5000);
  await phase(
    "pg_ctl stop -m fast, start again 10 s later",
    async () => {
      await cluster.halt();
      await sleep(10_000);
      await cluster.resume();
    },
    5000,
  );
  process.stderr.write("outage bench: stopping the load\n");
  const outcomes = await load.stop();

  // Every acknowledged contact must be stored (read from the database itself: the nodes may be gone).
  const stored = new Set((await cluster.query<{ name: string }>("select name from contacts")).map((r) => r.name));
  const missing = load.acknowledged().filter((a) => !stored.has(a.name)).length;
  stopping = true;
  const alive = nodes.map((n) => n.process.exitCode === null && n.process.signalCode === null);
  await Promise.all(nodes.map((n) => n.stop()));
  await cluster.destroy();
  return {
    suite: "outage",
    note: "measured on a shared, loaded 2-core machine",
    clients_per_node: Number(process.env.BENCH_OUTAGE_CLIENTS ?? 4),
    phases: phases.map((p) => ({ phase: p.name, seconds: Number((p.to - p.from).toFixed(1)), ...summarise(outcomes, p.from, p.to) })),
    nodes_alive_at_end: alive,
    node_exits: exits,
    acknowledged_contacts: load.acknowledged().length,
    acknowledged_missing: missing,
  };
}
