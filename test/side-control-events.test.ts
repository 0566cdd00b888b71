import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { ManualClock } from "../src/domain/clock.ts";
import type { PerchClient } from "../src/sdk/client.ts";
import { STORES, startTestServer, type TestServer } from "./support/server.ts";
import { EventStream } from "./support/sse.ts";
import { connect } from "./support/webrtc.ts";

/** A device (primary session) and a phone paired with it (Side Control session). */
async function pair(server: TestServer, device: PerchClient = server.client()): Promise<{ device: PerchClient; phone: PerchClient; sessionId: string }> {
  if (!device.accessToken) await device.login();
  const phone = server.client();
  const login = await phone.login({ deviceToken: (await device.createDeviceToken()).token });
  return { device, phone, sessionId: login.session_id };
}

async function refusal(res: EventStream | Response): Promise<string> {
  if (res instanceof EventStream) {
    res.close();
    assert.fail("the stream was not refused");
  }
  const body = (await res.json()) as { error: { code: string } };
  return `${res.status} ${body.error.code}`;
}

for (const store of STORES) {
  describe(`GET /side-control/events (${store.name})`, () => {
    let server: TestServer;
    before(async () => {
      server = await startTestServer({ config: { databaseUrl: await store.url() }, liveKeepAliveMs: 300 });
    });
    after(() => server.stop());

    test("first status then runtime; then each kind of event as it happens; revocation ends the stream", async () => {
      const { device, phone, sessionId } = await pair(server);
      await device.putStatus({ volume: 30, battery_percent: 50 });
      const stream = await EventStream.must(server.url, phone.accessToken);
      await stream.until((s) => s.events().length >= 2, "the first two events");
      const [first, second] = stream.events();
      assert.equal(first?.event, "status");
      assert.equal(first?.data.volume, 30);
      assert.equal(second?.event, "runtime");
      assert.deepEqual(second?.data, { online: false });

      // status: a PUT from the device.
      await device.putStatus({ volume: 31, battery_percent: 50 });
      await stream.until((s) => s.events("status").find((e) => e.data.volume === 31), "the new status");

      // runtime and telemetry: the device connects over WebRTC and reports.
      const conn = await connect(server, { keyPair: device.keyPair });
      try {
        const online = await stream.until((s) => s.events("runtime").find((e) => e.data.online === true), "runtime online");
        assert.equal(typeof online.data.node, "string");
        const now = Date.now();
        conn.sendTelemetry({
          observedAtUnixMs: BigInt(now),
          observations: [
            { observedAtDeltaMs: 0, body: { case: "battery", value: { percent: 42, charging: true } } },
            { observedAtDeltaMs: 0, body: { case: "system", value: { temperatureC: 36.5 } } },
          ],
        });
        const telemetry = await stream.until(
          (s) => s.events("telemetry").find((e) => e.data.values.some((v: { field: string }) => v.field === "battery.percent")),
          "telemetry",
        );
        assert.deepEqual(
          telemetry.data.values.find((v: { field: string }) => v.field === "battery.percent"),
          { field: "battery.percent", value: 42, observed_at_unix_ms: now },
        );
        // The telemetry merge changed the stored status: a status event follows.
        await stream.until((s) => s.events("status").find((e) => e.data.battery_percent === 42 && e.data.charging === true), "the merged status");
      } finally {
        conn.close();
      }
      await stream.until((s) => s.events("runtime").filter((e) => e.data.online === false).length >= 2, "runtime offline again");

      // contacts: created, updated, deleted by the phone itself.
      await phone.sideControl.contacts.create({ name: "mom", phone_number: "+1 555 0100" });
      await phone.sideControl.contacts.update("mom", { display_name: "Mum" });
      await phone.sideControl.contacts.delete("mom");
      await stream.until((s) => s.events("contacts").length >= 3, "three contact events");
      assert.deepEqual(
        stream.events("contacts").map((e) => e.data),
        [
          { name: "mom", change: "created" },
          { name: "mom", change: "updated" },
          { name: "mom", change: "deleted" },
        ],
      );

      // Byte counters never make a runtime event; only online changes did (initial, online, offline).
      assert.deepEqual(
        stream.events("runtime").map((e) => e.data.online),
        [false, true, false],
      );

      await device.revokeSideControlSession(sessionId);
      await stream.end(2_000);
      assert.deepEqual(stream.events().at(-1), { event: "session", data: { state: "revoked" } });
      assert.equal(await refusal(await EventStream.open(server.url, phone.accessToken)), "401 INVALID_SESSION");
    });

    test("the route is in the OpenAPI document as an event stream with its refusals", async () => {
      const doc = (await (await fetch(`${server.url}/openapi.json`)).json()) as {
        paths: Record<string, { get?: { responses: Record<string, { content?: object }> } }>;
      };
      const get = doc.paths["/side-control/events"]?.get;
      assert.ok(get, "documented");
      assert.deepEqual(Object.keys(get.responses["200"]?.content ?? {}), ["text/event-stream"]);
      for (const status of ["401", "403", "429"]) assert.ok(get.responses[status], `documents ${status}`);
    });

    test("a keep-alive comment on an idle stream", async () => {
      const { phone } = await pair(server);
      const stream = await EventStream.must(server.url, phone.accessToken);
      await stream.until((s) => s.items.some((i) => "comment" in i), "a comment line");
      stream.close();
    });

    test("401 without a bearer, with a wrong one, or with a token in the URL; 403 for a primary session", async () => {
      const { device, phone } = await pair(server);
      assert.equal(await refusal(await EventStream.open(server.url, undefined)), "401 INVALID_SESSION");
      assert.equal(await refusal(await EventStream.open(server.url, "not-a-token")), "401 INVALID_SESSION");
      assert.equal(
        await refusal(await EventStream.open(server.url, undefined, {}, `/side-control/events?access_token=${phone.accessToken}`)),
        "401 INVALID_SESSION",
      );
      assert.equal(await refusal(await EventStream.open(server.url, device.accessToken)), "403 SIDE_CONTROL_SESSION_REQUIRED");
      assert.equal(await refusal(await EventStream.open(server.url, phone.accessToken, { "x-public-key": device.publicKey })), "401 PUBLIC_KEY_MISMATCH");
    });

    test("at most four open streams per session: the fifth is refused, one closing makes room", async () => {
      const { phone } = await pair(server);
      const open = await Promise.all([1, 2, 3, 4].map(() => EventStream.must(server.url, phone.accessToken)));
      const fifth = await EventStream.open(server.url, phone.accessToken);
      assert.ok(!(fifth instanceof EventStream));
      assert.equal(fifth.headers.get("retry-after"), "1");
      assert.equal(await refusal(fifth), "429 RATE_LIMITED");
      // Another session of the same device is not limited by this one's streams.
      const other = await pair(server);
      (await EventStream.must(server.url, other.phone.accessToken)).close();
      open[0]?.close();
      await new Promise((r) => setTimeout(r, 200));
      const again = await EventStream.must(server.url, phone.accessToken);
      for (const s of [...open, again]) s.close();
    });

    test("an operator blocking the device or removing it ends the streams", async () => {
      const blocked = await pair(server);
      const s1 = await EventStream.must(server.url, blocked.phone.accessToken);
      await s1.until((s) => s.events().length >= 2, "the first events");
      await server.domain.peers.setBlocked(blocked.device.publicKey, true);
      await s1.end(2_000);
      assert.equal(await refusal(await EventStream.open(server.url, blocked.phone.accessToken)), "403 PEER_BLOCKED");

      const removed = await pair(server);
      const s2 = await EventStream.must(server.url, removed.phone.accessToken);
      await s2.until((s) => s.events().length >= 2, "the first events");
      await server.domain.peers.remove(removed.device.publicKey);
      await s2.end(2_000);
      assert.deepEqual(s2.events().at(-1), { event: "session", data: { state: "revoked" } });
    });
  });
}

describe("GET /side-control/events: the session expiring", () => {
  const clock = new ManualClock();
  let server: TestServer;
  before(async () => {
    server = await startTestServer({ clock });
  });
  after(() => server.stop());

  test("the stream says expired and ends", async () => {
    const { phone } = await pair(server);
    const stream = await EventStream.must(server.url, phone.accessToken);
    await stream.until((s) => s.events().length >= 2, "the first events");
    clock.advance(24 * 3600_000 + 1);
    await stream.end(3_000);
    assert.deepEqual(stream.events().at(-1), { event: "session", data: { state: "expired" } });
  });
});

describe("GET /side-control/events: a stream outlives the request timeout", () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer({ config: { http: { requestTimeoutMs: 500, maxConnections: 100 } }, liveKeepAliveMs: 200 });
  });
  after(() => server.stop());

  test("open for several request timeouts, it keeps getting keep-alives", async () => {
    const { phone } = await pair(server);
    const stream = await EventStream.must(server.url, phone.accessToken);
    await new Promise((r) => setTimeout(r, 2_000));
    assert.equal(stream.ended, false, "the server did not cut the stream");
    assert.ok(stream.items.filter((i) => "comment" in i).length >= 3);
    stream.close();
  });
});
