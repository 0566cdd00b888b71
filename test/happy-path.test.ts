import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { PerchApiError } from "../src/sdk/client.ts";
import { STORES, startTestServer, type TestServer } from "./support/server.ts";

for (const store of STORES) {
  describe(`happy path (${store.name})`, () => {
    let server: TestServer;
    before(async () => {
      server = await startTestServer({ config: { database_url: await store.url() } });
    });
    after(() => server.stop());

    test("device login → status → device token → Side Control → revoke", async () => {
      const device = server.client();
      const login = await device.login();
      assert.equal(login.token_type, "Bearer");
      assert.equal(login.grant_type, "primary");
      assert.ok(login.expires_at > Date.now() + 23 * 3600_000);

      const me = await device.me();
      assert.equal(me.public_key, device.publicKey);
      assert.equal(me.role, "client");
      assert.equal(me.registration_status, "active");
      assert.deepEqual(me.device, {});

      assert.deepEqual(await device.status(), {});
      const stored = await device.putStatus({
        volume: 40,
        muted: false,
        battery_percent: 87,
        charging: true,
        gnss_latitude: 31.2,
        gnss_longitude: 121.5,
        labels: { room: "kitchen" },
        details: { fw: "1.2.3" },
      });
      assert.equal(stored.volume, 40);
      assert.ok(stored.reported_at && !Number.isNaN(Date.parse(stored.reported_at)));
      assert.deepEqual(await device.status(), stored);
      assert.deepEqual(await device.runtime(), { online: false });

      const token = await device.createDeviceToken();
      assert.ok(token.token.length >= 43);
      assert.ok(token.expires_at <= Date.now() + 5 * 60_000 + 1000);

      // Telemetry arrives over the transport; here it is written through the domain layer.
      const t0 = Date.now() - 60_000;
      const samples = Array.from({ length: 60 }, (_, i) => ({ field: "battery.percent" as const, observedAt: t0 + i * 1000, value: 100 - i }));
      samples.push({ field: "battery.percent", observedAt: t0 + 59_500, value: 41.5 });
      await server.domain.telemetry.record(device.publicKey, [...samples, { field: "system.temperature_c", observedAt: t0 + 30_000, value: 36.6 }]);

      const phone = server.client();
      const sc = await phone.login({ deviceToken: token.token });
      assert.equal(sc.grant_type, "side_control");

      assert.deepEqual(await phone.sideControl.info(), {});
      assert.deepEqual(await phone.sideControl.runtime(), { online: false });
      const status = await phone.sideControl.status();
      assert.equal(status.volume, 40);

      const latest = await phone.sideControl.telemetryLatest();
      assert.equal(latest.peer_public_key, device.publicKey);
      assert.deepEqual(
        latest.values.map((v) => [v.field, v.value, v.observed_at_unix_ms]),
        [
          ["battery.percent", 41.5, t0 + 59_500],
          ["system.temperature_c", 36.6, t0 + 30_000],
        ],
      );
      const onlyTemp = await phone.sideControl.telemetryLatest(["system.temperature_c"]);
      assert.deepEqual(
        onlyTemp.values.map((v) => v.field),
        ["system.temperature_c"],
      );

      const raw = await phone.sideControl.telemetry({ field: "battery.percent", start_time_ms: t0, end_time_ms: t0 + 10_000 });
      assert.equal(raw.step_ms, 0);
      assert.deepEqual(
        raw.points.map((p) => p.value),
        [100, 99, 98, 97, 96, 95, 94, 93, 92, 91],
      );
      const desc = await phone.sideControl.telemetry({ field: "battery.percent", start_time_ms: t0, end_time_ms: t0 + 10_000, order: "desc", limit: 3 });
      assert.deepEqual(
        desc.points.map((p) => p.value),
        [91, 92, 93],
      );
      const stepped = await phone.sideControl.telemetry({ field: "battery.percent", start_time_ms: t0, end_time_ms: t0 + 60_000, step_ms: 20_000 });
      assert.deepEqual(
        stepped.points.map((p) => [p.observed_at_unix_ms - t0, p.value]),
        [
          [19_000, 81],
          [39_000, 61],
          [59_500, 41.5],
        ],
      );

      // A reference aggregation over the samples written above, one 10 s bucket at a time.
      const buckets = [0, 1, 2, 3, 4, 5].map((b) => samples.filter((s) => s.observedAt - t0 >= b * 10_000 && s.observedAt - t0 < (b + 1) * 10_000));
      const reference: Record<string, (vs: typeof samples) => number> = {
        avg: (vs) => vs.reduce((a, s) => a + s.value, 0) / vs.length,
        min: (vs) => Math.min(...vs.map((s) => s.value)),
        max: (vs) => Math.max(...vs.map((s) => s.value)),
        sum: (vs) => vs.reduce((a, s) => a + s.value, 0),
        count: (vs) => vs.length,
        last: (vs) => vs.reduce((a, s) => (s.observedAt > a.observedAt ? s : a)).value,
      };
      assert.equal(reference.last!(buckets[5]!), 41.5);
      for (const [aggregate, fn] of Object.entries(reference)) {
        const r = await phone.sideControl.telemetryAggregate({
          field: "battery.percent",
          start_time_ms: t0,
          end_time_ms: t0 + 60_000,
          bucket_ms: 10_000,
          aggregate: aggregate as never,
        });
        assert.equal(r.aggregate, aggregate);
        assert.deepEqual(
          r.points.map((p) => p.bucket_start_time_ms - t0),
          [0, 10_000, 20_000, 30_000, 40_000, 50_000],
          aggregate,
        );
        for (const [i, p] of r.points.entries()) {
          const want = fn(buckets[i]!);
          assert.ok(Math.abs(p.value - want) < 1e-9, `${aggregate}[${i}] = ${p.value}, expected ${want}`);
        }
      }
      const sparse = await phone.sideControl.telemetryAggregate({
        field: "system.temperature_c",
        start_time_ms: t0,
        end_time_ms: t0 + 60_000,
        bucket_ms: 10_000,
        aggregate: "count",
      });
      assert.deepEqual(sparse.points, [{ bucket_start_time_ms: t0 + 30_000, value: 1 }], "empty buckets are omitted");

      // Contacts: create, page, get, put, delete.
      for (const name of ["dad", "mom", "alice", "bob", "carol"]) {
        await phone.sideControl.contacts.create({ name, display_name: name.toUpperCase(), phone_number: `+1 (555) 000-${name.length}${name.charCodeAt(0)}` });
      }
      const page1 = await phone.sideControl.contacts.list({ limit: 2 });
      assert.deepEqual(
        page1.items.map((c) => c.name),
        ["alice", "bob"],
      );
      assert.equal(page1.has_next, true);
      const page2 = await phone.sideControl.contacts.list({ limit: 2, cursor: page1.next_cursor! });
      assert.deepEqual(
        page2.items.map((c) => c.name),
        ["carol", "dad"],
      );
      const page3 = await phone.sideControl.contacts.list({ limit: 2, cursor: page2.next_cursor! });
      assert.deepEqual(
        page3.items.map((c) => c.name),
        ["mom"],
      );
      assert.equal(page3.has_next, false);
      assert.equal(page3.next_cursor, undefined);
      assert.equal((await phone.sideControl.contacts.list()).items.length, 5);

      const mom = await phone.sideControl.contacts.get("mom");
      assert.equal(mom.display_name, "MOM");
      const updated = await phone.sideControl.contacts.update("mom", { display_name: "Mum" });
      assert.equal(updated.display_name, "Mum");
      assert.equal(updated.phone_number, mom.phone_number, "an absent field keeps its value");
      assert.equal(updated.created_at, mom.created_at);
      const deleted = await phone.sideControl.contacts.delete("mom");
      assert.equal(deleted.display_name, "Mum");
      await assert.rejects(phone.sideControl.contacts.get("mom"), (e: PerchApiError) => e.code === "CONTACT_NOT_FOUND");

      // The device sees and revokes the controller's session.
      const sessions = await device.sideControlSessions();
      assert.equal(sessions.items.length, 1);
      assert.equal(sessions.items[0]!.id, sc.session_id);
      assert.equal(sessions.items[0]!.controller_public_key, phone.publicKey);
      await device.revokeSideControlSession(sc.session_id);
      await assert.rejects(phone.sideControl.status(), (e: PerchApiError) => e.status === 401 && e.code === "INVALID_SESSION");
      assert.deepEqual((await device.sideControlSessions()).items, []);
    });
  });
}
