import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { after, before, describe, test } from "node:test";
import pg from "pg";
import { generateKeyPair } from "../src/crypto/keys.ts";
import { ManualClock } from "../src/domain/clock.ts";
import { SILENT_NODE_ROWS_MS } from "../src/domain/stream-slots.ts";
import { PerchClient } from "../src/sdk/client.ts";
import {
  freshPostgresDatabase,
  type ServerProcess,
  STORES,
  spawnServer,
  startTestServer,
  TEST_DATABASE_URL,
  type TestServer,
  tempDir,
} from "./support/server.ts";
import { EventStream } from "./support/sse.ts";
import { connect, eventually } from "./support/webrtc.ts";

/** A device (primary session) and a phone paired with it (Side Control session). */
async function pair(server: TestServer, device: PerchClient = server.client()): Promise<{ device: PerchClient; phone: PerchClient; sessionId: string }> {
  if (!device.accessToken) await device.login();
  const phone = server.client();
  const login = await phone.login({ deviceToken: (await device.createDeviceToken()).token });
  return { device, phone, sessionId: login.session_id };
}

/** Opens streams at once, one per URL, with one bearer: those opened and the refusals. */
async function race(urls: string[], bearer: string): Promise<{ open: EventStream[]; refused: Response[] }> {
  const results = await Promise.all(urls.map((url) => EventStream.open(url, bearer)));
  return {
    open: results.filter((r): r is EventStream => r instanceof EventStream),
    refused: results.filter((r): r is Response => !(r instanceof EventStream)),
  };
}

