import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import { type Kysely, sql } from "kysely";
import { Migrator } from "kysely/migration";
import { encodeKey, generateKeyPair } from "../src/crypto/keys.ts";
import { compiled } from "../src/store/compiled.ts";
import { connect } from "../src/store/database.ts";
import { type Db, Store } from "../src/store/index.ts";
import { migrationProvider } from "../src/store/migrations.ts";
import type { Tables } from "../src/store/schema.ts";
import type { AggregateFunction, Point, Sample } from "../src/store/telemetry.ts";
import { STORES, tempDir } from "./support/server.ts";

const newKey = () => encodeKey(generateKeyPair().publicKey);
let idSeq = 0;
const newId = (prefix = "id") => `${prefix}-${process.pid}-${++idSeq}-${Math.random().toString(36).slice(2, 8)}`;

/** The store's own database handle, to check rows the repositories do not expose. */
const dbOf = (store: Store) => (store as unknown as { database: { db: Db } }).database.db;

async function countRows(store: Store, table: keyof Tables, column: "public_key" | "target_key", key: string): Promise<number> {
  if (table === "telemetry_samples") {
    const r = await dbOf(store)
      .selectFrom("telemetry_samples as t")
      .innerJoin("telemetry_series as s", "s.id", "t.series_id")
      .select((eb) => eb.fn.countAll<number>().as("n"))
      .where("s.public_key", "=", key)
      .executeTakeFirstOrThrow();
    return Number(r.n);
  }
  const r = await dbOf(store)
    .selectFrom(table)
    .select((eb) => eb.fn.countAll<number>().as("n"))
    .where(column as never, "=", key as never)
    .executeTakeFirstOrThrow();
  return Number(r.n);
}

async function countAll(store: Store, table: keyof Tables): Promise<number> {
  const r = await dbOf(store)
    .selectFrom(table)
    .select((eb) => eb.fn.countAll<number>().as("n"))
    .executeTakeFirstOrThrow();
  return Number(r.n);
}

/** node:sqlite hands rows out with a null prototype; compare them as plain objects. */
const plain = <T extends object>(row: T | undefined): T | undefined => (row === undefined ? undefined : { ...row });

/** A deterministic PRNG (mulberry32), so a failing random case can be replayed. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const peerRow = (publicKey: string, now: number, status = "active"): Tables["peers"] => ({
  public_key: publicKey,
  role: "client",
  status,
  device_info: "{}",
  created_at: now,
  updated_at: now,
});

/** A peer row as the store reads it back: registration adds no voice agent (the default). */
const storedPeer = (publicKey: string, now: number): Tables["peers"] => ({
  ...peerRow(publicKey, now),
  voice_agent: null,
  memory_off: 0,
  memory_forgotten_at: null,
  usage_limits: null,
});

const sessionRow = (o: Partial<Tables["sessions"]> & { id: string; public_key: string }): Tables["sessions"] => ({
  token_hash: `hash-${o.id}`,
  kind: o.target_key && o.target_key !== o.public_key ? "side_control" : "primary",
  target_key: o.public_key,
  created_at: 1_000,
  expires_at: 10_000_000,
  revoked_at: null,
  ...o,
});

const tokenRow = (o: Partial<Tables["device_tokens"]> & { target_key: string }): Tables["device_tokens"] => {
  const id = o.id ?? newId("dt");
  return { id, token_hash: `hash-${id}`, created_at: 1_000, expires_at: 301_000, consumed_at: null, ...o };
};

const contactRow = (publicKey: string, name: string, phone: string | null, now = 1_000, display: string | null = name): Tables["contacts"] => ({
  public_key: publicKey,
  name,
  display_name: display,
  phone_number: phone,
  phone_digits: phone?.replace(/\D/g, "") ?? null,
  created_at: now,
  updated_at: now,
});

