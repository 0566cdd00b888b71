/**
 * A node's runtime refresh tells which of its connections were replaced elsewhere (issue 45: a
 * removed peer's connection was sometimes closed as `replaced`, not `removed`). Fast: the domain
 * of a real node in process, no WebRTC.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { startTestServer, type TestServer } from "./support/server.ts";

describe("the runtime refresh and replaced connections", () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer();
  });
  after(() => server.stop());

  const entry = (publicKey: string) => ({ publicKey, lastAddr: null, rxBytes: 1, txBytes: 1 });

  test("a peer removed while connected is not 'replaced' (its record went with it: the peer watch closes it as removed)", async () => {
    const device = server.client();
    await device.login();
    const key = device.publicKey;
    await server.domain.presence.connected(key, null);
    assert.deepEqual(await server.domain.presence.refresh([entry(key)]), [], "owned here: refreshed");
    assert.equal(await server.domain.peers.remove(key), true);
    assert.deepEqual(await server.domain.presence.refresh([entry(key)]), []);
  });

  test("a peer whose record another node (or no node) holds now is replaced", async () => {
    const device = server.client();
    await device.login();
    const key = device.publicKey;
    await server.domain.presence.connected(key, null);
    await server.store.transaction((tx) =>
      tx.runtime.put({
        public_key: key,
        online: 1,
        last_seen_at: Date.now(),
        last_addr: null,
        rx_bytes: 0,
        tx_bytes: 0,
        node: "another-node",
        updated_at: Date.now(),
      }),
    );
    assert.deepEqual(await server.domain.presence.refresh([entry(key)]), [key]);
  });
});
