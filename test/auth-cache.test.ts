/**
 * The session read of one request answers the next ones with the same bearer for a moment
 * (`SESSION_CACHE_MS`, SQLite only): what ends a session must still act on the very next request,
 * whoever wrote it. Through the real server and real HTTP; the other writer is a second SQLite
 * connection on the same file, as `perch sessions revoke` or `perch peers block` in their own
 * process are.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { after, before, describe, test } from "node:test";
import { ManualClock } from "../src/domain/clock.ts";
import { PerchApiError } from "../src/sdk/client.ts";
import { startTestNode, type TestNode } from "./support/server.ts";

const refused = (status: number, code: string) => (err: unknown) => err instanceof PerchApiError && err.status === status && err.code === code;

describe("cached sessions (SQLite)", () => {
  const clock = new ManualClock(Date.UTC(2026, 0, 1));
  let server: TestNode;
  let other: DatabaseSync;
  before(async () => {
    server = await startTestNode({ clock });
    other = new DatabaseSync(join(server.dataDir, "perch.db"));
    other.exec("PRAGMA busy_timeout = 5000");
  });
  after(async () => {
    other.close();
    await server.stop();
  });

  test("a session revoked by another process is refused on the next request", async () => {
    const device = server.client();
    const login = await device.login();
    // `GET /me` goes through the cache (`GET /me/status` reads its session with the document, uncached).
    assert.equal((await device.me()).public_key, device.publicKey); // read, and now cached
    other.prepare("UPDATE sessions SET revoked_at = ? WHERE id = ?").run(clock.now(), login.session_id);
    await assert.rejects(device.me(), refused(401, "INVALID_SESSION"));
  });

  test("a peer blocked, then removed, by another process is refused on the next request", async () => {
    const device = server.client();
    await device.login();
    const phone = server.client();
    await phone.login({ deviceToken: (await device.createDeviceToken()).token });
    assert.deepEqual(await phone.sideControl.status(), {});
    other.prepare("UPDATE peers SET status = 'blocked' WHERE public_key = ?").run(device.publicKey);
    await assert.rejects(device.me(), refused(403, "PEER_BLOCKED"));
    await assert.rejects(phone.sideControl.status(), refused(403, "PEER_BLOCKED"));
    other.prepare("UPDATE peers SET status = 'active' WHERE public_key = ?").run(device.publicKey);
    assert.deepEqual(await phone.sideControl.status(), {});
    other.prepare("DELETE FROM peers WHERE public_key = ?").run(device.publicKey);
    await assert.rejects(phone.sideControl.status(), refused(401, "INVALID_SESSION"));
  });

  test("a session revoked through this node is refused on the next request, the cache notwithstanding", async () => {
    const device = server.client();
    await device.login();
    const phone = server.client();
    const sc = await phone.login({ deviceToken: (await device.createDeviceToken()).token });
    assert.deepEqual(await phone.sideControl.status(), {});
    await device.revokeSideControlSession(sc.session_id);
    await assert.rejects(phone.sideControl.status(), refused(401, "INVALID_SESSION"));
  });

  test("a cached session still expires on time", async () => {
    const device = server.client();
    const login = await device.login();
    assert.equal((await device.me()).public_key, device.publicKey);
    clock.set(login.expires_at);
    await assert.rejects(device.me(), refused(401, "INVALID_SESSION"));
  });
});