for (const entry of STORES) {
  describe(`store (${entry.name})`, () => {
    const isPostgres = entry.name === "postgres";
    const dirs: string[] = [];
    const opened: Store[] = [];
    let url: string | undefined;
    let dir: string;
    /** The main store; `second` is another pool on the same database for PostgreSQL (a second node). */
    let store: Store;
    let second: Store;

    /** A new key, registered as a peer (everything that belongs to a peer needs one). */
    async function newPeer(st: Store = store): Promise<string> {
      const key = newKey();
      await st.transaction((tx) => tx.peers.register(peerRow(key, 1)));
      return key;
    }

    async function openAt(u: string | undefined, d: string): Promise<Store> {
      const s = await Store.open(u, d);
      opened.push(s);
      return s;
    }
    /** A store on a database of its own, for tests that look at whole tables. */
    async function openFresh(): Promise<Store> {
      const d = tempDir();
      dirs.push(d);
      return openAt(await entry.url(), d);
    }

    before(async () => {
      url = await entry.url();
      dir = tempDir();
      dirs.push(dir);
      store = await openAt(url, dir);
      second = isPostgres ? await openAt(url, dir) : store;
    });
    after(async () => {
      for (const s of opened) await s.close();
      for (const d of dirs) rmSync(d, { recursive: true, force: true });
    });

    test("a peer's voice agent: null (the default) when registered, then an agent id or off; false for an unknown key", async () => {
      const key = await newPeer();
      assert.equal(await store.read((r) => r.peers.voiceAgent(key)), null);
      assert.equal(await store.transaction((tx) => tx.peers.setVoiceAgent(key, "talker", 5)), true);
      assert.equal(await (second ?? store).read((r) => r.peers.voiceAgent(key)), "talker");
      assert.equal(await store.transaction((tx) => tx.peers.setVoiceAgent(key, "off", 6)), true);
      assert.equal(await store.read((r) => r.peers.voiceAgent(key)), "off");
      assert.equal((await store.read((r) => r.peers.get(key)))?.updated_at, 6);
      assert.equal(await store.transaction((tx) => tx.peers.setVoiceAgent(key, null, 7)), true);
      assert.equal(await store.read((r) => r.peers.voiceAgent(key)), null);
      const unknown = newKey();
      assert.equal(await store.transaction((tx) => tx.peers.setVoiceAgent(unknown, "off", 8)), false);
      assert.equal(await store.read((r) => r.peers.voiceAgent(unknown)), undefined);
    });

    test("a read while a write transaction is open sees only committed state (on SQLite's one connection it waits for the transaction's end)", async () => {
      const key = await newPeer();
      for (const outcome of ["rolled back", "committed"] as const) {
        let release!: () => void;
        const gate = new Promise<void>((r) => {
          release = r;
        });
        let wrote!: () => void;
        const written = new Promise<void>((r) => {
          wrote = r;
        });
        const writing = store.transaction(async (tx) => {
          await tx.status.put(key, { volume: outcome === "committed" ? 2 : 1 }, 1);
          wrote();
          await gate;
          if (outcome === "rolled back") throw new Error("rolled back");
        });
        await written;
        const during = store.read((r) => r.status.getText(key));
        release();
        await writing.catch(() => undefined);
        // Rolled back: never seen. Committed: seen whole, or (PostgreSQL, read before the commit) not yet.
        if (outcome === "rolled back") assert.equal(await during, undefined);
        else assert.ok([undefined, '{"volume":2}'].includes(await during));
      }
      assert.equal(await store.read((r) => r.status.getText(key)), '{"volume":2}');
    });

    test("migrations are idempotent: opening the same database again keeps its rows", async () => {
      const key = newKey();
      await store.transaction((tx) => tx.peers.register(peerRow(key, 5)));
      const again = await openAt(url, dir);
      assert.equal(again.dialect, entry.name);
      assert.deepEqual(plain(await again.read((r) => r.peers.get(key))), storedPeer(key, 5));
      await again.close();
      opened.splice(opened.indexOf(again), 1);
      const third = await openAt(url, dir);
      assert.deepEqual(plain(await third.read((r) => r.peers.get(key))), storedPeer(key, 5));
      await third.ping();
    });

    if (isPostgres) {
      test("two nodes opening a new database at once both migrate it", async () => {
        const u = await entry.url();
        const [a, b] = await Promise.all([openAt(u, dir), openAt(u, dir)]);
        const key = newKey();
        await a.transaction((tx) => tx.peers.register(peerRow(key, 1)));
        assert.deepEqual(plain(await b.read((r) => r.peers.get(key))), storedPeer(key, 1));
      });
    }

    describe("nonces", () => {
      test("a nonce is claimed once until it expires", async () => {
        const key = newKey();
        const now = 1_700_000_000_000;
        assert.equal(await store.transaction((tx) => tx.assertionNonces.claim(key, "n1", now + 60_000, now)), true);
        assert.equal(await store.transaction((tx) => tx.assertionNonces.claim(key, "n1", now + 60_000, now)), false);
        assert.equal(await store.transaction((tx) => tx.assertionNonces.claim(key, "n1", now + 120_000, now + 59_999)), false);
        // Another key, or the other nonce table, is a different nonce.
        assert.equal(await store.transaction((tx) => tx.assertionNonces.claim(newKey(), "n1", now + 60_000, now)), true);
        assert.equal(await store.transaction((tx) => tx.signalingNonces.claim(key, "n1", now + 60_000, now)), true);
        assert.equal(await store.transaction((tx) => tx.signalingNonces.claim(key, "n1", now + 60_000, now)), false);
        // Once its time has passed the row is taken over, with the new expiry.
        assert.equal(await store.transaction((tx) => tx.assertionNonces.claim(key, "n1", now + 120_000, now + 60_000)), true);
        assert.equal(await store.transaction((tx) => tx.assertionNonces.claim(key, "n1", now + 120_000, now + 60_000)), false);
        assert.equal(await store.transaction((tx) => tx.assertionNonces.claim(key, "n1", now + 180_000, now + 119_999)), false);
        assert.equal(await second.transaction((tx) => tx.assertionNonces.claim(key, "n1", now + 180_000, now + 119_999)), false);
      });

      test("30 concurrent claims of one nonce: exactly one wins", async () => {
        const key = newKey();
        const now = 1_700_000_000_000;
        const stores = isPostgres ? [store, second] : [store];
        const results = await Promise.all(
          Array.from({ length: 30 }, (_, i) => stores[i % stores.length]!.transaction((tx) => tx.assertionNonces.claim(key, "race", now + 60_000, now))),
        );
        assert.equal(results.filter(Boolean).length, 1);
        // The same for an expired row that everybody tries to take over.
        const later = now + 60_000;
        const again = await Promise.all(
          Array.from({ length: 30 }, (_, i) => stores[i % stores.length]!.transaction((tx) => tx.assertionNonces.claim(key, "race", later + 60_000, later))),
        );
        assert.equal(again.filter(Boolean).length, 1);
      });
    });

    describe("device tokens", () => {
      test("50 concurrent consumes of one token: exactly one gets the row", async () => {
        const target = await newPeer();
        const row = tokenRow({ target_key: target });
        await store.transaction((tx) => tx.deviceTokens.insert(row));
        assert.equal(await store.read((r) => r.deviceTokens.countUsable(target, 2_000)), 1);
        assert.deepEqual(plain(await store.read((r) => r.deviceTokens.findUsable(row.token_hash, 2_000))), row);
        const stores = isPostgres ? [store, second] : [store];
        const results = await Promise.all(
          Array.from({ length: 50 }, (_, i) => stores[i % stores.length]!.transaction((tx) => tx.deviceTokens.consume(row.token_hash, 2_000 + i))),
        );
        const won = results.filter((r) => r !== undefined);
        assert.equal(won.length, 1);
        const winner = won[0]!;
        assert.equal(winner.id, row.id);
        assert.equal(winner.target_key, target);
        assert.ok(winner.consumed_at !== null && winner.consumed_at >= 2_000 && winner.consumed_at < 2_050);
        assert.equal(await store.transaction((tx) => tx.deviceTokens.consume(row.token_hash, 3_000)), undefined);
        assert.equal(await store.read((r) => r.deviceTokens.findUsable(row.token_hash, 3_000)), undefined);
        assert.equal(await store.read((r) => r.deviceTokens.countUsable(target, 3_000)), 0);
      });

      test("expired tokens are neither usable nor consumable", async () => {
        const target = await newPeer();
        const row = tokenRow({ target_key: target, expires_at: 10_000 });
        await store.transaction((tx) => tx.deviceTokens.insert(row));
        assert.equal(await store.read((r) => r.deviceTokens.findUsable(row.token_hash, 10_000)), undefined);
        assert.equal(await store.transaction((tx) => tx.deviceTokens.consume(row.token_hash, 10_000)), undefined);
        assert.equal(await store.read((r) => r.deviceTokens.countUsable(target, 10_000)), 0);
        assert.equal(await store.read((r) => r.deviceTokens.countUsable(target, 9_999)), 1);
        assert.equal((await store.transaction((tx) => tx.deviceTokens.consume(row.token_hash, 9_999)))?.id, row.id);
        assert.equal(await store.transaction((tx) => tx.deviceTokens.consume("no-such-hash", 1_000)), undefined);
      });

      test("revoke: only the owner, only while unconsumed and unexpired", async () => {
        const owner = await newPeer();
        const other = await newPeer();
        const a = tokenRow({ target_key: owner });
        const consumed = tokenRow({ target_key: owner });
        const expired = tokenRow({ target_key: owner, expires_at: 5_000 });
        for (const r of [a, consumed, expired]) await store.transaction((tx) => tx.deviceTokens.insert(r));
        assert.ok(await store.transaction((tx) => tx.deviceTokens.consume(consumed.token_hash, 2_000)));

        assert.equal(await store.transaction((tx) => tx.deviceTokens.revoke(a.id, other, 2_000)), false);
        assert.ok(await store.read((r) => r.deviceTokens.findUsable(a.token_hash, 2_000)), "another device's revoke changed nothing");
        assert.equal(await store.transaction((tx) => tx.deviceTokens.revoke(consumed.id, owner, 2_000)), false);
        assert.equal(await store.transaction((tx) => tx.deviceTokens.revoke(expired.id, owner, 5_000)), false);
        assert.equal(await store.transaction((tx) => tx.deviceTokens.revoke("no-such-id", owner, 2_000)), false);
        assert.equal(await store.transaction((tx) => tx.deviceTokens.revoke(a.id, owner, 2_000)), true);
        assert.equal(await store.transaction((tx) => tx.deviceTokens.revoke(a.id, owner, 2_000)), false);
        assert.equal(await store.transaction((tx) => tx.deviceTokens.consume(a.token_hash, 2_000)), undefined);
        assert.equal(await store.read((r) => r.deviceTokens.countUsable(owner, 2_000)), 1); // `expired`, still before 5 000
        assert.equal(await countRows(store, "device_tokens", "target_key", owner), 2);
      });
    });

    describe("sessions", () => {
      const now = 1_000_000;
      const T = "target-device";
      const U = "other-device";
      const rows = [
        sessionRow({ id: "s1", public_key: "A", created_at: now - 5000, expires_at: now + 1000 }),
        sessionRow({ id: "s2", public_key: "C1", target_key: T, created_at: now - 4000 }),
        sessionRow({ id: "s5", public_key: "C4", target_key: T, created_at: now - 3000 }),
        sessionRow({ id: "s3", public_key: "C2", target_key: T, created_at: now - 3000 }),
        sessionRow({ id: "s4", public_key: "C3", target_key: U, created_at: now - 2000 }),
        sessionRow({ id: "s6", public_key: "B", created_at: now - 1000, revoked_at: now - 100 }),
        sessionRow({ id: "s7", public_key: "C1", target_key: T, created_at: now - 500, expires_at: now }),
        sessionRow({ id: "s8", public_key: "B", created_at: now - 6000, expires_at: now + 1 }),
      ];
      let s: Store;
      before(async () => {
        s = await openFresh();
        // Every session belongs to the device it acts on; controllers need not be peers.
        for (const key of [T, U, "A", "B"]) await s.transaction((tx) => tx.peers.register(peerRow(key, 1)));
        await s.transaction((tx) => tx.peers.register(peerRow("C1", 1, "blocked")));
        for (const r of rows) await s.transaction((tx) => tx.sessions.insert(r));
      });

      test("listLive: live only, newest first, ties by id; kind and target filters", async () => {
        const ids = (list: Tables["sessions"][]) => list.map((r) => r.id);
        assert.deepEqual(ids(await s.read((r) => r.sessions.listLive(now))), ["s4", "s3", "s5", "s2", "s1", "s8"]);
        assert.deepEqual(ids(await s.read((r) => r.sessions.listLive(now, { kind: "side_control" }))), ["s4", "s3", "s5", "s2"]);
        assert.deepEqual(ids(await s.read((r) => r.sessions.listLive(now, { kind: "primary" }))), ["s1", "s8"]);
        assert.deepEqual(ids(await s.read((r) => r.sessions.listLive(now, { kind: "side_control", targetKey: T }))), ["s3", "s5", "s2"]);
        assert.deepEqual(ids(await s.read((r) => r.sessions.listLive(now, { targetKey: U }))), ["s4"]);
        assert.deepEqual(ids(await s.read((r) => r.sessions.listLive(now + 1, { kind: "primary" }))), ["s1"]);
        assert.deepEqual(ids(await s.read((r) => r.sessions.listLive(now - 1, { targetKey: T }))), ["s7", "s3", "s5", "s2"]);
        assert.deepEqual(await s.read((r) => r.sessions.listLive(now, { targetKey: "nobody" })), []);
        assert.deepEqual(plain((await s.read((r) => r.sessions.listLive(now, { targetKey: U })))[0]), rows[4]);
        assert.equal(await s.read((r) => r.sessions.countLive(now)), 6);
        assert.equal(await s.read((r) => r.sessions.countLive(now - 1)), 7);
      });

      test("findByTokenHash joins the registration status of both peers", async () => {
        const found = await s.read((r) => r.sessions.findByTokenHash("hash-s2"));
        assert.deepEqual(plain(found), { ...rows[1], peer_status: "blocked", target_status: "active" });
        const primary = await s.read((r) => r.sessions.findByTokenHash("hash-s1"));
        assert.deepEqual(plain(primary), { ...rows[0], peer_status: "active", target_status: "active" });
        const unregisteredController = await s.read((r) => r.sessions.findByTokenHash("hash-s4"));
        assert.deepEqual(plain(unregisteredController), { ...rows[4], peer_status: null, target_status: "active" });
        assert.equal(await s.read((r) => r.sessions.findByTokenHash("hash-none")), undefined);
      });

      test("revoke with and without targetKey; countLive; deleteExpired", async () => {
        assert.equal(await s.transaction((tx) => tx.sessions.revoke("s2", now, U)), false, "wrong target");
        assert.equal(await s.transaction((tx) => tx.sessions.revoke("s1", now, "A")), false, "a primary session is never revoked through a target");
        assert.equal(await s.transaction((tx) => tx.sessions.revoke("s7", now, T)), false, "expired");
        assert.equal(await s.transaction((tx) => tx.sessions.revoke("s6", now)), false, "already revoked");
        assert.equal(await s.transaction((tx) => tx.sessions.revoke("nope", now)), false);
        assert.equal(await s.read((r) => r.sessions.countLive(now)), 6);

        assert.equal(await s.transaction((tx) => tx.sessions.revoke("s2", now, T)), true);
        assert.equal(await s.transaction((tx) => tx.sessions.revoke("s2", now, T)), false);
        assert.equal((await s.read((r) => r.sessions.findByTokenHash("hash-s2")))?.revoked_at, now);
        assert.equal(await s.transaction((tx) => tx.sessions.revoke("s1", now)), true);
        assert.equal(await s.transaction((tx) => tx.sessions.revoke("s4", now)), true, "without a target any live session can be revoked");
        assert.equal(await s.read((r) => r.sessions.countLive(now)), 3);
        assert.deepEqual(
          (await s.read((r) => r.sessions.listLive(now))).map((r) => r.id),
          ["s3", "s5", "s8"],
        );

        await s.transaction((tx) => tx.sessions.deleteExpired(now));
        assert.equal(await s.read((r) => r.sessions.findByTokenHash("hash-s7")), undefined);
        assert.ok(await s.read((r) => r.sessions.findByTokenHash("hash-s6")), "a revoked session stays until it expires");
        assert.ok(await s.read((r) => r.sessions.findByTokenHash("hash-s8")));
        assert.equal(await countAll(s, "sessions"), 7);
        await s.transaction((tx) => tx.sessions.deleteExpired(now + 1));
        assert.equal(await s.read((r) => r.sessions.findByTokenHash("hash-s8")), undefined);
        assert.equal(await countAll(s, "sessions"), 6);
        assert.equal(await s.read((r) => r.sessions.countLive(now + 1)), 2);
      });

      test("Store.deleteExpired drops expired nonces, sessions and device tokens", async () => {
        const t = 20_000_000;
        await s.transaction((tx) => tx.peers.register(peerRow("k", 1)));
        await s.transaction((tx) => tx.assertionNonces.claim("k", "old", t, t - 10));
        await s.transaction((tx) => tx.assertionNonces.claim("k", "new", t + 1, t - 10));
        await s.transaction((tx) => tx.signalingNonces.claim("k", "old", t, t - 10));
        await s.transaction((tx) => tx.deviceTokens.insert(tokenRow({ target_key: "k", expires_at: t })));
        await s.transaction((tx) => tx.deviceTokens.insert(tokenRow({ target_key: "k", expires_at: t + 1 })));
        await s.transaction((tx) => tx.sessions.insert(sessionRow({ id: "late", public_key: "k", expires_at: t + 1 })));
        await s.deleteExpired(t);
        assert.equal(await countAll(s, "assertion_nonces"), 1);
        assert.equal(await countAll(s, "signaling_nonces"), 0);
        assert.equal(await countAll(s, "device_tokens"), 1);
        assert.deepEqual(
          (await dbOf(s).selectFrom("sessions").select("id").execute()).map((r) => r.id),
          ["late"],
        );
        // The surviving nonce is still refused.
        assert.equal(await s.transaction((tx) => tx.assertionNonces.claim("k", "new", t + 1, t)), false);
      });
    });

    test("a throw inside store.transaction rolls every write back", async () => {
      const key = newKey();
      const boom = new Error("boom");
      const sessionId = newId("s");
      await assert.rejects(
        store.transaction(async (tx) => {
          await tx.peers.register(peerRow(key, 1));
          await tx.sessions.insert(sessionRow({ id: sessionId, public_key: key }));
          await tx.deviceTokens.insert(tokenRow({ target_key: key }));
          await tx.status.put(key, { volume: 3 }, 1);
          await tx.telemetry.insert(key, [{ field: "battery.percent", observedAt: 1, value: 1 }]);
          assert.equal(await tx.contacts.insert(contactRow(key, "a", "1")), true);
          assert.equal(await tx.assertionNonces.claim(key, "n", 10, 1), true);
          assert.ok(await tx.peers.get(key), "the transaction sees its own writes");
          assert.deepEqual(await tx.status.get(key), { volume: 3 });
          assert.equal((await tx.sessions.findByTokenHash(`hash-${sessionId}`))?.peer_status, "active");
          throw boom;
        }),
        (err) => err === boom,
      );
      assert.equal(await store.read((r) => r.peers.get(key)), undefined);
      for (const table of ["sessions", "peer_status", "telemetry_samples", "contacts", "assertion_nonces"] as const) {
        assert.equal(await countRows(store, table, "public_key", key), 0, table);
      }
      assert.equal(await countRows(store, "device_tokens", "target_key", key), 0);
      assert.equal(await store.transaction((tx) => tx.assertionNonces.claim(key, "n", 10, 1)), true, "the nonce was not kept");

      // A transaction that returns commits, and hands back its value.
      const value = await store.transaction(async (tx) => {
        await tx.peers.register(peerRow(key, 2));
        await tx.status.put(key, { volume: 4 }, 2);
        return 42;
      });
      assert.equal(value, 42);
      assert.deepEqual(plain(await store.read((r) => r.peers.get(key))), storedPeer(key, 2));
      assert.deepEqual(await store.read((r) => r.status.get(key)), { volume: 4 });
    });

    test("concurrent transactions (one shared commit on SQLite): each failing one rolls back alone", async () => {
      const keys = Array.from({ length: 20 }, () => newKey());
      const outcomes = await Promise.allSettled(
        keys.map((key, i) =>
          store.transaction(async (tx) => {
            await tx.peers.register(peerRow(key, i));
            await tx.status.put(key, { volume: i }, i);
            if (i % 3 === 0) throw new Error(`unit ${i} fails`);
            return i;
          }),
        ),
      );
      for (const [i, key] of keys.entries()) {
        const outcome = outcomes[i]!;
        if (i % 3 === 0) {
          assert.equal(outcome.status, "rejected");
          assert.equal((outcome as PromiseRejectedResult).reason.message, `unit ${i} fails`);
          assert.equal(await store.read((r) => r.peers.get(key)), undefined, `unit ${i} wrote nothing`);
          assert.equal(await store.read((r) => r.status.get(key)), undefined);
        } else {
          assert.deepEqual(outcome, { status: "fulfilled", value: i });
          assert.deepEqual(plain(await store.read((r) => r.peers.get(key))), storedPeer(key, i));
          assert.deepEqual(await store.read((r) => r.status.get(key)), { volume: i });
        }
      }
    });

    describe("telemetry", () => {
      const F = "battery.percent";
      const T0 = 1_700_000_000_000;
      const start = T0 + 1_234;
      const bucket = 7_000;
      const end = start + 20 * bucket + 3_456; // a last, partial bucket
      const gap = [start + 3 * bucket, start + 5 * bucket]; // buckets 3 and 4 hold no sample
      let key: string;
      const samples: Sample[] = [];
      before(async () => {
        key = await newPeer();
        const noisy = await newPeer();
        const random = rng(20240607);
        const times = new Set<number>([start - 1, start, start + 1, end - 1, end, end + 1]);
        while (times.size < 3_000) {
          const t = start - 5_000 + Math.floor(random() * (end - start + 10_000));
          if (t >= gap[0]! && t < gap[1]!) continue;
          times.add(t);
        }
        for (const t of times) samples.push({ field: F, observedAt: t, value: Math.round((random() * 200 - 50) * 1000) / 1000 });
        // Shuffled on insert: the store orders by time, not by arrival.
        const shuffled = [...samples].sort(() => random() - 0.5);
        await store.transaction((tx) => tx.telemetry.insert(key, shuffled));
        // Noise that no query for (key, F) may see: another field, another peer, same times.
        await store.transaction((tx) =>
          tx.telemetry.insert(
            key,
            samples.slice(0, 500).map((s) => ({ ...s, field: "system.temperature_c", value: 1e6 })),
          ),
        );
        await store.transaction((tx) =>
          tx.telemetry.insert(
            noisy,
            samples.slice(0, 500).map((s) => ({ ...s, value: -1e6 })),
          ),
        );
      });

      const inWindow = (s0 = start, e0 = end) => samples.filter((s) => s.observedAt >= s0 && s.observedAt < e0).sort((a, b) => a.observedAt - b.observedAt);
      const points = (list: Sample[]): Point[] => list.map((s) => ({ t: s.observedAt, value: s.value }));

      test("insert replaces a sample of the same field and millisecond", async () => {
        const k = await newPeer();
        await store.transaction((tx) =>
          tx.telemetry.insert(k, [
            { field: F, observedAt: 100, value: 1 },
            { field: F, observedAt: 101, value: 2 },
          ]),
        );
        await store.transaction((tx) => tx.telemetry.insert(k, [{ field: F, observedAt: 100, value: 3 }]));
        assert.deepEqual(await store.read((r) => r.telemetry.range({ publicKey: k, field: F, start: 0, end: 1_000, order: "asc", limit: 10 })), [
          { t: 100, value: 3 },
          { t: 101, value: 2 },
        ]);
        // Twice in one batch: the later one wins.
        await store.transaction((tx) =>
          tx.telemetry.insert(k, [
            { field: F, observedAt: 200, value: 4 },
            { field: F, observedAt: 200, value: 5 },
            { field: "gnss.latitude", observedAt: 200, value: 6 },
          ]),
        );
        assert.deepEqual(await store.read((r) => r.telemetry.range({ publicKey: k, field: F, start: 150, end: 1_000, order: "asc", limit: 10 })), [
          { t: 200, value: 5 },
        ]);
        assert.equal(await countRows(store, "telemetry_samples", "public_key", k), 4);
        await store.transaction((tx) => tx.telemetry.insert(k, []));
      });

      test("latest: the newest sample of each requested field that has data", async () => {
        const latest = await store.read((r) => r.telemetry.latest(key, [F, "gnss.latitude", "system.temperature_c"]));
        const newest = samples.reduce((a, b) => (b.observedAt > a.observedAt ? b : a));
        const newestTemp = samples.slice(0, 500).reduce((a, b) => (b.observedAt > a.observedAt ? b : a));
        assert.deepEqual(latest, [
          { field: F, observedAt: newest.observedAt, value: newest.value },
          { field: "system.temperature_c", observedAt: newestTemp.observedAt, value: 1e6 },
        ]);
        assert.deepEqual(await store.read((r) => r.telemetry.latest(newKey(), [F])), []);
        assert.deepEqual(await store.read((r) => r.telemetry.latest(key, [])), []);
      });

      test("range: [start, end), asc and desc, limit", async () => {
        const all = inWindow();
        assert.equal(all[0]!.observedAt, start);
        assert.equal(all.at(-1)!.observedAt, end - 1);
        const q = { publicKey: key, field: F, start, end };
        assert.deepEqual(await store.read((r) => r.telemetry.range({ ...q, order: "asc", limit: 100_000 })), points(all));
        assert.deepEqual(await store.read((r) => r.telemetry.range({ ...q, order: "asc", limit: 50 })), points(all.slice(0, 50)));
        assert.deepEqual(await store.read((r) => r.telemetry.range({ ...q, order: "desc", limit: 50 })), points(all.slice(-50).reverse()));
        assert.deepEqual(await store.read((r) => r.telemetry.range({ ...q, start: end - 1, order: "asc", limit: 10 })), [
          { t: end - 1, value: all.at(-1)!.value },
        ]);
        assert.deepEqual(await store.read((r) => r.telemetry.range({ ...q, start: gap[0]!, end: gap[1]!, order: "asc", limit: 10 })), []);
        assert.deepEqual(await store.read((r) => r.telemetry.range({ ...q, field: "gnss.latitude", order: "asc", limit: 10 })), []);
      });

      test("lastPerStep: the last sample of each step, asc and desc, limit", async () => {
        const step = 5_000;
        const byStep = new Map<number, Sample>();
        for (const s of inWindow()) byStep.set(Math.floor((s.observedAt - start) / step), s); // ascending, so the last one stays
        const expected = points([...byStep.values()]);
        const q = { publicKey: key, field: F, start, end, step };
        assert.deepEqual(await store.read((r) => r.telemetry.lastPerStep({ ...q, order: "asc", limit: 1000 })), expected);
        assert.deepEqual(await store.read((r) => r.telemetry.lastPerStep({ ...q, order: "asc", limit: 5 })), expected.slice(0, 5));
        assert.deepEqual(await store.read((r) => r.telemetry.lastPerStep({ ...q, order: "desc", limit: 5 })), expected.slice(-5).reverse());
        // One step as wide as the window: the last sample before end.
        assert.deepEqual(await store.read((r) => r.telemetry.lastPerStep({ ...q, step: end - start, order: "asc", limit: 10 })), [expected.at(-1)]);
      });

      test("aggregate: all six functions against a reference, empty buckets omitted", async () => {
        const buckets = new Map<number, number[]>();
        for (const s of inWindow()) {
          const b = start + Math.floor((s.observedAt - start) / bucket) * bucket;
          buckets.set(b, [...(buckets.get(b) ?? []), s.value]);
        }
        assert.equal(buckets.size, 19, "21 buckets, two of them empty");
        const reference: Record<AggregateFunction, (v: number[]) => number> = {
          avg: (v) => v.reduce((a, b) => a + b, 0) / v.length,
          min: (v) => Math.min(...v),
          max: (v) => Math.max(...v),
          sum: (v) => v.reduce((a, b) => a + b, 0),
          count: (v) => v.length,
          last: (v) => v.at(-1)!,
        };
        for (const fn of Object.keys(reference) as AggregateFunction[]) {
          const got = await store.read((r) => r.telemetry.aggregate({ publicKey: key, field: F, start, end, bucket, fn }));
          const want = [...buckets].map(([t, v]) => ({ t, value: reference[fn](v) }));
          assert.deepEqual(
            got.map((p) => p.t),
            want.map((p) => p.t),
            fn,
          );
          for (let i = 0; i < want.length; i++) {
            const [g, w] = [got[i]!.value, want[i]!.value];
            if (fn === "avg" || fn === "sum") assert.ok(Math.abs(g - w) <= 1e-9 * Math.max(1, Math.abs(w)), `${fn} bucket ${i}: ${g} vs ${w}`);
            else assert.equal(g, w, `${fn} bucket ${i}`);
          }
        }
      });

      test("aggregate over whole minutes (rollups) matches the samples, after replacements and retention", async () => {
        const st = await openFresh(); // retention deletes across every series
        const k = await newPeer(st);
        const random = rng(77);
        const t0 = T0 + 17_321; // not on a minute
        const byTime = new Map<number, number>();
        const write = async (n: number) => {
          const batch: Sample[] = [];
          for (let j = 0; j < n; j++) {
            const t = t0 + Math.floor(random() * 30 * 60_000);
            const value = Math.round(random() * 1000) / 10;
            batch.push({ field: F, observedAt: t, value });
            byTime.set(t, value);
          }
          await st.transaction((tx) => tx.telemetry.insert(k, batch));
        };
        await write(1500);
        await write(300); // some land on existing milliseconds and replace their values
        const check = async (label: string) => {
          const start = t0 - 45_000;
          const end = t0 + 31 * 60_000 + 1_234;
          const width = 7 * 60_000 + 12_345;
          const reference: Record<Exclude<AggregateFunction, "last">, (v: number[]) => number> = {
            avg: (v) => v.reduce((a, b) => a + b, 0) / v.length,
            sum: (v) => v.reduce((a, b) => a + b, 0),
            count: (v) => v.length,
            min: (v) => Math.min(...v),
            max: (v) => Math.max(...v),
          };
          const buckets = new Map<number, number[]>();
          for (const [t, v] of [...byTime].sort((a, b) => a[0] - b[0])) {
            if (t < start || t >= end) continue;
            const b = start + Math.floor((t - start) / width) * width;
            buckets.set(b, [...(buckets.get(b) ?? []), v]);
          }
          for (const fn of Object.keys(reference) as Array<keyof typeof reference>) {
            const got = await st.read((r) => r.telemetry.aggregate({ publicKey: k, field: F, start, end, bucket: width, fn }));
            const want = [...buckets].map(([t, v]) => ({ t, value: reference[fn](v) }));
            assert.deepEqual(
              got.map((p) => p.t),
              want.map((p) => p.t),
              `${label} ${fn}`,
            );
            for (const [i, w] of want.entries())
              assert.ok(Math.abs(got[i]!.value - w.value) <= 1e-9 * Math.max(1, Math.abs(w.value)), `${label} ${fn} bucket ${i}`);
          }
        };
        await check("after inserts");
        const cutoff = t0 + 11 * 60_000 + 29_999; // not on a minute
        await st.deleteExpired(0, cutoff, 37);
        for (const t of [...byTime.keys()]) if (t < cutoff) byTime.delete(t);
        assert.equal(await countRows(st, "telemetry_samples", "public_key", k), byTime.size);
        await check("after retention");
      });

      test("a window that starts before 1970 reads its whole minutes from the rollups, not the samples", async () => {
        const k = await newPeer();
        const early = [-90_001, -60_000, -1].map((t, i) => ({ field: F, observedAt: t, value: i + 1 }));
        const late = Array.from({ length: 600 }, (_, i) => ({ field: F, observedAt: 120_000 + i * 1_000, value: 10 }));
        await store.transaction((tx) => tx.telemetry.insert(k, [...early, ...late]));
        const q = { publicKey: k, field: F, start: -120_000, end: 60 * 60_000, bucket: 30 * 60_000 };
        const want = { sum: 6 + 10 * 600, count: 603, min: 1, max: 10, avg: (6 + 6000) / 603 };
        // The samples of whole minutes go, their rollups stay: a query that still counts them did not read them.
        const series = (await dbOf(store).selectFrom("telemetry_series").select("id").where("public_key", "=", k).executeTakeFirstOrThrow()).id;
        await dbOf(store).deleteFrom("telemetry_samples").where("series_id", "=", series).where("observed_at", ">=", 120_000).execute();
        for (const fn of ["sum", "count", "min", "max", "avg"] as const) {
          const got = await store.read((r) => r.telemetry.aggregate({ ...q, fn }));
          assert.deepEqual(got, [{ t: q.start, value: want[fn] }], fn);
        }
      });

      test("aggregate window boundaries are exact: [start, end)", async () => {
        const k = await newPeer();
        await store.transaction((tx) =>
          tx.telemetry.insert(k, [
            { field: F, observedAt: 999, value: 1000 },
            { field: F, observedAt: 1000, value: 1 },
            { field: F, observedAt: 1009, value: 2 },
            { field: F, observedAt: 1010, value: 4 },
            { field: F, observedAt: 1019, value: 8 },
            { field: F, observedAt: 1020, value: 16 },
          ]),
        );
        const q = { publicKey: k, field: F, start: 1000, end: 1020, bucket: 10 };
        assert.deepEqual(await store.read((r) => r.telemetry.aggregate({ ...q, fn: "sum" })), [
          { t: 1000, value: 3 },
          { t: 1010, value: 12 },
        ]);
        assert.deepEqual(await store.read((r) => r.telemetry.aggregate({ ...q, fn: "last" })), [
          { t: 1000, value: 2 },
          { t: 1010, value: 8 },
        ]);
        assert.deepEqual(await store.read((r) => r.telemetry.aggregate({ ...q, fn: "count", start: 1001, end: 1019, bucket: 100 })), [{ t: 1001, value: 2 }]);
        assert.deepEqual(await store.read((r) => r.telemetry.aggregate({ ...q, fn: "avg", start: 1009, end: 1011, bucket: 1 })), [
          { t: 1009, value: 2 },
          { t: 1010, value: 4 },
        ]);
        assert.deepEqual(await store.read((r) => r.telemetry.aggregate({ ...q, fn: "max", start: 0, end: 999 })), []);
      });
    });

    describe("contacts", () => {
      test("names and phone digits are unique per device; other devices are separate", async () => {
        const dev = await newPeer();
        const other = await newPeer();
        assert.equal(await store.transaction((tx) => tx.contacts.insert(contactRow(dev, "alice", "+1 (555) 123-4567"))), true);
        assert.equal(await store.transaction((tx) => tx.contacts.insert(contactRow(dev, "alice", "999", 2))), false, "same name");
        assert.equal(await store.transaction((tx) => tx.contacts.insert(contactRow(dev, "bob", "15551234567", 2))), false, "same digits");
        assert.equal(await store.transaction((tx) => tx.contacts.insert(contactRow(other, "alice", "1-555-123-4567"))), true, "another device");
        assert.equal(await store.transaction((tx) => tx.contacts.insert(contactRow(dev, "bob", "555 0000"))), true);
        // Contacts without a phone number do not collide with each other.
        assert.equal(await store.transaction((tx) => tx.contacts.insert(contactRow(dev, "carol", null))), true);
        assert.equal(await store.transaction((tx) => tx.contacts.insert(contactRow(dev, "dave", null))), true);
        assert.deepEqual(plain(await store.read((r) => r.contacts.get(dev, "alice"))), contactRow(dev, "alice", "+1 (555) 123-4567"));
        assert.equal(await store.read((r) => r.contacts.get(dev, "nobody")), undefined);

        // Changing bob's number to alice's is a conflict and changes nothing.
        const bob = (await store.read((r) => r.contacts.get(dev, "bob")))!;
        assert.equal(await store.transaction((tx) => tx.contacts.update({ ...contactRow(dev, "bob", "15551234567"), updated_at: 9 })), "conflict");
        assert.deepEqual(await store.read((r) => r.contacts.get(dev, "bob")), bob);
        // A number in use on another device is fine; so is clearing it.
        assert.equal(await store.transaction((tx) => tx.contacts.update({ ...contactRow(dev, "carol", "555-0000", 1, "Carol") })), "conflict");
        assert.equal(await store.transaction((tx) => tx.contacts.update({ ...contactRow(dev, "carol", "1 555 123 4567", 1, "Carol") })), "conflict");
        assert.equal(await store.transaction((tx) => tx.contacts.update({ ...contactRow(other, "alice", "555 0000", 1_000, "A"), updated_at: 7 })), "updated");
        assert.deepEqual(plain(await store.read((r) => r.contacts.get(other, "alice"))), {
          ...contactRow(other, "alice", "555 0000", 1_000, "A"),
          updated_at: 7,
        });
        assert.equal(await store.transaction((tx) => tx.contacts.update({ ...contactRow(dev, "bob", null, 1, "Bob"), updated_at: 8 })), "updated");
        assert.equal(await store.transaction((tx) => tx.contacts.insert(contactRow(dev, "erin", "5550000"))), true, "bob's old number is free");
        assert.equal(await store.transaction((tx) => tx.contacts.update(contactRow(dev, "zed", "1"))), "missing");

        assert.deepEqual(plain(await store.transaction((tx) => tx.contacts.delete(dev, "erin"))), contactRow(dev, "erin", "5550000"));
        assert.equal(await store.transaction((tx) => tx.contacts.delete(dev, "erin")), undefined);
      });

      test("list pages by name with afterName", async () => {
        const dev = await newPeer();
        const names = ["mango", "apple", "kiwi", "banana", "cherry", "date", "fig", "grape", "lemon", "lime"];
        for (const [i, n] of names.entries()) assert.equal(await store.transaction((tx) => tx.contacts.insert(contactRow(dev, n, `${i}`))), true);
        const another = await newPeer();
        await store.transaction((tx) => tx.contacts.insert(contactRow(another, "aaa", "1")));
        const sorted = [...names].sort();
        const pages: string[][] = [];
        let after: string | undefined;
        for (;;) {
          const page = await store.read((r) => r.contacts.list(dev, after, 3));
          if (page.length === 0) break;
          assert.ok(page.length <= 3);
          pages.push(page.map((r) => r.name));
          after = page.at(-1)!.name;
        }
        assert.deepEqual(pages, [sorted.slice(0, 3), sorted.slice(3, 6), sorted.slice(6, 9), sorted.slice(9)]);
        assert.deepEqual(
          (await store.read((r) => r.contacts.list(dev, "c", 100))).map((r) => r.name),
          sorted.filter((n) => n > "c"),
        );
        assert.deepEqual(await store.read((r) => r.contacts.list(dev, "zzz", 10)), []);
        assert.deepEqual(await store.read((r) => r.contacts.list(newKey(), undefined, 10)), []);

        // Mixed case and non-ASCII: whatever the collation, paging visits every name once, in list order.
        const mixed = await newPeer();
        const odd = ["Zoe", "zoe", "Émile", "emile", "a b", "a-b", "ab", "Ab", "ß", "ss", "1", "~"];
        for (const n of odd) assert.equal(await store.transaction((tx) => tx.contacts.insert(contactRow(mixed, n, null))), true, n);
        const full = (await store.read((r) => r.contacts.list(mixed, undefined, 100))).map((r) => r.name);
        assert.deepEqual([...full].sort(), [...odd].sort());
        const paged: string[] = [];
        after = undefined;
        for (;;) {
          const page = await store.read((r) => r.contacts.list(mixed, after, 5));
          if (page.length === 0) break;
          paged.push(...page.map((r) => r.name));
          after = page.at(-1)!.name;
        }
        assert.deepEqual(paged, full);
      });
    });

    test("peers.remove deletes everything of the peer (foreign keys cascade) and nothing else", async () => {
      const P = newKey();
      const Q = newKey();
      const now = 50_000;
      const seed = async (me: string, peer: string) => {
        await store.transaction((tx) => tx.peers.register(peerRow(me, now)));
        await store.transaction((tx) => tx.sessions.insert(sessionRow({ id: newId("s"), public_key: me }))); // primary
        await store.transaction((tx) => tx.sessions.insert(sessionRow({ id: newId("s"), public_key: peer, target_key: me }))); // peer controls me
        await store.transaction((tx) => tx.deviceTokens.insert(tokenRow({ target_key: me })));
        await store.transaction((tx) => tx.status.put(me, { volume: 1 }, now));
        await store.transaction((tx) =>
          tx.runtime.put({
            public_key: me,
            online: 1,
            last_seen_at: now,
            last_addr: "127.0.0.1:1",
            rx_bytes: 1,
            tx_bytes: 2,
            node: "n1",
            updated_at: now,
          }),
        );
        await store.transaction((tx) =>
          tx.telemetry.insert(me, [
            { field: "battery.percent", observedAt: now, value: 1 },
            { field: "gnss.latitude", observedAt: now, value: 2 },
          ]),
        );
        await store.transaction((tx) => tx.contacts.insert(contactRow(me, "x", "123")));
      };
      await seed(P, Q);
      await seed(Q, P);
      // A session from P (as controller) to a third device survives nowhere either.
      const R = await newPeer();
      await store.transaction((tx) => tx.sessions.insert(sessionRow({ id: newId("s"), public_key: P, target_key: R })));

      assert.equal(await countRows(store, "sessions", "public_key", Q), 2);
      assert.equal(await countRows(store, "sessions", "target_key", Q), 2, "its primary session acts on itself");

      assert.equal(await store.transaction((tx) => tx.peers.remove(P)), true);
      assert.equal(await store.read((r) => r.peers.get(P)), undefined);
      for (const table of ["sessions", "peer_status", "peer_runtime", "telemetry_samples", "contacts"] as const) {
        assert.equal(await countRows(store, table, "public_key", P), 0, table);
      }
      assert.equal(await countRows(store, "sessions", "target_key", P), 0);
      assert.equal(await countRows(store, "device_tokens", "target_key", P), 0);
      assert.equal(await countRows(store, "sessions", "target_key", R), 0);
      assert.equal(await store.read((r) => r.status.get(P)), undefined);
      assert.equal(await store.read((r) => r.runtime.get(P)), undefined);
      assert.deepEqual(await store.read((r) => r.telemetry.latest(P, ["battery.percent"])), []);

      // Q keeps everything except the sessions between it and P.
      assert.ok(await store.read((r) => r.peers.get(Q)));
      assert.equal(await countRows(store, "sessions", "public_key", Q), 1);
      assert.equal(await countRows(store, "sessions", "target_key", Q), 1);
      assert.equal(await countRows(store, "device_tokens", "target_key", Q), 1);
      for (const table of ["peer_status", "peer_runtime", "contacts"] as const) {
        assert.equal(await countRows(store, table, "public_key", Q), 1, table);
      }
      assert.equal(await countRows(store, "telemetry_samples", "public_key", Q), 2);

      assert.equal(await store.transaction((tx) => tx.peers.remove(P)), false);
      assert.equal(await store.transaction((tx) => tx.peers.remove(newKey())), false);
    });

    describe("store use", () => {
      const nested = /store\.(read|transaction|ping)\(\) called inside a transaction/;

      test("read, transaction and ping inside a transaction fail at once; the transaction goes on", { timeout: 10_000 }, async () => {
        const key = await newPeer();
        await store.transaction(async (tx) => {
          await assert.rejects(
            store.read((r) => r.peers.get(key)),
            nested,
          );
          await assert.rejects(
            store.transaction((t) => t.peers.get(key)),
            nested,
          );
          await assert.rejects(store.ping(), nested);
          // Also from code the callback awaits later on.
          await new Promise((resolve) => setImmediate(resolve));
          await assert.rejects(
            store.read((r) => r.status.get(key)),
            nested,
          );
          await tx.status.put(key, { volume: 9 }, 1);
        });
        assert.deepEqual(await store.read((r) => r.status.get(key)), { volume: 9 });
        // Outside a transaction, reads may nest in reads, and transactions may start from a read.
        assert.ok(await store.read(async () => store.read((r) => r.peers.get(key))));
        assert.equal(await store.read(async () => store.transaction(async () => 7)), 7);
      });

      test("compiled(): values bound out of argument order are refused when the query is built", async () => {
        const db = dbOf(store);
        const key = await newPeer();
        const swapped = compiled(
          (d, publicKey: string, createdAt: number) =>
            d.selectFrom("peers").select("public_key").where("created_at", "=", createdAt).where("public_key", "=", publicKey),
          "",
          0,
        );
        await assert.rejects(swapped(db, store.dialect, key, 1), /compiled query: its parameters must be its values, each bound once and in argument order/);
        const twice = compiled(
          (d, publicKey: string) => d.selectFrom("peers").select("public_key").where("public_key", "=", publicKey).where("role", "=", publicKey),
          "",
        );
        await assert.rejects(twice(db, store.dialect, key), /each bound once and in argument order/);
        const sameType = compiled(
          (d, a: string, b: string) => d.selectFrom("peers").select("public_key").where("role", "=", b).where("public_key", "=", a),
          "",
          "",
        );
        await assert.rejects(sameType(db, store.dialect, key, "client"), /in argument order/);
        // In order, with a nullable slot shaped by its non-null type: built and run.
        const inOrder = compiled(
          (d, publicKey: string, role: string | null, createdAt: number) =>
            d.selectFrom("peers").select("public_key").where("public_key", "=", publicKey).where("role", "=", role).where("created_at", "=", createdAt),
          "",
          "" as string | null,
          0,
        );
        assert.deepEqual(
          (await inOrder(db, store.dialect, key, "client", 1)).map((r) => r.public_key),
          [key],
        );
      });

      test("0002 on a database created at 0001: rows kept, orphans dropped, removing a peer cascades", async () => {
        const d = tempDir();
        dirs.push(d);
        const u = await entry.url();
        const old = connect(u, d);
        const migrated = await new Migrator({ db: old.db, provider: migrationProvider(old.dialect) }).migrateTo("0001_initial");
        assert.equal(migrated.error, undefined);
        const db = old.db as unknown as Kysely<any>;
        const [P, Q, O, C] = [newKey(), newKey(), newKey(), newKey()]; // O: an orphan's key; C: a controller, not a peer
        await db
          .insertInto("peers")
          .values([peerRow(P, 1), peerRow(Q, 2)])
          .execute();
        const session = (id: string, public_key: string, target_key: string | null) => ({
          id,
          token_hash: `h-${id}`,
          kind: target_key ? "side_control" : "primary",
          public_key,
          target_key,
          created_at: 5,
          expires_at: 10_000,
          revoked_at: null,
        });
        await db
          .insertInto("sessions")
          .values([session("p", P, null), session("cp", C, P), session("pq", P, Q), session("o", O, null), session("co", C, O)])
          .execute();
        await db
          .insertInto("device_tokens")
          .values([
            { id: "tp", token_hash: "th-p", target_key: P, created_at: 1, expires_at: 9, consumed_at: null },
            { id: "to", token_hash: "th-o", target_key: O, created_at: 1, expires_at: 9, consumed_at: null },
          ])
          .execute();
        await db
          .insertInto("peer_status")
          .values([
            { public_key: P, document: '{"volume":5}', updated_at: 3 },
            { public_key: O, document: "{}", updated_at: 3 },
          ])
          .execute();
        await db
          .insertInto("peer_runtime")
          .values({ public_key: P, online: 1, last_seen_at: 4, last_addr: "a:1", rx_bytes: 1, tx_bytes: 2, node: "n", updated_at: 4 })
          .execute();
        await db
          .insertInto("contacts")
          .values([contactRow(P, "mom", "123"), contactRow(P, "dad", null), contactRow(O, "x", "9")])
          .execute();
        const sample = (public_key: string, field: string, observed_at: number, value: number) => ({ public_key, field, observed_at, value });
        await db
          .insertInto("telemetry_samples")
          .values([
            sample(P, "battery.percent", 100, 1),
            sample(P, "battery.percent", 200, 2),
            sample(P, "battery.percent", 300, 3),
            sample(P, "gnss.latitude", 150, 45.5),
            sample(Q, "battery.percent", 100, 7),
            sample(O, "battery.percent", 100, 9),
          ])
          .execute();
        await old.close();

        const st = await openAt(u, d);
        const ids = async () => (await dbOf(st).selectFrom("sessions").select(["id", "target_key"]).orderBy("id").execute()).map((r) => [r.id, r.target_key]);
        assert.deepEqual(await ids(), [
          ["cp", P],
          ["p", P],
          ["pq", Q],
        ]);
        assert.equal((await st.read((r) => r.sessions.findByTokenHash("h-p")))?.target_key, P, "a primary session acts on its own peer");
        assert.equal(await countAll(st, "device_tokens"), 1);
        assert.deepEqual(await st.read((r) => r.status.get(P)), { volume: 5 });
        assert.equal(await st.read((r) => r.status.get(O)), undefined);
        assert.equal((await st.read((r) => r.runtime.get(P)))?.last_addr, "a:1");
        assert.deepEqual(
          (await st.read((r) => r.contacts.list(P, undefined, 10))).map((c) => c.name),
          ["dad", "mom"],
        );
        assert.equal(await countAll(st, "contacts"), 2);
        assert.deepEqual(await st.read((r) => r.telemetry.range({ publicKey: P, field: "battery.percent", start: 0, end: 1_000, order: "asc", limit: 10 })), [
          { t: 100, value: 1 },
          { t: 200, value: 2 },
          { t: 300, value: 3 },
        ]);
        assert.deepEqual(await st.read((r) => r.telemetry.latest(P, ["gnss.latitude", "battery.percent"])), [
          { field: "gnss.latitude", observedAt: 150, value: 45.5 },
          { field: "battery.percent", observedAt: 300, value: 3 },
        ]);
        assert.equal(await countAll(st, "telemetry_samples"), 5, "the orphan's sample is gone");
        assert.equal(await countAll(st, "telemetry_series"), 3);

        assert.equal(await st.transaction((tx) => tx.peers.remove(P)), true);
        assert.deepEqual(await ids(), [], "P's own sessions, those acting on it, and its sessions as a controller");
        for (const table of ["device_tokens", "peer_status", "peer_runtime", "contacts"] as const) assert.equal(await countAll(st, table), 0, table);
        assert.equal(await countAll(st, "telemetry_series"), 1);
        assert.deepEqual(await st.read((r) => r.telemetry.latest(Q, ["battery.percent"])), [{ field: "battery.percent", observedAt: 100, value: 7 }]);
        if (!isPostgres) {
          const { rows } = await sql<{ foreign_keys: number }>`pragma foreign_keys`.execute(dbOf(st));
          assert.equal(rows[0]?.foreign_keys, 1);
        }
      });
    });

    describe("conversations", () => {
      const entry = (at: number, text = `at ${at}`) => ({ turn: 1, role: "user", text, at, interrupted: 0, tool_name: null, tool_is_error: null });
      const open = async (st: Store, key: string) =>
        (await st.read((r) => r.conversations.list(key, undefined, 100))).filter((c) => c.ended_at === null).map((c) => c.id);

      test("first entries of several conversations of one device racing on every node: only the newest stays open", async () => {
        for (let round = 0; round < 5; round++) {
          const key = await newPeer();
          const ids = Array.from({ length: 6 }, (_, i) => ({ id: newId(`c${i}`), startedAt: 1_000 + i }));
          await Promise.all(
            ids.map((c, i) => (i % 2 ? second : store).transaction((tx) => tx.conversations.append({ ...c, publicKey: key }, entry(c.startedAt)))),
          );
          assert.deepEqual(await open(store, key), [ids.at(-1)!.id], `round ${round}`);
        }
      });

      test("an older conversation's entries after a newer one began move its end on; its close records the real end", async () => {
        const key = await newPeer();
        const old = { id: newId("old"), publicKey: key, startedAt: 1_000 };
        const next = { id: newId("new"), publicKey: key, startedAt: 2_000 };
        await store.transaction((tx) => tx.conversations.append(old, entry(1_500)));
        await store.transaction((tx) => tx.conversations.append(next, entry(2_000)));
        const read = async (id: string) => plain(await store.read((r) => r.conversations.get(key, id)))!;
        assert.equal((await read(old.id)).ended_at, 1_500, "ended at its last entry");
        await second.transaction((tx) => tx.conversations.append(old, entry(2_100, "late")));
        assert.deepEqual([(await read(old.id)).ended_at, (await read(old.id)).last_at], [2_100, 2_100]);
        await store.transaction((tx) => tx.conversations.end(old.id, 2_300));
        assert.equal((await read(old.id)).ended_at, 2_300);
        // A late first entry of a conversation older than the open one ends itself, not the newer one.
        const stale = { id: newId("stale"), publicKey: key, startedAt: 1_200 };
        await second.transaction((tx) => tx.conversations.append(stale, entry(2_400)));
        assert.deepEqual(await open(store, key), [next.id]);
        assert.equal((await read(stale.id)).ended_at, 2_400);
      });
    });
  });
}
