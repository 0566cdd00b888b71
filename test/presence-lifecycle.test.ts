import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { after, describe, test } from "node:test";
import pg from "pg";
import { Store } from "../src/store/index.ts";
import { type ServerProcess, STORES, spawnServer, startTestServer, tempDir } from "./support/server.ts";
import { EventStream } from "./support/sse.ts";
import { battery, counters, storedSamples } from "./support/telemetry.ts";
import { connect, eventually } from "./support/webrtc.ts";

for (const entry of STORES) {
  describe(`presence and telemetry across a node's life (${entry.name})`, () => {
    const cleanup: Array<() => unknown> = [];
    after(async () => {
      for (const f of cleanup.reverse()) await f();
    });

    test("a node that crashed with a device connected marks it offline when it starts again", async () => {
      const dataDir = tempDir();
      cleanup.push(() => rmSync(dataDir, { recursive: true, force: true }));
      const databaseUrl = (await entry.url()) ?? "";
      const env = { PERCH_DATA_DIR: dataDir, PERCH_DATABASE_URL: databaseUrl, PERCH_NODE_NAME: "crashing", PERCH_LOG_LEVEL: "warn" };
      let node: ServerProcess = await spawnServer(env);
      const conn = await connect(node);
      const store = await Store.open(databaseUrl || undefined, dataDir, { readWorkers: 0 });
      cleanup.push(() => store.close());
      try {
        await eventually(async () => (await store.read((r) => r.runtime.get(conn.publicKey)))?.online === 1, 10_000, "the device online");
        node.process.kill("SIGKILL");
        await new Promise((r) => node.process.once("exit", r));
        // The crash left the record online (only the heartbeat, now stale, says otherwise).
        assert.equal((await store.read((r) => r.runtime.get(conn.publicKey)))?.online, 1);
        node = await spawnServer(env);
        assert.equal((await store.read((r) => r.runtime.get(conn.publicKey)))?.online, 0, "marked offline at start");
      } finally {
        conn.close();
        await node.stop();
      }
    });

    test("close() marks the node's peers offline, deletes its heartbeat and stores the telemetry it holds", async () => {
      const dataDir = tempDir();
      const databaseUrl = await entry.url();
      // Frames wait in the writer (a write at most every minute, or at 500 samples): only close() can store them.
      const server = await startTestServer({ dataDir, config: { database_url: databaseUrl, node_name: "closing", telemetry: { write_interval_ms: 60_000 } } });
      cleanup.push(() => rmSync(dataDir, { recursive: true, force: true }));
      const conn = await connect(server);
      let stopped = false;
      try {
        await eventually(() => server.transport!.connection(conn.publicKey)?.active, 10_000, "the connection active");
        const t0 = Date.now() - 10_000;
        for (let i = 0; i < 20; i++) conn.sendTelemetry(battery(t0 + i));
        // Every frame has arrived and waits in the writer: none is stored before close().
        await eventually(() => server.transport!.telemetry.heldSamples === 20, 10_000, "the frames held");
        assert.equal(await storedSamples(server.store, conn.publicKey), 0, "nothing stored before close()");
        const closedAt = Date.now();
        await server.stop();
        stopped = true;
        const store = await Store.open(databaseUrl, dataDir, { readWorkers: 0 });
        try {
          assert.equal(await storedSamples(store, conn.publicKey), 20, "every frame received is stored");
          const row = await store.read((r) => r.runtime.getWithBeat(conn.publicKey));
          assert.deepEqual([row?.online, row?.beat_at], [0, null]);
          assert.ok((row?.last_seen_at ?? 0) >= closedAt, "seen until the node left");
        } finally {
          await store.close();
        }
      } finally {
        conn.close();
        if (!stopped) await server.stop();
      }
    });

    test("frames beyond the telemetry buffer are dropped and counted as overload; the rest counted once stored", async () => {
      const server = await startTestServer({ config: { database_url: await entry.url(), telemetry: { buffer_samples: 1 } } });
      const conn = await connect(server);
      try {
        await eventually(() => server.transport!.connection(conn.publicKey)?.active, 10_000, "the connection active");
        const before = await counters(server.url);
        const t0 = Date.now() - 10_000;
        // A burst: the first frame fills the buffer (one sample) until it is stored; the others find it full.
        for (let i = 0; i < 30; i++) conn.sendTelemetry(battery(t0 + i));
        const after = await eventually(
          async () => {
            const c = await counters(server.url);
            const counted = c.stored - before.stored + (c.dropped.overload ?? 0) - (before.dropped.overload ?? 0);
            return counted === 30 ? c : undefined;
          },
          10_000,
          "every frame counted",
        );
        const overload = (after.dropped.overload ?? 0) - (before.dropped.overload ?? 0);
        assert.ok(overload > 0, "some frames found the buffer full");
        assert.equal(after.dropped.store_unavailable ?? 0, 0, "the store was up: not counted as an outage");
        assert.equal(await storedSamples(server.store, conn.publicKey), after.stored - before.stored, "counted as accepted = stored");
      } finally {
        conn.close();
        await server.stop();
      }
    });
  });
}

