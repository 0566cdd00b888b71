import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { encodeKey, generateKeyPair } from "../src/crypto/keys.ts";
import { ManualClock } from "../src/domain/clock.ts";
import { DomainError } from "../src/domain/errors.ts";
import { NODE_STALE_MS } from "../src/domain/presence.ts";
import type { PerchClient } from "../src/sdk/client.ts";
import { STORES, startTestServer, type TestServer } from "./support/server.ts";

// Runtime and telemetry are written by the WebRTC transport; until it exists they are written here
// the way it will write them (store / domain), and read back over HTTP.
for (const store of STORES) {
  describe(`runtime and telemetry written by the node (${store.name})`, () => {
    const clock = new ManualClock(Date.UTC(2026, 10, 21, 12, 0, 0));
    let server: TestServer;
    let device: PerchClient;
    let phone: PerchClient;
    before(async () => {
      server = await startTestServer({ clock, config: { database_url: await store.url() } });
      device = server.client();
      await device.login();
      phone = server.client();
      await phone.login({ deviceToken: (await device.createDeviceToken()).token });
    });
    after(() => server.stop());

    test("runtime: online while its node's heartbeat is fresh, offline once it is stale, fields as RFC 3339 / numbers", async () => {
      const now = clock.now();
      await server.store.transaction(async (tx) => {
        await tx.runtime.beat("node-a", now);
        await tx.runtime.put({
          public_key: device.publicKey,
          online: 1,
          last_seen_at: now,
          last_addr: "192.0.2.10:50000",
          rx_bytes: 1234,
          tx_bytes: 5678,
          node: "node-a",
          updated_at: now,
        });
      });
      const expected = {
        online: true,
        last_seen_at: new Date(now).toISOString(),
        last_addr: "192.0.2.10:50000",
        rx_bytes: 1234,
        tx_bytes: 5678,
        node: "node-a",
      };
      assert.deepEqual(await device.runtime(), expected);
      assert.deepEqual(await phone.sideControl.runtime(), expected);

      clock.advance(NODE_STALE_MS - 1);
      assert.equal((await device.runtime()).online, true);
      // A heartbeat of the node keeps every peer it holds online, with no write per peer.
      await server.store.transaction((tx) => tx.runtime.beat("node-a", clock.now()));
      clock.advance(NODE_STALE_MS - 1);
      assert.equal((await device.runtime()).online, true);
      clock.advance(2); // no heartbeat for longer than the bound: the node that held the connection is gone
      assert.deepEqual(await device.runtime(), { ...expected, online: false });
      // Another node's heartbeat says nothing about this one.
      await server.store.transaction((tx) => tx.runtime.beat("node-b", clock.now()));
      assert.equal((await device.runtime()).online, false);

      const row = (await server.store.read((r) => r.runtime.get(device.publicKey)))!;
      await server.store.transaction((tx) => tx.runtime.put({ ...row, online: 0, updated_at: clock.now() }));
      assert.deepEqual(await phone.sideControl.runtime(), { ...expected, online: false });
    });

    test("telemetry merges battery and GNSS into the status only when newer than reported_at", async () => {
      const t = clock.now();
      await device.putStatus({ volume: 30, battery_percent: 50, reported_at: new Date(t).toISOString() });

      await server.domain.telemetry.record(device.publicKey, [
        { field: "battery.percent", observedAt: t - 1000, value: 10 }, // older than the status: not merged
        { field: "gnss.latitude", observedAt: t + 1000, value: 31.5 },
        { field: "gnss.longitude", observedAt: t + 1000, value: 121.25 },
        { field: "battery.charging", observedAt: t + 2000, value: 1 },
        { field: "system.temperature_c", observedAt: t + 3000, value: 40 }, // not a status field
      ]);
      assert.deepEqual(await device.status(), {
        volume: 30,
        battery_percent: 50,
        gnss_latitude: 31.5,
        gnss_longitude: 121.25,
        charging: true,
        reported_at: new Date(t + 2000).toISOString(),
      });

      await server.domain.telemetry.record(device.publicKey, [{ field: "battery.percent", observedAt: t + 5000, value: 66.6 }]);
      const status = await phone.sideControl.status();
      assert.equal(status.battery_percent, 67, "rounded to the status's integer percent");
      assert.equal(status.reported_at, new Date(t + 5000).toISOString());

      // A time no Date can hold (the transport does not bound the past) is refused whole, not a RangeError half way.
      for (const observedAt of [-9e15, 9e15, 1.5]) {
        await assert.rejects(
          server.domain.telemetry.record(device.publicKey, [{ field: "battery.percent", observedAt, value: 1 }]),
          (e: unknown) => e instanceof DomainError && e.kind === "invalid",
          String(observedAt),
        );
      }
      assert.equal((await phone.sideControl.status()).battery_percent, 67, "nothing merged");

      const latest = await phone.sideControl.telemetryLatest(["battery.percent", "battery.charging", "network.rssi_dbm"]);
      assert.deepEqual(
        latest.values.map((v) => [v.field, v.value, v.observed_at_unix_ms]),
        [
          ["battery.percent", 66.6, t + 5000],
          ["battery.charging", 1, t + 2000],
        ],
        "only fields that have data",
      );
    });

    test("a batch of many peers stores each one's samples and status; a key that is no peer is left out, not failing the others", async () => {
      const t = clock.now() + 60_000;
      const unknown = encodeKey(generateKeyPair().publicKey);
      const status = await device.status();
      await server.domain.telemetry.recordMany([
        { publicKey: unknown, samples: [{ field: "battery.percent", observedAt: t, value: 5 }] },
        { publicKey: device.publicKey, samples: [{ field: "battery.percent", observedAt: t, value: 80 }] },
        // The same peer twice in one batch: both entries stored, the newer value in the status.
        {
          publicKey: device.publicKey,
          samples: [
            { field: "battery.percent", observedAt: t + 10, value: 81 },
            { field: "network.rssi_dbm", observedAt: t + 10, value: -60 },
          ],
        },
      ]);
      assert.deepEqual(await device.status(), { ...status, battery_percent: 81, reported_at: new Date(t + 10).toISOString() });
      const range = await phone.sideControl.telemetry({ field: "battery.percent", start_time_ms: t, end_time_ms: t + 11 });
      assert.deepEqual(
        range.points.map((p) => [p.observed_at_unix_ms, p.value]),
        [
          [t, 80],
          [t + 10, 81],
        ],
      );
      assert.equal(await server.store.read((r) => r.peers.get(unknown)), undefined, "telemetry registers no peer");
      assert.deepEqual((await server.domain.telemetry.latest(unknown, undefined)).values, [], "nothing stored for the unknown key");
    });
  });
}
