import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { base64urlnopad } from "@scure/base";
import type { PerchClient } from "../src/sdk/client.ts";
import { STORES, startTestServer, type TestServer } from "./support/server.ts";

// Inputs that reach the store as text: NUL and other control characters must get the contract's
// 4xx on every store (PostgreSQL cannot hold NUL in text and would otherwise fail with a 500).
for (const store of STORES) {
  describe(`control characters in path, query and body (${store.name})`, () => {
    let server: TestServer;
    let device: PerchClient;
    let phone: PerchClient;
    before(async () => {
      server = await startTestServer({ config: { databaseUrl: await store.url() } });
      device = server.client();
      await device.login();
      phone = server.client();
      await phone.login({ deviceToken: (await device.createDeviceToken()).token });
      await phone.sideControl.contacts.create({ name: "mom", display_name: "Mom" });
    });
    after(() => server.stop());

    const call = async (client: PerchClient, method: string, path: string, body?: unknown) => {
      const res = await fetch(server.url + path, {
        method,
        headers: { authorization: `Bearer ${client.accessToken}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
        body: body === undefined ? null : JSON.stringify(body),
      });
      return { status: res.status, code: ((await res.json()) as { error?: { code: string } }).error?.code };
    };

    test("contact names and display names with control characters are refused or not found", async () => {
      for (const name of ["\u0000", "a\u0000b", "tab\there", "bell\u0007"]) {
        assert.deepEqual(
          await call(phone, "POST", "/side-control/contacts", { name, display_name: "x" }),
          { status: 400, code: "INVALID_CONTACT" },
          JSON.stringify(name),
        );
        const path = `/side-control/contacts/${encodeURIComponent(name)}`;
        assert.deepEqual(await call(phone, "GET", path), { status: 404, code: "CONTACT_NOT_FOUND" });
        assert.deepEqual(await call(phone, "PUT", path, { display_name: "y" }), { status: 404, code: "CONTACT_NOT_FOUND" });
        assert.deepEqual(await call(phone, "DELETE", path), { status: 404, code: "CONTACT_NOT_FOUND" });
      }
      assert.deepEqual(await call(phone, "PUT", "/side-control/contacts/mom", { display_name: "M\u0000m" }), { status: 400, code: "INVALID_CONTACT" });
      const cursor = base64urlnopad.encode(new TextEncoder().encode("a\u0000"));
      assert.deepEqual(await call(phone, "GET", `/side-control/contacts?cursor=${cursor}`), { status: 400, code: "INVALID_CONTACT" });
      assert.equal((await phone.sideControl.contacts.get("mom")).display_name, "Mom", "nothing changed");
    });

    test("ids with control characters are unknown", async () => {
      assert.deepEqual(await call(device, "DELETE", "/me/side-control/device-tokens/%00"), { status: 404, code: "DEVICE_TOKEN_NOT_FOUND" });
      assert.deepEqual(await call(device, "DELETE", "/me/side-control/sessions/a%00b"), { status: 404, code: "SIDE_CONTROL_SESSION_NOT_FOUND" });
      assert.equal((await device.sideControlSessions()).items.length, 1, "nothing changed");
    });

    test("NUL inside status strings is stored and read back exactly", async () => {
      const status = { labels: { "k\u0000": "v\u0000" }, details: { note: "a\u0000b" } };
      const stored = await device.putStatus(status);
      assert.deepEqual({ labels: stored.labels, details: stored.details }, status);
      const read = await device.status();
      assert.deepEqual({ labels: read.labels, details: read.details }, status);
    });
  });
}