/** Opens a stream, trying again while the session's slots are all taken (429), until one frees. */
async function openWhenFree(url: string, bearer: string, what = "a free slot"): Promise<EventStream> {
  return eventually(
    async () => {
      const s = await EventStream.open(url, bearer);
      if (s instanceof EventStream) return s;
      assert.equal(await refusal(s), "429 RATE_LIMITED");
      await new Promise((r) => setTimeout(r, 100));
      return undefined;
    },
    30_000,
    what,
  );
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
      server = await startTestServer({ config: { database_url: await store.url() }, liveKeepAliveMs: 300 });
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

    test("ten racing opens of one session: exactly four streams, the rest 429 with Retry-After; one closing frees a slot", async () => {
      const { phone } = await pair(server);
      const { open, refused } = await race(
        Array.from({ length: 10 }, () => server.url),
        phone.accessToken!,
      );
      assert.equal(open.length, 4, "exactly four streams open");
      assert.equal(refused.length, 6);
      for (const res of refused) {
        assert.equal(res.headers.get("retry-after"), "1");
        assert.equal(await refusal(res), "429 RATE_LIMITED");
      }
      // Another session of the same device is not limited by this one's streams.
      const other = await pair(server);
      (await EventStream.must(server.url, other.phone.accessToken)).close();
      // One closing: its slot comes back (once the server saw the client leave), and only one.
      open[0]?.close();
      const again = await openWhenFree(server.url, phone.accessToken!);
      assert.equal(await refusal(await EventStream.open(server.url, phone.accessToken)), "429 RATE_LIMITED");
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

for (const store of STORES) {
  describe(`GET /side-control/events: rows of a node that never came back are swept (${store.name})`, () => {
    const clock = new ManualClock();
    let server: TestServer;
    before(async () => {
      server = await startTestServer({ clock, cleanupIntervalMs: 50, config: { database_url: await store.url(), node_name: "sweeper" } });
    });
    after(() => server.stop());

    test("the cleanup job deletes them once the node has been silent for 5 minutes, never this node's own", async () => {
      const { phone, sessionId } = await pair(server);
      const own = await EventStream.must(server.url, phone.accessToken);
      await own.until((s) => s.events().length >= 2, "the first events");
      // A node that held a stream of this session, beat once and died.
      await server.store.transaction(async (tx) => {
        await tx.runtime.beat("gone", clock.now());
        await tx.liveStreams.insert({ id: "gone-stream", session_id: sessionId, node: "gone", opened_at: clock.now() });
      });
      const rows = (node: string) => server.store.read((r) => r.liveStreams.countNode(node));
      assert.deepEqual([await rows("gone"), await rows("sweeper")], [1, 1]);
      clock.advance(SILENT_NODE_ROWS_MS + 1);
      await eventually(async () => (await rows("gone")) === 0, 10_000, "the silent node's row swept");
      assert.equal(await rows("sweeper"), 1, "this node's own stream keeps its row");
      own.close();
      await eventually(async () => (await rows("sweeper")) === 0, 10_000, "the closed stream's row deleted");
    });
  });
}

for (const store of STORES) {
  describe(`GET /side-control/events: a client that leaves while its stream opens (${store.name})`, () => {
    let server: TestServer;
    let databaseUrl: string | undefined;
    before(async () => {
      databaseUrl = await store.url();
      server = await startTestServer({ config: { database_url: databaseUrl, node_name: "left" } });
    });
    after(() => server.stop());

    /** Holds up the slot's transaction: the session's row locked (PostgreSQL), or the write lock taken (SQLite). */
    async function holdStore(sessionId: string): Promise<() => Promise<void>> {
      if (!databaseUrl) {
        const blocker = new DatabaseSync(join(server.dataDir, "perch.db"));
        blocker.exec("begin immediate");
        return async () => {
          blocker.exec("commit");
          blocker.close();
        };
      }
      const blocker = new pg.Client({ connectionString: databaseUrl });
      await blocker.connect();
      await blocker.query("begin");
      await blocker.query("select id from sessions where id = $1 for update", [sessionId]);
      return async () => {
        await blocker.query("commit");
        await blocker.end();
      };
    }

    const connections = () => new Promise<number>((resolve, reject) => server.httpServer.getConnections((err, n) => (err ? reject(err) : resolve(n))));

    test("the stream it asked for ends and its slot is given back once the store answers", async () => {
      const { phone, sessionId } = await pair(server);
      const release = await holdStore(sessionId);
      let released = false;
      try {
        const abort = new AbortController();
        const opening = fetch(`${server.url}/side-control/events`, {
          headers: { authorization: `Bearer ${phone.accessToken}` },
          signal: abort.signal,
        }).catch(() => undefined);
        // The stream is registered, and waits for its slot.
        await eventually(() => server.domain.live.size === 1, 5_000, "the open waiting for the store");
        abort.abort();
        await opening;
        await eventually(async () => (await connections()) === 0, 5_000, "the server saw the client leave");
        await release();
        released = true;
        const rows = () => server.store.read((r) => r.liveStreams.countNode("left"));
        await eventually(async () => server.domain.live.size === 0 && (await rows()) === 0, 5_000, "no stream and no slot left of the client that left");
      } finally {
        if (!released) await release();
      }
      const four = await Promise.all([1, 2, 3, 4].map(() => EventStream.must(server.url, phone.accessToken)));
      for (const s of four) s.close();
    });
  });
}

describe("GET /side-control/events: a stream outlives the request timeout", () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer({ config: { http: { request_timeout_ms: 500, max_connections: 100 } }, liveKeepAliveMs: 200 });
  });
  after(() => server.stop());

  test("open for several request timeouts, it keeps getting keep-alives", async () => {
    const { phone } = await pair(server);
    const stream = await EventStream.must(server.url, phone.accessToken);
    // Ten keep-alives, each after 200 ms without an event, span at least 2 s: four request timeouts.
    await stream.until((st) => st.items.filter((i) => "comment" in i).length >= 10, "ten keep-alive comments");
    assert.equal(stream.ended, false, "the server did not cut the stream");
    stream.close();
  });
});

