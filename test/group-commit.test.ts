import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import { sql } from "kysely";
import { encodeKey, generateKeyPair } from "../src/crypto/keys.ts";
import { type Db, type Repositories, Store } from "../src/store/index.ts";
import { tempDir } from "./support/server.ts";

const peer = (key: string) => ({ public_key: key, role: "client", status: "active", device_info: "{}", created_at: 1, updated_at: 1 });

/** The transaction handle behind a unit's repositories (to write what no repository would). */
const handle = (tx: Repositories) => (tx.peers as unknown as { db: Db }).db;

describe("SQLite group commit: a shared commit that fails", () => {
  let dir: string;
  let store: Store;
  before(async () => {
    dir = tempDir();
    store = await Store.open(undefined, dir, { readWorkers: 0 });
  });
  after(async () => {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test("fails only the unit at fault: the others of its batch commit", async () => {
    const keys = Array.from({ length: 40 }, () => encodeKey(generateKeyPair().publicKey));
    // One unit leaves a foreign-key violation that SQLite checks only at commit (deferred), so the
    // shared commit of its whole batch fails; every unit arrives in the same turn and shares it.
    const units = keys.map((key, i) =>
      store.transaction(async (tx) => {
        await tx.peers.register(peer(key));
        if (i === 17) {
          await sql`pragma defer_foreign_keys = on`.execute(handle(tx));
          await sql`insert into peer_status (public_key, document, updated_at) values (${"no-such-peer"}, '{}', 1)`.execute(handle(tx));
        }
        return i;
      }),
    );
    const outcomes = await Promise.allSettled(units);
    const failed = outcomes.flatMap((o, i) => (o.status === "rejected" ? [i] : []));
    assert.deepEqual(failed, [17], "only the unit at fault failed");
    assert.match(String((outcomes[17] as PromiseRejectedResult).reason), /FOREIGN KEY/);
    for (const [i, key] of keys.entries()) {
      assert.equal((await store.read((r) => r.peers.get(key)))?.public_key, i === 17 ? undefined : key, `unit ${i}`);
    }
  });
});
