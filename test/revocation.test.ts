import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { ManualClock } from "../src/domain/clock.ts";
import type { PerchClient } from "../src/sdk/client.ts";
import { perchJson } from "./support/cli.ts";
import { freshPostgresDatabase, STORES, startTestServer, TEST_DATABASE_URL, type TestServer } from "./support/server.ts";
import { EventStream } from "./support/sse.ts";

/**
 * Every change that ends access — a session revoked (by the command line, the device, or the
 * controller itself) or expired, its device blocked or removed — ends the affected
 * `GET /side-control/events` streams, a `session` event first, on every node: on SQLite the
 * command line is another process whose commit the node notices; on PostgreSQL two nodes hear it
 * through NOTIFY. Streams of other sessions go on.
 */

/** A device (primary session) and a phone paired with it through `server`. */
async function pair(server: TestServer): Promise<{ device: PerchClient; phone: PerchClient; sessionId: string }> {
  const device = server.client();
  await device.login();
  const phone = server.client();
  const login = await phone.login({ deviceToken: (await device.createDeviceToken()).token });
  return { device, phone, sessionId: login.session_id };
}

/** One stream of the phone's session on each node, each past its first two events. */
async function streams(nodes: TestServer[], bearer: string | undefined): Promise<EventStream[]> {
  return Promise.all(
    nodes.map(async (n) => {
      const s = await EventStream.must(n.url, bearer);
      await s.until((x) => x.events().length >= 2, "the first events");
      return s;
    }),
  );
}

/** Every stream ends, its last event saying the session is over. */
async function endedWith(list: EventStream[], state: "revoked" | "expired"): Promise<void> {
  for (const s of list) {
    await s.end();
    assert.deepEqual(s.events().at(-1), { event: "session", data: { state } });
  }
}

/** The streams of an unrelated pairing still run: a status change reaches them. */
async function stillLive(list: EventStream[], device: PerchClient, volume: number): Promise<void> {
  await device.putStatus({ volume });
  for (const s of list) {
    await s.until((x) => x.events("status").some((e) => e.data.volume === volume), "the bystander's status");
    assert.equal(s.ended, false);
    assert.equal(s.events("session").length, 0);
    s.close();
  }
}

async function status(res: Response): Promise<string> {
  const body = (await res.json()) as { error: { code: string } };
  return `${res.status} ${body.error.code}`;
}

const deleteSession = (url: string, bearer?: string) =>
  fetch(`${url}/side-control/session`, { method: "DELETE", headers: bearer ? { authorization: `Bearer ${bearer}` } : {} });