describe("GET /side-control/events: a session's streams counted across two nodes on one PostgreSQL", {
  skip: TEST_DATABASE_URL ? false : "PERCH_TEST_DATABASE_URL is not set",
}, () => {
  let dataDir: string;
  let env: Record<string, string>;
  let a: ServerProcess;
  let b: ServerProcess;
  const envA = () => ({ ...env, PERCH_NODE_NAME: "node-a" });

  before(async () => {
    dataDir = tempDir();
    env = { PERCH_DATA_DIR: dataDir, PERCH_DATABASE_URL: await freshPostgresDatabase(), PERCH_LOG_LEVEL: "warn" };
    [a, b] = await Promise.all([spawnServer(envA()), spawnServer({ ...env, PERCH_NODE_NAME: "node-b" })]);
  });
  after(async () => {
    await Promise.all([a?.stop(), b?.stop()]);
    rmSync(dataDir, { recursive: true, force: true });
  });

  /** A device logged in on A and a phone paired with it: the phone's bearer works on both nodes. */
  async function pairOn(node: ServerProcess): Promise<string> {
    const device = new PerchClient({ baseUrl: node.url, keyPair: generateKeyPair() });
    await device.login();
    const phone = new PerchClient({ baseUrl: node.url, keyPair: generateKeyPair() });
    await phone.login({ deviceToken: (await device.createDeviceToken()).token });
    return phone.accessToken!;
  }

  async function streamRows(node: string): Promise<number> {
    const c = new pg.Client({ connectionString: env.PERCH_DATABASE_URL });
    await c.connect();
    try {
      return Number((await c.query("select count(*) as n from live_streams where node = $1", [node])).rows[0].n);
    } finally {
      await c.end();
    }
  }

  test("ten opens racing over both nodes: exactly four streams", async () => {
    const bearer = await pairOn(a);
    const { open, refused } = await race(
      Array.from({ length: 10 }, (_, i) => (i % 2 === 0 ? a.url : b.url)),
      bearer,
    );
    assert.equal(open.length, 4, "exactly four streams open over both nodes");
    for (const res of refused) assert.equal(await refusal(res), "429 RATE_LIMITED");
    for (const s of open) s.close();
  });

  test("a stream on A and three on B are the session's four; one closing on A frees a slot on B", async () => {
    const bearer = await pairOn(a);
    const onA = await EventStream.must(a.url, bearer);
    const onB = await Promise.all([1, 2, 3].map(() => EventStream.must(b.url, bearer)));
    for (const node of [a, b]) {
      const fifth = await EventStream.open(node.url, bearer);
      assert.ok(!(fifth instanceof EventStream));
      assert.equal(fifth.headers.get("retry-after"), "1");
      assert.equal(await refusal(fifth), "429 RATE_LIMITED");
    }
    onA.close();
    const again = await openWhenFree(b.url, bearer, "the slot A's stream gave back");
    assert.equal(await refusal(await EventStream.open(a.url, bearer)), "429 RATE_LIMITED");
    for (const s of [...onB, again]) s.close();
  });

  test("a killed node's streams stop counting once its heartbeat is stale; started again, it clears its rows", async () => {
    const bearer = await pairOn(b);
    const onA = await Promise.all([1, 2].map(() => EventStream.must(a.url, bearer)));
    const onB = await Promise.all([1, 2].map(() => EventStream.must(b.url, bearer)));
    assert.equal(await refusal(await EventStream.open(b.url, bearer)), "429 RATE_LIMITED");
    assert.equal(await streamRows("node-a"), 2);

    a.process.kill("SIGKILL");
    await new Promise((r) => a.process.once("exit", r));
    // Its two rows stay (nothing removed them) but stop counting once node-a's heartbeat is stale.
    const freed = [await openWhenFree(b.url, bearer, "node-a's slots freed"), await openWhenFree(b.url, bearer, "node-a's second slot")];
    assert.equal(await refusal(await EventStream.open(b.url, bearer)), "429 RATE_LIMITED", "and no more than those two");
    assert.equal(await streamRows("node-a"), 2);

    a = await spawnServer(envA());
    assert.equal(await streamRows("node-a"), 0, "node-a started again and cleared what its crashed run left");
    assert.equal(await refusal(await EventStream.open(a.url, bearer)), "429 RATE_LIMITED", "B's four streams count on A");
    for (const s of [...onA, ...onB, ...freed]) s.close();
  });

  test("a node stopping cleanly removes its rows at once", async () => {
    const bearer = await pairOn(a);
    const onA = await Promise.all([1, 2, 3, 4].map(() => EventStream.must(a.url, bearer)));
    assert.equal(await streamRows("node-a"), 4);
    assert.equal(await a.stop(), 0);
    await Promise.all(onA.map((s) => s.end()));
    assert.equal(await streamRows("node-a"), 0);
    // Without waiting for any heartbeat to go stale, B admits the session's four streams.
    const onB = await Promise.all([1, 2, 3, 4].map(() => EventStream.must(b.url, bearer)));
    for (const s of onB) s.close();
    a = await spawnServer(envA());
  });
});
