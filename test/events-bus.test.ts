import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import pg from "pg";
import { type BusMessage, CommandError, Commands, type EventBus, InProcessBus, MAX_MESSAGE_BYTES, PgEventBus } from "../src/bus/index.ts";
import { OwnCluster } from "./support/pg-cluster.ts";
import { freshPostgresDatabase, TEST_DATABASE_URL } from "./support/server.ts";

/** Collects what a topic receives, and resolves `next()` with the next message. */
function collector(bus: EventBus, topic: string) {
  const got: BusMessage[] = [];
  let gaps = 0;
  const waiters: Array<() => void> = [];
  const unsubscribe = bus.subscribe(topic, {
    message: (m) => {
      got.push(m);
      for (const w of waiters.splice(0)) w();
    },
    gap: () => {
      gaps++;
      for (const w of waiters.splice(0)) w();
    },
  });
  const until = async (check: () => boolean, what: string, ms = 10_000) => {
    const deadline = Date.now() + ms;
    while (!check()) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}; got ${JSON.stringify(got)}`);
      await new Promise<void>((r) => {
        waiters.push(r);
        setTimeout(r, 100);
      });
    }
  };
  return { got, gaps: () => gaps, until, unsubscribe };
}

describe("in-process event bus", () => {
  test("delivers to the topic's subscribers in order, at once, until they unsubscribe", () => {
    const bus = new InProcessBus();
    const a: BusMessage[] = [];
    const b: BusMessage[] = [];
    const offA = bus.subscribe("t", { message: (m) => a.push(m) });
    bus.subscribe("other", { message: (m) => b.push(m) });
    bus.publish("t", { n: 1 });
    bus.publish("t", { n: 2 });
    assert.deepEqual(a, [{ n: 1 }, { n: 2 }]);
    assert.deepEqual(b, []);
    offA();
    bus.publish("t", { n: 3 });
    assert.equal(a.length, 2);
  });

  test("a throwing subscriber reaches neither the publisher nor the other subscribers", () => {
    const errors: unknown[] = [];
    const bus = new InProcessBus((err) => errors.push(err));
    const got: BusMessage[] = [];
    bus.subscribe("t", {
      message: () => {
        throw new Error("boom");
      },
    });
    bus.subscribe("t", { message: (m) => got.push(m) });
    bus.publish("t", { ok: true });
    assert.deepEqual(got, [{ ok: true }]);
    assert.equal(errors.length, 1);
  });

  test("a message over the size limit is refused on publish", () => {
    const bus = new InProcessBus();
    assert.throws(() => bus.publish("t", { big: "x".repeat(MAX_MESSAGE_BYTES) }), RangeError);
  });

  test("a topic is listened to while it has a subscriber here, and not once the bus is closed", async () => {
    const bus = new InProcessBus();
    assert.equal(bus.listened("device:x"), false);
    const off = bus.subscribe("device:x", { message: () => {} });
    assert.equal(bus.listened("device:x"), true);
    assert.equal(bus.listened("device:y"), false);
    off();
    assert.equal(bus.listened("device:x"), false);
    bus.subscribe("device:x", { message: () => {} });
    await bus.close();
    assert.equal(bus.listened("device:x"), false);
  });

  test("commands: a reply, an unknown command, a failing handler, no node answering", async () => {
    const bus = new InProcessBus();
    const here = new Commands(bus, "node-a");
    const caller = new Commands(bus, undefined);
    here.handle("echo", (args) => ({ echoed: args.text }));
    here.handle("fail", () => {
      throw new Error("it broke");
    });
    assert.deepEqual(await caller.call("node-a", "echo", { text: "hi" }), { echoed: "hi" });
    await assert.rejects(caller.call("node-a", "nope"), (e: unknown) => e instanceof CommandError && e.reason === "no_handler");
    await assert.rejects(caller.call("node-a", "fail"), (e: unknown) => e instanceof CommandError && e.reason === "failed" && /it broke/.test(e.message));
    await assert.rejects(caller.call("node-b", "echo", {}, 200), (e: unknown) => e instanceof CommandError && e.reason === "timeout");
    here.close();
    caller.close();
  });
});

describe("PostgreSQL event bus (LISTEN/NOTIFY)", { skip: TEST_DATABASE_URL ? false : "PERCH_TEST_DATABASE_URL is not set" }, () => {
  let url: string;
  let a: PgEventBus;
  let b: PgEventBus;
  const warnings: string[] = [];
  const log = { warn: (_: object, msg: string) => void warnings.push(msg) };

  before(async () => {
    url = await freshPostgresDatabase();
    a = new PgEventBus({ url, log });
    b = new PgEventBus({ url, log, applicationName: "perch events b" });
    await Promise.all([a.start(), b.start()]);
  });
  after(async () => {
    await Promise.all([a?.close(), b?.close()]);
  });

  test("a message reaches the other node's subscribers once, and the publisher's own at once", async () => {
    const onA = collector(a, "device:x");
    const onB = collector(b, "device:x");
    for (let i = 0; i < 5; i++) a.publish("device:x", { i, same: "payload" });
    assert.equal(onA.got.length, 5, "delivered locally before publish returned");
    await onB.until(() => onB.got.length === 5, "five messages on b");
    assert.deepEqual(
      onB.got.map((m) => m.i),
      [0, 1, 2, 3, 4],
    );
    // PostgreSQL delivers notifications in commit order: had a's own come back to it, they would come before b's marker.
    b.publish("device:x", { i: "marker" });
    await onA.until(() => onA.got.some((m) => m.i === "marker"), "b's marker on a");
    assert.deepEqual(
      onA.got.map((m) => m.i),
      [0, 1, 2, 3, 4, "marker"],
      "its own notifications are not delivered twice",
    );
    onA.unsubscribe();
    onB.unsubscribe();
  });

  test("a process that only publishes (the command line) reaches listening nodes", async () => {
    const onB = collector(b, "peers");
    const cli = new PgEventBus({ url, listen: false });
    await cli.start();
    assert.equal(cli.listened("peers"), true, "another node may listen to a topic nobody here subscribed to");
    cli.publish("peers", { kind: "blocked", key: "k" });
    await cli.close();
    await onB.until(() => onB.got.length === 1, "the command line's message");
    assert.deepEqual(onB.got, [{ kind: "blocked", key: "k" }]);
    onB.unsubscribe();
  });

  test("a terminated listening connection is made again: a gap is reported, later messages arrive, publishes meanwhile are sent", async () => {
    const onB = collector(b, "device:y");
    const onA = collector(a, "device:y");
    const admin = new pg.Client({ connectionString: url });
    await admin.connect();
    try {
      const killed = await admin.query("select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'perch events b'");
      assert.equal(killed.rowCount, 1);
      // Published while b's connection is (being) replaced: queued on b, sent once it is back.
      b.publish("device:y", { from: "b", during: true });
      await onB.until(() => onB.gaps() >= 1, "b's gap");
      await onA.until(() => onA.got.some((m) => m.during === true), "b's queued publish on a");
      a.publish("device:y", { after: true });
      await onB.until(() => onB.got.some((m) => m.after === true), "a message after the reconnect");
      assert.equal(onA.gaps(), 0, "a kept listening");
      assert.equal(b.stats.reconnects, 1);
      assert.ok(warnings.some((w) => /connection lost/.test(w)));
    } finally {
      await admin.end();
      onA.unsubscribe();
      onB.unsubscribe();
    }
  });

  test("commands cross nodes: the node named answers, through PostgreSQL", async () => {
    const onA = new Commands(a, "node-a");
    const fromB = new Commands(b, "node-b");
    onA.handle("whoami", () => ({ node: "node-a" }));
    assert.deepEqual(await fromB.call("node-a", "whoami"), { node: "node-a" });
    await assert.rejects(fromB.call("node-c", "whoami", {}, 300), (e: unknown) => e instanceof CommandError && e.reason === "timeout");
    onA.close();
    fromB.close();
  });

  test("the first connection failing is reported to start(); nothing throws later", async () => {
    const bad = new URL(url);
    bad.port = "1";
    const bus = new PgEventBus({ url: bad.toString() });
    await assert.rejects(bus.start());
    bus.publish("t", { queued: true });
    await bus.close();
  });
});

describe("PostgreSQL event bus across a PostgreSQL restart", { skip: TEST_DATABASE_URL ? false : "PERCH_TEST_DATABASE_URL is not set" }, () => {
  let cluster: OwnCluster;
  before(async () => {
    cluster = await OwnCluster.start();
  });
  after(async () => {
    await cluster?.destroy();
  });

  test("both buses listen again after pg_ctl restart, report the gap, and carry messages again", async () => {
    const a = new PgEventBus({ url: cluster.url });
    const b = new PgEventBus({ url: cluster.url });
    await Promise.all([a.start(), b.start()]);
    try {
      const onB = collector(b, "t");
      await cluster.restart();
      await onB.until(() => onB.gaps() >= 1, "b's gap after the restart", 30_000);
      // a may still be reconnecting: publish until b hears one (a's queue is sent once it is back).
      a.publish("t", { after: "restart" });
      await onB.until(() => onB.got.some((m) => m.after === "restart"), "a message after the restart", 30_000);
      onB.unsubscribe();
    } finally {
      await Promise.all([a.close(), b.close()]);
    }
  });
});
