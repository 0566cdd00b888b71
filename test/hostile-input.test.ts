import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { base64urlnopad } from "@scure/base";
import { decodeKey, encodeKey, isCanonicalKey } from "../src/crypto/keys.ts";
import { MAX_JSON_DEPTH } from "../src/protocol/text.ts";
import type { PerchApiError, PerchClient } from "../src/sdk/client.ts";
import { STORES, startTestNode, type TestNode } from "./support/server.ts";

// Inputs that reach the store as text: NUL and other control characters must get the contract's
// 4xx on every store (PostgreSQL cannot hold NUL in text and would otherwise fail with a 500).
for (const store of STORES) {
  describe(`control characters in path, query and body (${store.name})`, () => {
    let server: TestNode;
    let device: PerchClient;
    let phone: PerchClient;
    before(async () => {
      server = await startTestNode({ config: { database_url: await store.url() } });
      device = server.client();
      await device.login();
      phone = server.client();
      await phone.login({ deviceToken: (await device.createDeviceToken()).token });
      await phone.sideControl.contacts.create({ name: "mom", display_name: "Mom" });
    });
    after(() => server.stop());

    const call = async (client: PerchClient, method: string, path: string, body?: unknown) => {
      const res = await server.fetch(server.url + path, {
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

    test("status strings with NUL or lone surrogates, prototype keys and hostile depth are refused and change nothing", async () => {
      const before = await device.putStatus({ volume: 10, labels: { room: "kitchen" } });
      // ~4,400 levels in a 9 KB body (built as text: serialising it here would exhaust the stack too).
      const deep = `${'{"a":'.repeat(4400)}1${"}".repeat(4400)}`;
      const bodies: Array<[string, string]> = [
        [`{"details":${deep}}`, "details"],
        [JSON.stringify({ labels: { "k\u0000": "v" } }), "labels"],
        [JSON.stringify({ labels: { k: "v\u0000" } }), "labels.k"],
        [JSON.stringify({ details: { note: "a\u0000b" } }), "details.note"],
        ['{"labels":{"k":"\\ud800"}}', "labels.k"],
        ['{"labels":{"\\udc00":"v"}}', "labels"],
        ['{"details":{"list":["ok","\\udbff"]}}', "details.list.1"],
        ['{"labels":{"__proto__":"x"}}', "labels.__proto__"],
        ['{"details":{"a":{"__proto__":{"polluted":true}}}}', "details.a.__proto__"],
        // Beyond a double: parsed as Infinity, it would be stored (and echoed) as null.
        ['{"details":{"x":1e400}}', "details.x"],
        ['{"details":{"list":[1,-1e999]}}', "details.list.1"],
      ];
      for (const [body, field] of bodies) {
        const res = await server.fetch(`${server.url}/me/status`, {
          method: "PUT",
          headers: { authorization: `Bearer ${device.accessToken}`, "content-type": "application/json" },
          body,
        });
        const error = ((await res.json()) as { error: { code: string; details?: { field?: string } } }).error;
        assert.equal(res.status, 400, body.slice(0, 60));
        assert.equal(error.code, "INVALID_STATUS", body.slice(0, 60));
        assert.ok(error.details?.field?.startsWith(field.split(".")[0]!), `${body.slice(0, 60)}: field ${error.details?.field}`);
      }
      assert.deepEqual(await device.status(), before, "nothing changed");
    });

    test("details may nest up to the documented depth", async () => {
      const nest = (levels: number) => {
        let d: Record<string, unknown> = { leaf: true };
        for (let i = 1; i < levels; i++) d = { a: d };
        return d;
      };
      const ok = nest(MAX_JSON_DEPTH);
      assert.deepEqual((await device.putStatus({ details: ok })).details, ok);
      await assert.rejects(device.putStatus({ details: nest(MAX_JSON_DEPTH + 1) }), (e: PerchApiError) => e.code === "INVALID_STATUS");
    });

    test("assertion nonces with NUL, lone surrogates or beyond 256 characters are invalid, not a 500", async () => {
      const stranger = server.client();
      for (const nonce of ["a\u0000b", "\ud800", "\udfff", "x".repeat(257)]) {
        await assert.rejects(
          stranger.login({ assertion: await stranger.assertion({ nonce }) }),
          (e: PerchApiError) => e.status === 401 && e.code === "INVALID_ASSERTION",
          JSON.stringify(nonce.slice(0, 10)),
        );
      }
      assert.equal(await server.store.read((r) => r.peers.get(stranger.publicKey)), undefined, "nothing registered");
      await stranger.login({ assertion: await stranger.assertion({ nonce: "x".repeat(256) }) });
    });

    test("contact names that would not survive as a URL path segment, or are not storable, are refused", async () => {
      for (const name of [".", "..", "\ud800", "a\udc00"]) {
        assert.deepEqual(
          await call(phone, "POST", "/side-control/contacts", { name, display_name: "x" }),
          { status: 400, code: "INVALID_CONTACT" },
          JSON.stringify(name),
        );
      }
      for (const display_name of ["\ud800", "ok\udfff"]) {
        assert.deepEqual(await call(phone, "POST", "/side-control/contacts", { name: "dad", display_name }), { status: 400, code: "INVALID_CONTACT" });
      }
      assert.deepEqual(await call(phone, "GET", "/side-control/contacts/%ED%A0%80"), { status: 404, code: "CONTACT_NOT_FOUND" });
      assert.deepEqual(
        (await phone.sideControl.contacts.list()).items.map((c) => c.name),
        ["mom"],
        "nothing created",
      );
    });

    test("bodies that are not well-formed UTF-8 are refused, not read with U+FFFD in place of each bad byte", async () => {
      // A stray byte, an overlong "." and an encoded lone surrogate: decoded leniently, "a\xff" and
      // "a\xfe" would both be "a\ufffd", one contact.
      const send = (method: string, path: string, client: PerchClient, before: string, bad: number[], after: string) =>
        server.fetch(server.url + path, {
          method,
          headers: { authorization: `Bearer ${client.accessToken}`, "content-type": "application/json" },
          body: Buffer.concat([Buffer.from(before), Buffer.from(bad), Buffer.from(after)]),
        });
      const statusBefore = await device.status();
      for (const bad of [[0xff], [0xfe], [0xc0, 0xae], [0xed, 0xa0, 0x80]]) {
        for (const res of [
          await send("POST", "/side-control/contacts", phone, '{"name":"a', bad, '","display_name":"x"}'),
          await send("PUT", "/side-control/contacts/mom", phone, '{"display_name":"M', bad, '"}'),
          await send("PUT", "/me/status", device, '{"labels":{"k":"', bad, '"}}'),
        ]) {
          assert.equal(res.status, 400, `${Buffer.from(bad).toString("hex")} ${res.url}`);
          assert.equal(((await res.json()) as { error: { code: string } }).error.code, "INVALID_REQUEST");
        }
      }
      assert.deepEqual(
        (await phone.sideControl.contacts.list()).items.map((c) => [c.name, c.display_name]),
        [["mom", "Mom"]],
        "nothing created or changed",
      );
      assert.deepEqual(await device.status(), statusBefore, "nothing changed");
    });

    test("a path segment that is not percent-encoded UTF-8 names no contact, not the one spelled like it", async () => {
      // Decoding such a segment fails and it would be kept as it came: "%FF" would reach the contact
      // named "%FF", whose URL is /contacts/%25FF.
      for (const raw of ["%FF", "%ED%A0%80", "%C0%AE"]) {
        await phone.sideControl.contacts.create({ name: raw, display_name: "literal" });
        const path = `/side-control/contacts/${raw}`;
        assert.deepEqual(await call(phone, "GET", path), { status: 404, code: "CONTACT_NOT_FOUND" }, raw);
        assert.deepEqual(await call(phone, "PUT", path, { display_name: "changed" }), { status: 404, code: "CONTACT_NOT_FOUND" }, raw);
        assert.deepEqual(await call(phone, "DELETE", path), { status: 404, code: "CONTACT_NOT_FOUND" }, raw);
        assert.equal((await phone.sideControl.contacts.get(raw)).display_name, "literal", "reachable at its own URL, unchanged");
        await phone.sideControl.contacts.delete(raw);
      }
    });

    test("contacts carry created_at and updated_at as RFC 3339 strings", async () => {
      const mom = await phone.sideControl.contacts.get("mom");
      for (const t of [mom.created_at, mom.updated_at]) {
        assert.equal(typeof t, "string");
        assert.match(t, /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/);
      }
    });

    test("a public key is accepted only in its canonical form", async () => {
      const device2 = server.client();
      await device2.login();
      const raw = decodeKey(device2.publicKey);
      const topBit = Uint8Array.from(raw);
      topBit[31]! |= 0x80;
      // p = 2^255 − 19 and p + 1, both names of small canonical values.
      const p = Uint8Array.from({ length: 32 }, (_, i) => (i === 0 ? 0xed : i === 31 ? 0x7f : 0xff));
      const p1 = Uint8Array.from(p);
      p1[0] = 0xee;
      for (const key of [topBit, p, p1]) {
        assert.equal(isCanonicalKey(key), false);
        const res = await server.fetch(`${server.url}/login`, {
          method: "POST",
          headers: { authorization: `Bearer ${await device2.assertion()}`, "x-public-key": encodeKey(key) },
        });
        assert.equal(res.status, 401);
        assert.equal(((await res.json()) as { error: { code: string } }).error.code, "INVALID_PUBLIC_KEY");
        const me = await server.fetch(`${server.url}/me`, { headers: { authorization: `Bearer ${device2.accessToken}`, "x-public-key": encodeKey(key) } });
        assert.equal(me.status, 401, "a non-canonical spelling of the session's key does not match it");
        assert.equal(((await me.json()) as { error: { code: string } }).error.code, "PUBLIC_KEY_MISMATCH");
      }
      assert.equal(isCanonicalKey(raw), true);
      assert.equal((await server.store.read((r) => r.peers.list())).filter((row) => row.public_key === encodeKey(topBit)).length, 0);
    });
  });
}
