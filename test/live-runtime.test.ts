import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { NODE_STALE_MS } from "../src/domain/presence.ts";
import { STORES, startTestServer, type TestServer } from "./support/server.ts";
import { EventStream } from "./support/sse.ts";

/**
 * A node that dies writes nothing more: its devices turn offline in the store's view once its
 * heartbeat is `NODE_STALE_MS` old. The `runtime` event of a stream watching such a device follows
 * that change (the stream's node reads the dead node's heartbeat at its deadline), never before it,
 * and a node that keeps beating never makes one. Here the other node is a row in the store: a
 * heartbeat written by the test, and the device recorded online there.
 */
for (const store of STORES) {
  describe(`the runtime event after another node stops beating (${store.name})`, () => {
    let server: TestServer;
    before(async () => {
      server = await startTestServer({ config: { database_url: await store.url(), node_name: "watcher" } });
    });
    after(() => server.stop());

    /** A paired device recorded online on `node`, whose last heartbeat was `age` ms ago. */
    async function onlineElsewhere(node: string, age: number) {
      const device = server.client();
      await device.login();
      const phone = server.client();
      await phone.login({ deviceToken: (await device.createDeviceToken()).token });
      const beatAt = Date.now() - age;
      await server.store.transaction(async (tx) => {
        await tx.runtime.beat(node, beatAt);
        await tx.runtime.put({
          public_key: device.publicKey,
          online: 1,
          last_seen_at: beatAt,
          last_addr: null,
          rx_bytes: 0,
          tx_bytes: 0,
          node,
          updated_at: beatAt,
        });
      });
      const stream = await EventStream.must(server.url, phone.accessToken);
      const first = await stream.until((s) => s.events("runtime")[0], "the first runtime event");
      assert.deepEqual([first.data.online, first.data.node], [true, node]);
      return { phone, stream, beat: (at: number) => server.store.transaction((tx) => tx.runtime.beat(node, at)) };
    }

    test("a node that stopped beating: the offline event comes once the store says offline, not a periodic re-read later", async () => {
      const beatAge = NODE_STALE_MS - 1_500;
      const opened = Date.now();
      const { phone, stream } = await onlineElsewhere("dead", beatAge);
      const deadline = opened - beatAge + NODE_STALE_MS;
      // Well before the 15 s re-read the streams otherwise fall back on.
      const offline = await stream.until((s) => s.events("runtime").find((e) => e.data.online === false), "the offline event", 6_000);
      assert.ok(Date.now() >= deadline, "not before the heartbeat was stale");
      assert.equal(offline.data.node, "dead");
      assert.equal((await phone.sideControl.runtime()).online, false, "what REST says agrees");
      stream.close();
    });

    test("a node that keeps beating makes no offline event; once it stops, one comes", async () => {
      const { stream, beat } = await onlineElsewhere("alive", NODE_STALE_MS - 1_000);
      // Beats until a second past the first deadline: each moves the deadline on.
      const until = Date.now() + 2_000;
      let lastBeat = 0;
      while (Date.now() < until) {
        lastBeat = Date.now();
        await beat(lastBeat);
        await new Promise((r) => setTimeout(r, 300));
      }
      // The next runtime event is the offline one, and it comes only once the last beat is stale
      // (had the beats not moved the deadline, it would have come at the first one, a second before the loop ended).
      const offline = await stream.until((s) => s.events("runtime")[1], "the offline event", NODE_STALE_MS + 4_000);
      assert.equal(offline.data.online, false);
      assert.ok(Date.now() >= lastBeat + NODE_STALE_MS, "not before the last beat was stale");
      stream.close();
    });
  });
}
