import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { encodeKey, generateKeyPair } from "../src/crypto/keys.ts";
import type { TelemetryField } from "../src/protocol/public.ts";
import { PerchClient } from "../src/sdk/client.ts";
import { perchJson } from "./support/cli.ts";
import { ROOT, STORES, startTestServer, type TestServer } from "./support/server.ts";

/** Runs a command from node_modules/.bin; resolves with its stdout, rejects when it fails. */
function run([command, ...args]: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(join(ROOT, "node_modules/.bin", command!), args, { timeout: 30_000 }, (err, stdout, stderr) =>
      err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout),
    );
  });
}

const TRIALS = 20;
const WRITERS = 20;

// Read-modify-write paths under concurrent writers of different fields of one record: every
// write must survive (PostgreSQL's READ COMMITTED lost most of them without a row lock).
for (const entry of STORES) {
  describe(`read-modify-write under concurrency (${entry.name})`, () => {
    let server: TestServer;
    let device: PerchClient;
    let phone: PerchClient;
    before(async () => {
      server = await startTestServer({ config: { database_url: await entry.url() } });
      device = server.client();
      await device.login();
      phone = server.client();
      await phone.login({ deviceToken: (await device.createDeviceToken()).token });
    });
    after(() => server.stop());

    test(`contact update: ${WRITERS} concurrent writers of display_name and phone_number, ${TRIALS} trials, nothing lost`, async () => {
      const lost: string[] = [];
      for (let trial = 0; trial < TRIALS; trial++) {
        const name = `c${trial}`;
        await phone.sideControl.contacts.create({ name, display_name: "d0", phone_number: `+9 ${trial} 000` });
        await Promise.all(
          Array.from({ length: WRITERS }, (_, i) =>
            phone.sideControl.contacts.update(name, i % 2 === 0 ? { display_name: `d${i + 1}` } : { phone_number: `+${trial} ${1000 + i}` }),
          ),
        );
        const final = await phone.sideControl.contacts.get(name);
        if (final.display_name === "d0" || final.phone_number === `+9 ${trial} 000`) lost.push(`trial ${trial}: ${JSON.stringify(final)}`);
      }
      assert.deepEqual(lost, [], `${lost.length} of ${TRIALS} trials lost a write`);
    });

    test(`telemetry merged into the status: ${WRITERS} concurrent writers of different fields, ${TRIALS} trials, nothing lost`, async () => {
      const fields: TelemetryField[] = ["battery.percent", "battery.charging", "gnss.latitude", "gnss.longitude", "gnss.altitude_m", "gnss.accuracy_m"];
      const lost: string[] = [];
      const base = Date.now() - 3_600_000;
      for (let trial = 0; trial < TRIALS; trial++) {
        const t0 = base + trial * 1_000;
        await device.putStatus({ volume: trial, reported_at: new Date(t0).toISOString() });
        await Promise.all(
          Array.from({ length: WRITERS }, (_, i) =>
            server.domain.telemetry.record(device.publicKey, [{ field: fields[i % fields.length]!, observedAt: t0 + 1 + i, value: i % 2 }]),
          ),
        );
        // Whatever the order, the newest observation is merged and the stored fields are kept.
        const status = await device.status();
        const newest = WRITERS - 1;
        const expected = { volume: trial, reported_at: new Date(t0 + 1 + newest).toISOString(), charging: newest % 2 === 1 };
        if (status.volume !== expected.volume || status.reported_at !== expected.reported_at || status.charging !== expected.charging) {
          lost.push(`trial ${trial}: ${JSON.stringify(status)}`);
        }
      }
      assert.deepEqual(lost, [], `${lost.length} of ${TRIALS} trials lost a write`);
    });

    test("a primary login overtaken by the removal of its peer registers it again, not a 500", async () => {
      const peer = server.client();
      await peer.login();
      // `perch peers remove`, run beside the server, lands between the login's checks and its transaction.
      const read = server.store.read.bind(server.store);
      let removedBetween = false;
      server.store.read = async (fn) => {
        server.store.read = read;
        const result = await read(fn);
        assert.equal(await server.domain.peers.remove(peer.publicKey), true);
        removedBetween = true;
        return result;
      };
      const again = new PerchClient({ baseUrl: server.url, keyPair: peer.keyPair });
      await again.login();
      assert.equal(removedBetween, true, "the removal ran between the login's checks and its transaction");
      assert.equal(server.store.read, read, "the patch is gone");
      assert.equal((await again.me()).public_key, peer.publicKey);
    });
  });
}

describe("the perch command line writing beside the server (SQLite)", () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer();
  });
  after(() => server.stop());

  test("peers add and block from the CLI during a burst of writes: zero failed requests", async () => {
    const device = server.client();
    await device.login();
    const phone = server.client();
    await phone.login({ deviceToken: (await device.createDeviceToken()).token });
    await phone.sideControl.contacts.create({ name: "mom", display_name: "Mom" });
    let stop = false;
    let done = 0;
    const failures: string[] = [];
    const writer = async (w: number) => {
      for (let i = 0; !stop; i++) {
        try {
          // Contact updates read before they write: a batch that starts with one held a read
          // snapshot that another process's commit made stale (SQLITE_BUSY_SNAPSHOT).
          await Promise.all([
            phone.sideControl.contacts.update("mom", { display_name: `Mom ${w}.${i}` }),
            phone.sideControl.contacts.update("mom", { phone_number: `${w}${i}` }),
            device.putStatus({ volume: i % 100 }),
          ]);
          done++;
        } catch (err) {
          failures.push(String(err));
        }
      }
    };
    const writers = Array.from({ length: 8 }, (_, w) => writer(w));
    const env = { PERCH_DATA_DIR: server.dataDir };
    const keys = Array.from({ length: 3 }, () => encodeKey(generateKeyPair().publicKey));
    try {
      // The real CLI, and a second process committing through its own Store in a tight loop
      // (the CLI alone commits too rarely to hit the window reliably).
      const [loop] = await Promise.all([
        run(["tsx", join(ROOT, "test/support/store-writer.ts"), server.dataDir, "3000"]),
        ...keys.map(async (key) => {
          assert.deepEqual(await perchJson(["peers", "add", key], env), { public_key: key, added: true });
          assert.deepEqual(await perchJson(["peers", "block", key], env), { public_key: key, status: "blocked" });
        }),
      ]);
      assert.ok(JSON.parse(loop).commits > 0, loop);
    } finally {
      stop = true;
      await Promise.all(writers);
    }
    assert.deepEqual(failures, []);
    assert.ok(done > 0);
    for (const key of keys) assert.equal((await server.store.read((r) => r.peers.get(key)))?.status, "blocked");
  });
});
