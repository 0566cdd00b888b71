/**
 * `GET /me/status` reads the session behind the bearer and the status document in one statement,
 * with no session cache: whatever ends the session acts on the very next request, on both nodes
 * of a shared store (on SQLite two nodes on one file, as a second process is; on PostgreSQL two
 * nodes on one database). The other checks of authentication hold there as on every route.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { ManualClock } from "../src/domain/clock.ts";
import { PerchApiError, PerchClient } from "../src/sdk/client.ts";
import { STORES, startTestNode, type TestNode, tempDir } from "./support/server.ts";

const refused = (status: number, code: string) => (err: unknown) => err instanceof PerchApiError && err.status === status && err.code === code;

/** The same client (key and bearer) speaking to `server`. */
function on(server: TestNode, client: PerchClient): PerchClient {
  const other = new PerchClient({ baseUrl: server.url, fetch: server.fetch, keyPair: client.keyPair });
  other.accessToken = client.accessToken;
  return other;
}

for (const store of STORES) {
  describe(`GET /me/status authenticates in its one read (${store.name}, two nodes)`, () => {
    const clock = new ManualClock(Date.UTC(2026, 0, 1));
    let a: TestNode;
    let b: TestNode;
    before(async () => {
      const databaseUrl = await store.url();
      const dataDir = tempDir();
      a = await startTestNode({ clock, dataDir, config: { database_url: databaseUrl, node_name: "node-a" } });
      b = await startTestNode({ clock, dataDir, config: { database_url: databaseUrl, node_name: "node-b" } });
    });
    after(async () => {
      await b?.stop();
      await a?.stop();
    });

    test("answers the stored document, {} before there is one, on either node", async () => {
      const device = a.client();
      await device.login();
      assert.deepEqual(await on(b, device).status(), {});
      const stored = await device.putStatus({ volume: 42, labels: { room: "lab" } });
      assert.deepEqual(await device.status(), stored);
      assert.deepEqual(await on(b, device).status(), stored);
    });

    test("a session revoked on one node is refused on the next request to either", async () => {
      const device = a.client();
      const login = await device.login();
      await device.putStatus({ volume: 1 });
      assert.equal((await on(b, device).status()).volume, 1);
      assert.equal(await a.domain.auth.revokeSession(login.session_id), true);
      await assert.rejects(on(b, device).status(), refused(401, "INVALID_SESSION"));
      await assert.rejects(device.status(), refused(401, "INVALID_SESSION"));
    });

    test("an expired session is refused", async () => {
      const device = a.client();
      const login = await device.login();
      assert.deepEqual(await on(b, device).status(), {});
      clock.set(login.expires_at);
      await assert.rejects(on(b, device).status(), refused(401, "INVALID_SESSION"));
      await assert.rejects(device.status(), refused(401, "INVALID_SESSION"));
    });

    test("a peer blocked on one node is refused by the other, and once removed its session is unknown", async () => {
      const device = a.client();
      await device.login();
      await device.putStatus({ volume: 2 });
      assert.equal((await on(b, device).status()).volume, 2);
      assert.equal(await a.domain.peers.setBlocked(device.publicKey, true), true);
      await assert.rejects(on(b, device).status(), refused(403, "PEER_BLOCKED"));
      assert.equal(await a.domain.peers.setBlocked(device.publicKey, false), true);
      assert.equal((await on(b, device).status()).volume, 2);
      assert.equal(await a.domain.peers.remove(device.publicKey), true);
      await assert.rejects(on(b, device).status(), refused(401, "INVALID_SESSION"));
      await assert.rejects(device.status(), refused(401, "INVALID_SESSION"));
    });

    test("a Side Control session is refused as on every /me route, its device checked first", async () => {
      const device = a.client();
      await device.login();
      await device.putStatus({ volume: 3 });
      const phone = a.client();
      await phone.login({ deviceToken: (await device.createDeviceToken()).token });
      await assert.rejects(on(b, phone).status(), refused(403, "PRIMARY_SESSION_REQUIRED"));
      await a.domain.peers.setBlocked(device.publicKey, true);
      await assert.rejects(on(b, phone).status(), refused(403, "PEER_BLOCKED"));
      await a.domain.peers.remove(device.publicKey);
      await assert.rejects(on(b, phone).status(), refused(401, "INVALID_SESSION"));
    });

    test("a missing bearer, an unknown one, and another key's X-Public-Key are refused", async () => {
      const device = a.client();
      await device.login();
      const get = (headers: Record<string, string>) =>
        b.fetch(`${b.url}/me/status`, { headers }).then(async (r) => `${r.status} ${((await r.json()) as { error: { code: string } }).error.code}`);
      assert.equal(await get({}), "401 INVALID_SESSION");
      assert.equal(await get({ authorization: "Bearer not-a-session" }), "401 INVALID_SESSION");
      assert.equal(await get({ authorization: `Bearer ${device.accessToken}`, "x-public-key": a.client().publicKey }), "401 PUBLIC_KEY_MISMATCH");
      assert.equal(
        (await b.fetch(`${b.url}/me/status`, { headers: { authorization: `Bearer ${device.accessToken}`, "x-public-key": device.publicKey } })).status,
        200,
      );
    });
  });
}
