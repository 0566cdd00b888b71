import assert from "node:assert/strict";
import { rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { ManualClock } from "../src/domain/clock.ts";
import { DAY_MS } from "../src/domain/context.ts";
import { MAX_USABLE_DEVICE_TOKENS } from "../src/domain/side-control.ts";
import { PerchApiError, PerchClient } from "../src/sdk/client.ts";
import { STORES, startTestServer, type TestServer, tempDir } from "./support/server.ts";

function refused(status: number, code: string) {
  return (e: unknown) => {
    assert.ok(e instanceof PerchApiError, String(e));
    assert.equal(`${e.status} ${e.code}`, `${status} ${code}`);
    return true;
  };
}

const limits = {
  primary_sessions_per_device: 3,
  side_control_sessions_per_device: 2,
  side_control_sessions_per_controller: 2,
  contacts_per_device: 3,
  key_cache_size: 2,
};

for (const entry of STORES) {
  describe(`growth limits (${entry.name})`, () => {
    const clock = new ManualClock(Date.UTC(2026, 10, 21, 12, 0, 0));
    let server: TestServer;
    before(async () => {
      server = await startTestServer({ clock, cleanupIntervalMs: 20, config: { database_url: await entry.url(), limits, telemetry: { retention_days: 30 } } });
    });
    after(() => server.stop());

    /** A client with the key pair of `c`, so that one device can hold several sessions. */
    const sameKey = (c: PerchClient) => new PerchClient({ baseUrl: server.url, keyPair: c.keyPair, now: () => clock.now() });

    test("a new primary login signs the device's oldest sessions out beyond the cap", async () => {
      const first = server.client();
      await first.login();
      const others = [sameKey(first), sameKey(first), sameKey(first)];
      for (const c of others) {
        clock.advance(1);
        await c.login();
      }
      await assert.rejects(first.me(), refused(401, "INVALID_SESSION"));
      for (const c of others) assert.equal((await c.me()).public_key, first.publicKey);
      // Other devices are not affected.
      const stranger = server.client();
      await stranger.login();
      assert.ok(await stranger.me());
      for (const c of others) assert.ok(await c.me());
    });

    test("Side Control sessions per device: over the cap the login is refused and the device token stays usable", async () => {
      const device = server.client();
      await device.login();
      const phones = [server.client(), server.client()];
      for (const p of phones) await p.login({ deviceToken: (await device.createDeviceToken()).token });
      const token = await device.createDeviceToken();
      const third = server.client();
      await assert.rejects(third.login({ deviceToken: token.token }), refused(409, "TOO_MANY_SESSIONS"));
      assert.equal(await server.store.read((r) => r.deviceTokens.countUsable(device.publicKey, clock.now())), 1, "the token was not consumed");
      assert.equal((await device.sideControlSessions()).items.length, 2);
      // Once one session is revoked, the same token works.
      await device.revokeSideControlSession((await device.sideControlSessions()).items[0]!.id);
      await third.login({ deviceToken: token.token });
      assert.ok(await third.sideControl.status());
    });

    test("Side Control sessions per controller key: over the cap the login is refused", async () => {
      const phone = server.client();
      const devices = [server.client(), server.client(), server.client()];
      for (const d of devices) await d.login();
      for (const d of devices.slice(0, 2)) await sameKey(phone).login({ deviceToken: (await d.createDeviceToken()).token });
      const token = await devices[2]!.createDeviceToken();
      await assert.rejects(sameKey(phone).login({ deviceToken: token.token }), refused(409, "TOO_MANY_SESSIONS"));
      assert.deepEqual((await devices[2]!.sideControlSessions()).items, []);
      // Another controller may still control that device.
      await server.client().login({ deviceToken: token.token });
    });

    test("contacts per device: the one beyond the cap is refused until one is deleted", async () => {
      const device = server.client();
      await device.login();
      const phone = server.client();
      await phone.login({ deviceToken: (await device.createDeviceToken()).token });
      for (const name of ["a", "b", "c"]) await phone.sideControl.contacts.create({ name, display_name: name });
      await assert.rejects(phone.sideControl.contacts.create({ name: "d", display_name: "d" }), refused(409, "TOO_MANY_CONTACTS"));
      assert.deepEqual(
        (await phone.sideControl.contacts.list()).items.map((c) => c.name),
        ["a", "b", "c"],
      );
      await phone.sideControl.contacts.delete("b");
      await phone.sideControl.contacts.create({ name: "d", display_name: "d" });
    });

    // Each cap is a count then an insert: without the named locks, concurrent requests all count
    // below the cap on PostgreSQL and all insert.
    test("every cap holds under 20 concurrent requests", async () => {
      const CONCURRENT = 20;
      const many = <T>(f: (i: number) => Promise<T>) => Promise.allSettled(Array.from({ length: CONCURRENT }, (_, i) => f(i)));
      const device = server.client();
      await device.login();
      const phone = server.client();
      await phone.login({ deviceToken: (await device.createDeviceToken()).token });

      await many((i) => phone.sideControl.contacts.create({ name: `c${i}`, display_name: "x" }));
      assert.equal((await phone.sideControl.contacts.list()).items.length, limits.contacts_per_device, "contacts");

      await Promise.allSettled(Array.from({ length: 2 * MAX_USABLE_DEVICE_TOKENS }, () => device.createDeviceToken()));
      assert.equal(await server.store.read((r) => r.deviceTokens.countUsable(device.publicKey, clock.now())), MAX_USABLE_DEVICE_TOKENS, "device tokens");

      await many(() => sameKey(device).login());
      const live = (await server.domain.auth.liveSessions()).filter((s) => s.kind === "primary" && s.public_key === device.publicKey);
      assert.equal(live.length, limits.primary_sessions_per_device, "primary sessions");

      const target = server.client();
      await target.login();
      const tokens = [];
      for (let i = 0; i < 10; i++) tokens.push(await target.createDeviceToken());
      await Promise.allSettled(tokens.map((t) => server.client().login({ deviceToken: t.token })));
      assert.equal((await target.sideControlSessions()).items.length, limits.side_control_sessions_per_device, "Side Control sessions per device");

      const controller = server.client();
      const owned = [];
      for (let i = 0; i < 10; i++) {
        const d = server.client();
        await d.login();
        owned.push(await d.createDeviceToken());
      }
      await Promise.allSettled(owned.map((t) => sameKey(controller).login({ deviceToken: t.token })));
      const held = (await server.domain.auth.liveSessions()).filter((s) => s.kind === "side_control" && s.public_key === controller.publicKey);
      assert.equal(held.length, limits.side_control_sessions_per_controller, "Side Control sessions per controller");
    });

    test("telemetry older than the retention is deleted by the cleanup job", async () => {
      const device = server.client();
      await device.login();
      const phone = server.client();
      await phone.login({ deviceToken: (await device.createDeviceToken()).token });
      const now = clock.now();
      const times = [now - 40 * DAY_MS, now - 31 * DAY_MS, now - 29 * DAY_MS, now - 1_000];
      await server.domain.telemetry.record(
        device.publicKey,
        times.map((observedAt, i) => ({ field: "system.temperature_c", observedAt, value: i })),
      );
      const kept = async () =>
        (await phone.sideControl.telemetry({ field: "system.temperature_c", start_time_ms: now - 50 * DAY_MS, end_time_ms: now })).points.map(
          (p) => p.observed_at_unix_ms,
        );
      for (let i = 0; i < 200 && (await kept()).length > 2; i++) await new Promise((r) => setTimeout(r, 20));
      assert.deepEqual(await kept(), times.slice(2));
    });

    test("X25519 results are cached least recently used first, sized by limits.key_cache_size", async () => {
      const auth = server.domain.auth;
      const [a, b, c] = [server.client(), server.client(), server.client()].map((x) => x.publicKey) as [string, string, string];
      const secretA = auth.sharedSecretWith(a);
      const secretB = auth.sharedSecretWith(b);
      assert.equal(auth.sharedSecretWith(a), secretA, "cached");
      auth.sharedSecretWith(c); // evicts b, the least recently used
      assert.equal(auth.sharedSecretWith(a), secretA, "a was used last, so it stays");
      assert.notEqual(auth.sharedSecretWith(b), secretB, "b was evicted");
    });
  });
}

describe("data directory and database files", () => {
  const parent = tempDir();
  after(() => rmSync(parent, { recursive: true, force: true }));

  test("the data directory is created 0700, the server key and the SQLite files 0600", async () => {
    const dataDir = join(parent, "data");
    const server = await startTestServer({ dataDir });
    try {
      const device = server.client();
      await device.login();
      await device.putStatus({ volume: 3 });
      const mode = (path: string) => (statSync(path).mode & 0o777).toString(8);
      assert.equal(mode(dataDir), "700");
      for (const file of ["perch.db", "perch.db-wal", "perch.db-shm", "server.key"]) assert.equal(mode(join(dataDir, file)), "600", file);
    } finally {
      await server.stop();
    }
  });
});
