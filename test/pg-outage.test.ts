import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import { OutageLoad } from "./support/outage-load.ts";
import { OwnCluster } from "./support/pg-cluster.ts";
import { type ServerProcess, spawnServer, TEST_DATABASE_URL, tempDir } from "./support/server.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Waits until `check` holds, polling; fails with `what` after `ms`. */
async function until(what: string, check: () => Promise<boolean>, ms = 20_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check().catch(() => false))) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

// These restart and stop PostgreSQL, so they run on a cluster of their own (never the shared one),
// started with the same script CI uses; they run where PostgreSQL tests run.
describe("nodes survive their PostgreSQL", { skip: TEST_DATABASE_URL ? false : "PERCH_TEST_DATABASE_URL is not set (no PostgreSQL here)" }, () => {
  let cluster: OwnCluster;
  let dataDir: string;
  let nodes: ServerProcess[];

  before(async () => {
    cluster = await OwnCluster.start();
    dataDir = tempDir();
    const env = { PERCH_DATA_DIR: dataDir, PERCH_DATABASE_URL: cluster.url, PERCH_LOG_LEVEL: "warn" };
    nodes = [await spawnServer({ ...env, PERCH_NODE_NAME: "node-a" }), await spawnServer({ ...env, PERCH_NODE_NAME: "node-b" })];
  });
  after(async () => {
    await Promise.all((nodes ?? []).map((n) => n.stop()));
    await cluster?.destroy();
    if (dataDir) rmSync(dataDir, { recursive: true, force: true });
  });

  const alive = () => nodes.map((n) => n.process.exitCode === null && n.process.signalCode === null);
  const healthy = (n: ServerProcess) => async () => (await fetch(`${n.url}/healthz`)).status === 200;

  test("ending every database connection under load, again and again, stops no node; every acknowledged write is stored", async () => {
    const load = await OutageLoad.start(
      nodes.map((n) => n.url),
      { perNode: 3 },
    );
    let ended = 0;
    for (let round = 0; round < 4; round++) {
      await sleep(400);
      ended += await cluster.terminateAll();
    }
    await sleep(400);
    const outcomes = await load.stop();
    assert.ok(ended >= 4, `connections were ended (${ended})`);
    assert.deepEqual(alive(), [true, true], `both nodes are alive:\n${nodes.map((n) => n.output().slice(-2000)).join("\n")}`);
    assert.ok(outcomes.filter((o) => o.at > 0).length > 0);
    // Recovered without a restart: both nodes serve again.
    for (const n of nodes) await until(`${n.url} to recover`, healthy(n));
    const stored = new Set((await cluster.query<{ name: string }>("select name from contacts")).map((r) => r.name));
    const acknowledged = load.acknowledged();
    assert.ok(acknowledged.length > 0, "some contacts were created");
    assert.deepEqual(
      acknowledged.filter((a) => !stored.has(a.name)),
      [],
      "every contact answered 201 is stored",
    );
  });

  test("a PostgreSQL restart (pg_ctl restart -m fast) under load stops no node; both recover by themselves", async () => {
    const load = await OutageLoad.start(
      nodes.map((n) => n.url),
      { perNode: 2 },
    );
    await sleep(300);
    await cluster.restart();
    await sleep(1000);
    await load.stop();
    assert.deepEqual(alive(), [true, true], "both nodes are alive");
    for (const n of nodes) await until(`${n.url} to recover`, healthy(n));
    const stored = new Set((await cluster.query<{ name: string }>("select name from contacts")).map((r) => r.name));
    assert.deepEqual(
      load.acknowledged().filter((a) => !stored.has(a.name)),
      [],
    );
  });
});
