/**
 * The telemetry writer's `store_error` drop, end to end: when the store refuses one peer's samples
 * (for a reason retrying does not fix), only that peer's frames are lost and counted; the frames of
 * the peers written beside it are stored and counted as accepted.
 */
import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import { after, describe, test } from "node:test";
import pg from "pg";
import { STORES, startTestServer, type TestServer } from "./support/server.ts";
import { battery, counters, storedSamples } from "./support/telemetry.ts";
import { connect, eventually } from "./support/webrtc.ts";

/**
 * A trigger in the real database that refuses every sample of `publicKey` (an error that is not the
 * store being unreachable, so the writer must not wait and retry it).
 */
async function refuseSamplesOf(server: TestServer, databaseUrl: string | undefined, publicKey: string): Promise<void> {
  const quoted = `'${publicKey.replaceAll("'", "''")}'`;
  if (databaseUrl) {
    const client = new pg.Client({ connectionString: databaseUrl });
    await client.connect();
    try {
      await client.query(`create function refuse_samples() returns trigger language plpgsql as $$
        begin
          if (select public_key from telemetry_series where id = new.series_id) = ${quoted} then raise exception 'refused by the test'; end if;
          return new;
        end $$`);
      await client.query("create trigger refuse_samples before insert on telemetry_samples for each row execute function refuse_samples()");
    } finally {
      await client.end();
    }
    return;
  }
  const db = new DatabaseSync(server.store.sqliteFile!);
  try {
    db.exec(`create trigger refuse_samples before insert on telemetry_samples
      when (select public_key from telemetry_series where id = new.series_id) = ${quoted}
      begin select raise(abort, 'refused by the test'); end`);
  } finally {
    db.close();
  }
}

for (const entry of STORES) {
  describe(`telemetry the store refuses for one peer (${entry.name})`, () => {
    let server: TestServer | undefined;
    after(() => server?.stop());

    test("a write failing for one peer's samples loses and counts (store_error) only that peer's frames", async () => {
      const databaseUrl = await entry.url();
      server = await startTestServer({ config: { database_url: databaseUrl } });
      const refused = await connect(server);
      const kept = await connect(server);
      try {
        await eventually(() => server!.transport!.connection(refused.publicKey)?.active, 10_000, "the first connection active");
        await eventually(() => server!.transport!.connection(kept.publicKey)?.active, 10_000, "the second connection active");
        await refuseSamplesOf(server, databaseUrl, refused.publicKey);
        const before = await counters(server.url);
        const t0 = Date.now() - 10_000;
        // Interleaved, so that the writer's batches hold both peers' frames.
        for (let i = 0; i < 10; i++) {
          refused.sendTelemetry(battery(t0 + i));
          kept.sendTelemetry(battery(t0 + i));
        }
        const counted = await eventually(
          async () => {
            const c = await counters(server!.url);
            const n = c.stored - before.stored + (c.dropped.store_error ?? 0) - (before.dropped.store_error ?? 0);
            return n === 20 ? c : undefined;
          },
          10_000,
          "every frame counted",
        );
        assert.equal(counted.stored - before.stored, 10, "the other peer's frames are stored and counted as accepted");
        assert.equal((counted.dropped.store_error ?? 0) - (before.dropped.store_error ?? 0), 10, "the refused peer's frames are dropped as store_error");
        for (const reason of ["overload", "store_unavailable"]) {
          assert.equal(counted.dropped[reason] ?? 0, before.dropped[reason] ?? 0, `nothing counted as ${reason}`);
        }
        assert.equal(await storedSamples(server.store, kept.publicKey), 10);
        assert.equal(await storedSamples(server.store, refused.publicKey), 0);
        assert.equal(server.transport!.telemetry.heldSamples, 0, "nothing waits for a retry");
        assert.equal(server.transport!.telemetry.waitingForStore, false);
      } finally {
        refused.close();
        kept.close();
      }
    });
  });
}