for (const store of STORES) {
  const twoNodes = store.name === "postgres";
  describe(`revocation reaches open event streams (${store.name}${twoNodes ? ", two nodes" : ""})`, () => {
    let nodes: TestServer[];
    let env: Record<string, string>;
    before(async () => {
      const databaseUrl = await store.url();
      const first = await startTestServer({ config: { database_url: databaseUrl, node_name: "node-a" } });
      nodes = twoNodes ? [first, await startTestServer({ config: { database_url: databaseUrl, node_name: "node-b" } })] : [first];
      env = { PERCH_DATA_DIR: first.dataDir, PERCH_LOG_LEVEL: "silent", ...(databaseUrl ? { PERCH_DATABASE_URL: databaseUrl } : {}) };
    });
    after(async () => {
      for (const n of nodes) await n.stop();
    });

    test("perch sessions revoke ends the session's streams on every node; another pairing's go on", async () => {
      const [a] = nodes as [TestServer];
      const { phone, sessionId } = await pair(a);
      const bystander = await pair(a);
      const revoked = await streams(nodes, phone.accessToken);
      const others = await streams(nodes, bystander.phone.accessToken);
      assert.deepEqual(await perchJson(["sessions", "revoke", sessionId], env), { id: sessionId, revoked: true });
      await endedWith(revoked, "revoked");
      for (const n of nodes)
        assert.equal(
          await status(await fetch(`${n.url}/side-control/status`, { headers: { authorization: `Bearer ${phone.accessToken}` } })),
          "401 INVALID_SESSION",
        );
      await stillLive(others, bystander.device, 11);
    });

    for (const action of ["block", "remove"] as const) {
      test(`perch peers ${action} of the device ends its controllers' streams on every node`, async () => {
        const [a] = nodes as [TestServer];
        const { device, phone } = await pair(a);
        const second = a.client();
        await second.login({ deviceToken: (await device.createDeviceToken()).token });
        const bystander = await pair(a);
        const ended = [...(await streams(nodes, phone.accessToken)), ...(await streams(nodes, second.accessToken))];
        const others = await streams(nodes, bystander.phone.accessToken);
        await perchJson(["peers", action, device.publicKey], env);
        await endedWith(ended, "revoked");
        const after = await status(await fetch(`${a.url}/side-control/status`, { headers: { authorization: `Bearer ${phone.accessToken}` } }));
        assert.equal(after, action === "block" ? "403 PEER_BLOCKED" : "401 INVALID_SESSION");
        await stillLive(others, bystander.device, 12);
      });
    }

    test("setting the device's voice agent (a message on the same topic) leaves its controllers' streams running", async () => {
      const [a] = nodes as [TestServer];
      const { device, phone } = await pair(a);
      const running = await streams(nodes, phone.accessToken);
      // Published before the status change, on the same bus: a stream it ended would not see the status.
      assert.equal(await a.domain.peers.setVoiceAgent(device.publicKey, "off"), true);
      await stillLive(running, device, 13);
    });

    test("perch peers block of the controller (a registered peer) ends its streams", async () => {
      const [a] = nodes as [TestServer];
      const controller = a.client();
      await controller.login(); // A primary login of its own registers the controller's key.
      const device = a.client();
      await device.login();
      await controller.login({ deviceToken: (await device.createDeviceToken()).token });
      const ended = await streams(nodes, controller.accessToken);
      await perchJson(["peers", "block", controller.publicKey], env);
      await endedWith(ended, "revoked");
    });

    test("DELETE /side-control/session (the app's forget): 204, the session's streams end on every node, its bearer is refused", async () => {
      const [a] = nodes as [TestServer];
      const { device, phone } = await pair(a);
      const sibling = a.client();
      await sibling.login({ deviceToken: (await device.createDeviceToken()).token });
      const ended = await streams(nodes, phone.accessToken);
      const others = await streams(nodes, sibling.accessToken);
      const last = nodes.at(-1) as TestServer;
      const res = await deleteSession(last.url, phone.accessToken);
      assert.equal(res.status, 204);
      assert.equal(await res.text(), "");
      await endedWith(ended, "revoked");
      for (const n of nodes) assert.equal(await status(await deleteSession(n.url, phone.accessToken)), "401 INVALID_SESSION", "already revoked");
      assert.deepEqual(
        (await device.sideControlSessions()).items.map((s) => s.controller_public_key),
        [sibling.publicKey],
        "the device's other pairing is live",
      );
      await stillLive(others, device, 13);
      // The SDK's way to the same route.
      await sibling.sideControl.endSession();
      assert.deepEqual((await device.sideControlSessions()).items, []);
    });

    test("DELETE /side-control/session refused: no bearer, a wrong one, a primary session, a mismatched X-Public-Key; nothing changes", async () => {
      const [a] = nodes as [TestServer];
      const { device, phone } = await pair(a);
      assert.equal(await status(await deleteSession(a.url)), "401 INVALID_SESSION");
      assert.equal(await status(await deleteSession(a.url, "not-a-token")), "401 INVALID_SESSION");
      assert.equal(await status(await deleteSession(a.url, device.accessToken)), "403 SIDE_CONTROL_SESSION_REQUIRED");
      const mismatched = await fetch(`${a.url}/side-control/session`, {
        method: "DELETE",
        headers: { authorization: `Bearer ${phone.accessToken}`, "x-public-key": device.publicKey },
      });
      assert.equal(await status(mismatched), "401 PUBLIC_KEY_MISMATCH");
      assert.equal((await device.sideControlSessions()).items.length, 1, "the pairing is intact");
      assert.equal((await phone.sideControl.status()).volume, undefined);
      // The device's primary session is untouched by all of it.
      assert.equal((await device.me()).public_key, device.publicKey);
    });

    test("DELETE /side-control/session is in the OpenAPI document", async () => {
      const doc = (await (await fetch(`${nodes[0]!.url}/openapi.json`)).json()) as { paths: Record<string, { delete?: { responses: object } }> };
      assert.deepEqual(Object.keys(doc.paths["/side-control/session"]?.delete?.responses ?? {}).sort(), ["204", "401", "403", "503"]);
    });
  });
}

describe("the session expiring ends its streams on both nodes (postgres)", { skip: TEST_DATABASE_URL ? false : "PERCH_TEST_DATABASE_URL is not set" }, () => {
  const clock = new ManualClock();
  let nodes: TestServer[];
  before(async () => {
    const databaseUrl = await freshPostgresDatabase();
    nodes = [
      await startTestServer({ clock, config: { database_url: databaseUrl, node_name: "node-a" } }),
      await startTestServer({ clock, config: { database_url: databaseUrl, node_name: "node-b" } }),
    ];
  });
  after(async () => {
    for (const n of nodes) await n.stop();
  });

  test("each node's stream says expired and ends", async () => {
    const { phone } = await pair(nodes[0]!);
    const list = await streams(nodes, phone.accessToken);
    clock.advance(24 * 3600_000 + 1);
    await endedWith(list, "expired");
  });
});
