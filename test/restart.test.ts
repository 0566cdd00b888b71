import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { after, describe, test } from "node:test";
import { generateKeyPair, type KeyPair } from "../src/crypto/keys.ts";
import type { DeviceToken, LoginResult, PeerStatus } from "../src/protocol/public.ts";
import { PerchApiError, PerchClient } from "../src/sdk/client.ts";
import { type ServerProcess, STORES, spawnServer, tempDir } from "./support/server.ts";

function refused(status: number, code: string) {
  return (e: unknown) => {
    assert.ok(e instanceof PerchApiError, String(e));
    assert.equal(`${e.status} ${e.code}`, `${status} ${code}`);
    return true;
  };
}

/** A client for `node` with `keyPair` and, optionally, an access token from an earlier login. */
function client(node: ServerProcess, keyPair: KeyPair = generateKeyPair(), accessToken?: string): PerchClient {
  const c = new PerchClient({ baseUrl: node.url, keyPair });
  c.accessToken = accessToken;
  return c;
}

for (const store of STORES) {
  describe(`restart (${store.name})`, () => {
    const dataDir = tempDir();
    after(() => rmSync(dataDir, { recursive: true, force: true }));

    test("state, sessions, tokens and nonces survive a restart; SIGTERM and SIGINT exit 0", async () => {
      const databaseUrl = await store.url();
      const env: Record<string, string> = { PERCH_DATA_DIR: dataDir, ...(databaseUrl ? { PERCH_DATABASE_URL: databaseUrl } : {}) };

      // First process: create state through HTTP.
      const first = await spawnServer(env);
      let before: {
        serverKey: string;
        device: KeyPair;
        phone: KeyPair;
        deviceLogin: LoginResult;
        phoneLogin: LoginResult;
        assertion: string;
        status: PeerStatus;
        used: DeviceToken;
        spare: DeviceToken;
        contacts: unknown;
      };
      try {
        const serverKey = (await client(first).serverInfo()).public_key;
        const device = client(first);
        const assertion = await device.assertion({ lifetimeSeconds: 300 });
        const deviceLogin = await device.login({ assertion });
        const status = await device.putStatus({ volume: 55, muted: true, labels: { room: "hall" }, details: { fw: "2.0" } });
        const used = await device.createDeviceToken();
        const spare = await device.createDeviceToken();
        const phone = client(first);
        const phoneLogin = await phone.login({ deviceToken: used.token });
        await phone.sideControl.contacts.create({ name: "mom", display_name: "Mom", phone_number: "+1 555 0100" });
        await phone.sideControl.contacts.create({ name: "dad", phone_number: "+1 555 0101" });
        const contacts = await phone.sideControl.contacts.list();
        assert.equal(contacts.items.length, 2);
        before = { serverKey, device: device.keyPair, phone: phone.keyPair, deviceLogin, phoneLogin, assertion, status, used, spare, contacts };
      } finally {
        assert.equal(await first.stop(), 0, `SIGTERM exits 0:\n${first.output()}`);
      }

      // Second process on the same data directory and database.
      const second = await spawnServer(env);
      try {
        assert.equal((await client(second).serverInfo()).public_key, before.serverKey, "the server key is kept");

        const device = client(second, before.device, before.deviceLogin.access_token);
        const me = await device.me();
        assert.equal(me.public_key, device.publicKey);
        assert.equal(me.registration_status, "active");
        assert.deepEqual(await device.status(), before.status);

        const phone = client(second, before.phone, before.phoneLogin.access_token);
        assert.deepEqual(await phone.sideControl.contacts.list(), before.contacts);
        assert.deepEqual(await phone.sideControl.status(), before.status);

        // The assertion accepted before the restart is still remembered.
        await assert.rejects(client(second, before.device).login({ assertion: before.assertion }), refused(401, "INVALID_ASSERTION"));

        // The consumed token stays consumed; the unused one can still be exchanged, once.
        await assert.rejects(client(second).login({ deviceToken: before.used.token }), refused(401, "INVALID_DEVICE_TOKEN"));
        const tablet = client(second);
        const tabletLogin = await tablet.login({ deviceToken: before.spare.token });
        assert.equal(tabletLogin.grant_type, "side_control");
        assert.equal((await tablet.sideControl.contacts.get("mom")).display_name, "Mom");
        await assert.rejects(client(second).login({ deviceToken: before.spare.token }), refused(401, "INVALID_DEVICE_TOKEN"));

        assert.deepEqual(
          (await device.sideControlSessions()).items.map((s) => [s.id, s.controller_public_key]),
          [
            [tabletLogin.session_id, tablet.publicKey],
            [before.phoneLogin.session_id, phone.publicKey],
          ],
        );
      } finally {
        const exited = new Promise<number | null>((resolve) => second.process.once("exit", resolve));
        second.process.kill("SIGINT");
        assert.equal(await exited, 0, `SIGINT exits 0:\n${second.output()}`);
      }
    });
  });
}
