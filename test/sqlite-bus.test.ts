import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { after, before, describe, test } from "node:test";
import { type BusMessage, InProcessBus, SqliteBus, topics } from "../src/bus/index.ts";
import { loadConfig } from "../src/config/config.ts";
import { encodeKey, generateKeyPair, privateKeyObject } from "../src/crypto/keys.ts";
import { DomainEvents } from "../src/domain/changes.ts";
import { systemClock } from "../src/domain/clock.ts";
import { Domain } from "../src/domain/index.ts";
import { Store } from "../src/store/index.ts";
import { PeerWatch } from "../src/transport/peer-watch.ts";
import { tempDir } from "./support/server.ts";
import { eventually } from "./support/webrtc.ts";

/**
 * The node's bus on SQLite delivers what another process wrote to `bus_messages` (the command line
 * sharing the file): each message once, in order, never its own, never those written before it
 * started; a row it cannot read is skipped, not replayed forever.
 */
describe("SqliteBus: other processes' messages through the file", () => {
  const dir = tempDir();
  let node: Store;
  let other: Store;
  let bus: SqliteBus;
  const got: BusMessage[] = [];
  const errors: unknown[] = [];
  const write = (store: Store, origin: string, topic: string, message: object) =>
    store.transaction((tx) => tx.busMessages.add(origin, topic, message, Date.now()));

  before(async () => {
    node = await Store.open(undefined, dir, { readWorkers: 0 });
    other = await Store.open(undefined, dir, { readWorkers: 0 });
    await write(other, "cli-before", topics.peers, { kind: "blocked", key: "before-start" });
    bus = new SqliteBus({ file: join(dir, "perch.db"), pollMs: 20, onError: (err) => errors.push(err) });
    bus.subscribe(topics.peers, { message: (m) => got.push(m) });
    bus.subscribe(topics.session("s1"), { message: (m) => got.push({ ...m, session: "s1" }) });
  });
  after(async () => {
    await bus.close();
    await node.close();
    await other.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test("another process's messages arrive in order; its own and earlier ones do not", async () => {
    await write(other, "cli", topics.peers, { kind: "blocked", key: "a" });
    await write(node, bus.instance, topics.peers, { kind: "removed", key: "own" });
    await write(other, "cli", topics.session("s1"), { kind: "revoked" });
    await write(other, "cli", topics.peers, { kind: "removed", key: "b" });
    await eventually(() => got.length >= 3, 5_000, "three messages");
    assert.deepEqual(got, [
      { kind: "blocked", key: "a" },
      { kind: "revoked", session: "s1" },
      { kind: "removed", key: "b" },
    ]);
  });

  test("listened: a topic subscribed here, or a command or reply that goes to another process through the file", async () => {
    assert.equal(bus.listened(topics.peers), true);
    assert.equal(bus.listened(topics.device("nobody")), false);
    assert.equal(bus.listened(topics.node("other")), false, "no persist: nothing leaves this process");
    const persisting = new SqliteBus({ file: join(dir, "perch.db"), pollMs: 20, onError: (err) => errors.push(err), persist: async () => {} });
    try {
      assert.equal(persisting.listened(topics.node("other")), true);
      assert.equal(persisting.listened(topics.replies("someone")), true);
      assert.equal(persisting.listened(topics.device("nobody")), false);
    } finally {
      await persisting.close();
    }
  });

  test("a burst of 2,500 rows in one commit, a block last: all are read (the bus polls again after a full batch of 1,000) with nothing committed after", async () => {
    got.length = 0;
    await other.transaction(async (tx) => {
      for (let i = 0; i < 2_499; i++) await tx.busMessages.add("cli", topics.device(`filler-${i}`), { kind: "runtime" }, Date.now());
      await tx.busMessages.add("cli", topics.peers, { kind: "blocked", key: "after-the-burst" }, Date.now());
    });
    await eventually(() => got.length >= 1, 5_000, "the block after 2,499 other rows");
    assert.deepEqual(got, [{ kind: "blocked", key: "after-the-burst" }]);
  });

  test("a row that is not JSON is reported and skipped; the next ones still come", async () => {
    got.length = 0;
    await other.transaction(async (tx) => {
      await tx.busMessages.add("cli", topics.peers, { kind: "blocked", key: "c" }, Date.now());
    });
    // Written by hand (what no Perch writes), with a good row after it in the same commit.
    const raw = new DatabaseSync(join(dir, "perch.db"));
    raw.exec("BEGIN");
    raw.prepare("INSERT INTO bus_messages (origin, topic, message, created_at) VALUES (?, ?, ?, ?)").run("cli", topics.peers, "{not json", Date.now());
    raw
      .prepare("INSERT INTO bus_messages (origin, topic, message, created_at) VALUES (?, ?, ?, ?)")
      .run("cli", topics.peers, '{"kind":"blocked","key":"d"}', Date.now());
    raw.exec("COMMIT");
    raw.close();
    await eventually(() => got.length >= 2, 5_000, "the messages around the bad row");
    assert.deepEqual(got, [
      { kind: "blocked", key: "c" },
      { kind: "blocked", key: "d" },
    ]);
    assert.equal(errors.length, 1);
  });
});

/** A bus whose listening can be lost and found again (what PostgreSQL's reconnect does): `gap()` tells every subscriber. */
class GappyBus extends InProcessBus {
  gap(): void {
    this.subs.gap();
  }
}

describe("PeerWatch: a gap in the bus", () => {
  test("peers blocked or removed while the bus was not listening are cut once it listens again; the others stay", async () => {
    const dir = tempDir();
    const store = await Store.open(undefined, dir, { readWorkers: 0 });
    const bus = new GappyBus();
    try {
      const pair = generateKeyPair();
      const serverKey = { ...pair, privateKeyObject: privateKeyObject(pair.privateKey), publicKeyText: encodeKey(pair.publicKey) };
      const domain = new Domain({ store, clock: systemClock, config: loadConfig({}, { data_dir: dir }), serverKey, events: new DomainEvents(bus) });
      const keys = ["blocked", "removed", "fine"].map(() => encodeKey(generateKeyPair().publicKey));
      for (const key of keys) await domain.peers.add(key);
      const cut: Array<[string, string]> = [];
      const watch = new PeerWatch({ domain, connected: () => keys, cut: (key, why) => cut.push([key, why]), onError: (err) => assert.fail(String(err)) });
      try {
        // Written while nobody heard: straight to the store, no message on the bus.
        await store.transaction((tx) => tx.peers.setStatus(keys[0]!, "blocked", Date.now()));
        await store.transaction((tx) => tx.peers.remove(keys[1]!));
        bus.gap();
        await eventually(() => cut.length === 2, 5_000, "the two peers cut after the gap");
        assert.deepEqual(cut, [
          [keys[0], "blocked"],
          [keys[1], "removed"],
        ]);
      } finally {
        watch.stop();
      }
    } finally {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