for (const entry of STORES) {
  test(`a node whose port is taken fails to start and leaves nothing of itself open (${entry.name})`, async () => {
    const first = await startTestServer({ config: { database_url: await entry.url() } });
    const databaseUrl = await entry.url();
    try {
      await assert.rejects(startTestServer({ config: { database_url: databaseUrl, port: first.port, webrtc: { enabled: false } } }), /EADDRINUSE/);
      if (databaseUrl) {
        // The store's pool and the event bus's connection were closed: nothing connected to its database.
        const admin = new pg.Client({ connectionString: databaseUrl.replace(/\/[^/]+$/, "/postgres") });
        await admin.connect();
        try {
          const name = new URL(databaseUrl).pathname.slice(1);
          await eventually(
            async () => (await admin.query("select count(*)::int as n from pg_stat_activity where datname = $1", [name])).rows[0].n === 0,
            5_000,
            "no connection left to the database",
          );
        } finally {
          await admin.end();
        }
      }
    } finally {
      await first.stop();
    }
  });
}

for (const entry of STORES) {
  test(`a second start of a running node (its name, its store, its port) fails and leaves the running node's records alone (${entry.name})`, async () => {
    const dataDir = tempDir();
    const databaseUrl = await entry.url();
    const config = { database_url: databaseUrl, node_name: "started-twice" };
    const running = await startTestServer({ dataDir, config });
    const conn = await connect(running);
    const streams: EventStream[] = [];
    try {
      await eventually(() => running.transport!.connection(conn.publicKey)?.active, 10_000, "the connection active");
      const device = running.client();
      await device.login();
      const phone = running.client();
      await phone.login({ deviceToken: (await device.createDeviceToken()).token });
      for (let i = 0; i < 4; i++) streams.push(await EventStream.must(running.url, phone.accessToken));

      // The same node started again by mistake (same name, same store): the port is the running one's.
      await assert.rejects(startTestServer({ dataDir, config: { ...config, port: running.port, webrtc: { enabled: false } } }), /EADDRINUSE/);

      // What the running node holds is still recorded as its own: its session's four streams, its device online.
      const fifth = await EventStream.open(running.url, phone.accessToken);
      if (fifth instanceof EventStream) {
        fifth.close();
        assert.fail("a fifth stream of the session was admitted: the running node's four no longer count");
      }
      assert.equal(fifth.status, 429);
      const record = await running.store.read((r) => r.runtime.getWithBeat(conn.publicKey));
      assert.deepEqual([record?.online, record?.node, typeof record?.beat_at], [1, "started-twice", "number"], "the device still online on the running node");
      assert.equal(running.transport!.connection(conn.publicKey)?.active, true);
    } finally {
      for (const s of streams) s.close();
      conn.close();
      await running.stop();
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
}
