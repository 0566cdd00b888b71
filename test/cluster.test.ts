import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import pg from "pg";
import { generateKeyPair, type KeyPair } from "../src/crypto/keys.ts";
import { PerchApiError, PerchClient } from "../src/sdk/client.ts";
import { freshPostgresDatabase, ROOT, type ServerProcess, spawnServer, TEST_DATABASE_URL, tempDir } from "./support/server.ts";
import { EventStream } from "./support/sse.ts";
import { connect, eventually } from "./support/webrtc.ts";

/** Runs the `perch` command line and parses its JSON output. */
function perch(args: string[], env: Record<string, string>): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(join(ROOT, "bin/perch"), args, { env: { PERCH_CONFIG: "", ...process.env, ...env }, timeout: 30_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr });
    });
  });
}

const client = (node: ServerProcess, keyPair: KeyPair = generateKeyPair()) => new PerchClient({ baseUrl: node.url, keyPair });

/** The same key (and bearer) talking to another node. */
function on(node: ServerProcess, c: PerchClient): PerchClient {
  const other = client(node, c.keyPair);
  other.accessToken = c.accessToken;
  return other;
}

function refused(status: number, code: string) {
  return (e: unknown) => {
    assert.ok(e instanceof PerchApiError, String(e));
    assert.equal(`${e.status} ${e.code}`, `${status} ${code}`);
    return true;
  };
}

