import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { perchJson } from "./support/cli.ts";
import { STORES, startTestServer, type TestServer } from "./support/server.ts";
import { connect, eventually } from "./support/webrtc.ts";

/**
 * `perch peers block` and `perch peers remove` run as their own process, writing to the store:
 * the node holding the peer's connection closes it at once (on PostgreSQL it hears the bus's
 * NOTIFY; on SQLite it sees the other process's commit), and what the peer sends is refused.
 */
for (const store of STORES) {
  describe(`blocking and removing reach live connections (${store.name})`, () => {
    let server: TestServer;
    let env: Record<string, string>;
    before(async () => {
      const databaseUrl = await store.url();
      server = await startTestServer({ config: databaseUrl ? { database_url: databaseUrl } : {} });
      env = { PERCH_DATA_DIR: server.dataDir, PERCH_LOG_LEVEL: "silent", ...(databaseUrl ? { PERCH_DATABASE_URL: databaseUrl } : {}) };
    });
    after(async () => {
      await server.stop();
    });

    for (const action of ["block", "remove"] as const) {
      test(`perch peers ${action} closes the peer's connection, and its next offer is refused`, async () => {
        const device = await connect(server);
        const bystander = await connect(server);
        const held = await eventually(() => server.transport!.connection(device.publicKey)?.active && server.transport!.connection(device.publicKey));
        await perchJson(["peers", action, device.publicKey], env);
        await device.closed();
        await eventually(() => !held.active, 5_000, "the connection closed on the node");
        assert.equal(held.closeReason, action === "block" ? "blocked" : "removed");
        assert.equal(server.transport!.connection(device.publicKey), undefined);
        // The bystander is untouched.
        assert.equal((await bystander.http(1, "GET", "/me")).status, 200);
        if (action === "block") {
          await assert.rejects(
            connect(server, { keyPair: device.keyPair }),
            (e: Error & { status?: number; code?: string }) => e.status === 403 && e.code === "PEER_BLOCKED",
          );
        } else {
          assert.equal(await server.store.read((r) => r.peers.get(device.publicKey)), undefined);
        }
        bystander.close();
        device.close();
      });
    }
  });
}