describe("two perch serve processes on one PostgreSQL database", { skip: TEST_DATABASE_URL ? false : "PERCH_TEST_DATABASE_URL is not set" }, () => {
  let dataDir: string;
  let env: Record<string, string>;
  let a: ServerProcess;
  let b: ServerProcess;

  before(async () => {
    dataDir = tempDir();
    env = { PERCH_DATA_DIR: dataDir, PERCH_DATABASE_URL: await freshPostgresDatabase() };
    // Both start at once on a fresh database and an empty data directory (shared key file, migrations).
    [a, b] = await Promise.all([spawnServer({ ...env, PERCH_NODE_NAME: "node-a" }), spawnServer({ ...env, PERCH_NODE_NAME: "node-b" })]);
    // No agent, no `engines.preload`: the nodes load no engine at start-up (issue 41), whose CPU on a
    // loaded machine once made a command between the nodes outlast its wait.
  });
  after(async () => {
    const codes = await Promise.all([a?.stop(), b?.stop()]);
    rmSync(dataDir, { recursive: true, force: true });
    assert.deepEqual(codes, [0, 0], "both nodes exit cleanly on SIGTERM");
  });

  test("both nodes publish the same server key", async () => {
    const [infoA, infoB] = await Promise.all([client(a).serverInfo(), client(b).serverInfo()]);
    assert.equal(infoA.public_key, infoB.public_key);
    assert.notEqual(a.url, b.url);
  });

  test("an assertion accepted by one node is refused by the other; a bearer works on both", async () => {
    const deviceA = client(a);
    const assertion = await deviceA.assertion({ lifetimeSeconds: 300 });
    const login = await deviceA.login({ assertion });

    const deviceB = on(b, deviceA);
    deviceB.accessToken = undefined;
    await assert.rejects(deviceB.login({ assertion }), refused(401, "INVALID_ASSERTION"));
    assert.equal(deviceB.accessToken, undefined, "the refused login issued nothing");

    // The other direction, with a fresh assertion.
    const second = await deviceB.assertion();
    await deviceB.login({ assertion: second });
    await assert.rejects(on(a, deviceA).login({ assertion: second }), refused(401, "INVALID_ASSERTION"));

    // A's bearer works on B.
    deviceB.accessToken = login.access_token;
    const me = await deviceB.me();
    assert.equal(me.public_key, deviceA.publicKey);
    const status = await deviceB.putStatus({ volume: 12 });
    assert.equal((await deviceA.status()).volume, 12);
    assert.deepEqual(await deviceA.status(), status);
  });

  test("50 concurrent Side Control logins with one device token over both nodes: exactly one wins", async () => {
    const device = client(a);
    await device.login();
    const token = await device.createDeviceToken();

    const controllers = Array.from({ length: 50 }, (_, i) => client(i % 2 === 0 ? a : b));
    const assertions = await Promise.all(controllers.map((c) => c.assertion()));
    const results = await Promise.allSettled(controllers.map((c, i) => c.login({ deviceToken: token.token, assertion: assertions[i]! })));

    const won = results.flatMap((r, i) => (r.status === "fulfilled" ? [{ controller: controllers[i]!, result: r.value }] : []));
    assert.equal(won.length, 1, "exactly one login consumes the token");
    for (const r of results) {
      if (r.status === "rejected") refused(401, "INVALID_DEVICE_TOKEN")(r.reason);
    }
    const winner = won[0]!;
    assert.equal(winner.result.grant_type, "side_control");
    const sessions = await on(b, device).sideControlSessions();
    assert.deepEqual(
      sessions.items.map((s) => [s.id, s.controller_public_key]),
      [[winner.result.session_id, winner.controller.publicKey]],
    );
    // The winner's session works on both nodes.
    assert.deepEqual(await on(a, winner.controller).sideControl.status(), await on(b, winner.controller).sideControl.status());
  });

  test("a Side Control session revoked through node A stops working on node B at once", async () => {
    const device = client(a);
    await device.login();
    const token = await device.createDeviceToken();
    const phone = client(b);
    const sc = await phone.login({ deviceToken: token.token });
    await phone.sideControl.contacts.create({ name: "mom", phone_number: "+1 555 0100" });
    assert.equal((await phone.sideControl.contacts.list()).items.length, 1);

    await device.revokeSideControlSession(sc.session_id);
    await assert.rejects(phone.sideControl.contacts.list(), refused(401, "INVALID_SESSION"));
    await assert.rejects(on(a, phone).sideControl.status(), refused(401, "INVALID_SESSION"));
    await assert.rejects(on(b, device).revokeSideControlSession(sc.session_id), refused(404, "SIDE_CONTROL_SESSION_NOT_FOUND"));
    assert.deepEqual((await on(b, device).sideControlSessions()).items, []);
  });

  test("events cross nodes: the device on A, the phone streaming from B; a tone asked on B plays on A", async () => {
    const conn = await connect(a);
    try {
      const device = client(a, conn.keyPair);
      await device.login();
      const phone = client(b);
      const sc = await phone.login({ deviceToken: (await device.createDeviceToken()).token });
      const stream = await EventStream.must(b.url, phone.accessToken);
      const runtime = await stream.until((s) => s.events("runtime")[0], "the first runtime");
      assert.deepEqual([runtime.data.online, runtime.data.node], [true, "node-a"]);

      const now = Date.now();
      conn.sendTelemetry({ observedAtUnixMs: BigInt(now), observations: [{ observedAtDeltaMs: 0, body: { case: "battery", value: { percent: 64 } } }] });
      const telemetry = await stream.until((s) => s.events("telemetry")[0], "telemetry reported on A");
      assert.deepEqual(telemetry.data.values, [{ field: "battery.percent", value: 64, observed_at_unix_ms: now }]);
      await stream.until((s) => s.events("status").find((e) => e.data.battery_percent === 64), "the merged status");

      // The device's bearer on B: B does not hold the connection, A plays the tone.
      const tone = await on(b, device).request<{ frames: number }>("POST", "/me/audio/tone", { body: { frequency_hz: 440, duration_ms: 400 } });
      assert.deepEqual(tone, { frames: 20 });
      await eventually(() => conn.audio.audible > 5, 5000, "audible audio from node A");

      // The nodes' event connections are terminated: both make them again, and events flow on.
      const admin = new pg.Client({ connectionString: env.PERCH_DATABASE_URL });
      await admin.connect();
      try {
        const killed = await admin.query(
          "select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'perch events' and datname = current_database()",
        );
        assert.equal(killed.rowCount, 2);
      } finally {
        await admin.end();
      }
      await eventually(
        async () => {
          await on(a, device).putStatus({ volume: 77 });
          return stream.events("status").some((e) => e.data.volume === 77);
        },
        15_000,
        "a status after the reconnect",
      );

      // Revoked through A: B's stream ends.
      await device.revokeSideControlSession(sc.session_id);
      await stream.end(2_000);
      assert.deepEqual(stream.events().at(-1), { event: "session", data: { state: "revoked" } });
      assert.equal(a.process.exitCode, null, "node A survived");
      assert.equal(b.process.exitCode, null, "node B survived");
    } finally {
      conn.close();
    }
  });

  test("a peer blocked through the command line is refused by both nodes", async () => {
    const device = client(a);
    await device.login();
    const token = await device.createDeviceToken();
    const phone = client(b);
    await phone.login({ deviceToken: (await device.createDeviceToken()).token });
    const streams = await Promise.all([a, b].map((node) => EventStream.must(node.url, phone.accessToken)));

    const blocked = await perch(["peers", "block", device.publicKey], env);
    assert.equal(blocked.code, 0, blocked.stderr);
    assert.deepEqual(JSON.parse(blocked.stdout), { public_key: device.publicKey, status: "blocked" });
    // The command line's own process told both nodes through PostgreSQL: their streams end.
    await Promise.all(streams.map((s) => s.end(2_000)));

    for (const node of [a, b]) {
      await assert.rejects(on(node, device).me(), refused(403, "PEER_BLOCKED"));
      await assert.rejects(on(node, device).putStatus({ volume: 1 }), refused(403, "PEER_BLOCKED"));
      await assert.rejects(client(node, device.keyPair).login(), refused(403, "PEER_BLOCKED"));
      await assert.rejects(on(node, phone).sideControl.status(), refused(403, "PEER_BLOCKED"));
      await assert.rejects(client(node).login({ deviceToken: token.token }), refused(403, "PEER_BLOCKED"));
    }

    const unblocked = await perch(["peers", "unblock", device.publicKey], env);
    assert.equal(unblocked.code, 0, unblocked.stderr);
    for (const node of [a, b]) {
      assert.equal((await on(node, device).me()).registration_status, "active");
      assert.deepEqual(await on(node, phone).sideControl.status(), {});
    }
    // The refused Side Control logins did not consume the token.
    assert.equal((await client(b).login({ deviceToken: token.token })).grant_type, "side_control");
  });
});
