import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import pg from "pg";
import { type BusMessage, PgEventBus } from "../src/bus/index.ts";
import { BATCH_WINDOW_MS, CHANNEL } from "../src/bus/postgres.ts";
import { Store } from "../src/store/index.ts";
import { freshPostgresDatabase, TEST_DATABASE_URL, tempDir } from "./support/server.ts";
import { eventually } from "./support/webrtc.ts";

/** fleet.md §5: the bus between nodes, as PostgreSQL sees it. */
describe("the bus between nodes at scale (PostgreSQL)", { skip: TEST_DATABASE_URL ? false : "PERCH_TEST_DATABASE_URL is not set" }, () => {
  let url: string;
  let store: Store;
  let a: PgEventBus;
  let b: PgEventBus;
  let raw: pg.Client;
  const payloads: string[] = [];

  before(async () => {
    url = await freshPostgresDatabase();
    // The schema (bus_messages) as a node makes it.
    store = await Store.open(url, tempDir());
    a = new PgEventBus({ url });
    b = new PgEventBus({ url });
    await a.start();
    await b.start();
    raw = new pg.Client({ connectionString: url });
    await raw.connect();
    raw.on("notification", (n) => payloads.push(n.payload ?? ""));
    await raw.query(`LISTEN ${CHANNEL}`);
  });
  after(async () => {
    await a?.close();
    await b?.close();
    await raw?.end();
    await store?.close();
  });

  const telemetry = (n: number): BusMessage => ({ kind: "telemetry", values: [["battery_percent", n % 100, 1_700_000_000_000 + n]], pad: "x".repeat(120) });

  test("600 devices' telemetry in one burst: a few NOTIFYs, each under 8,000 bytes (a larger batch through the table), every message delivered in order", async () => {
    payloads.length = 0;
    const got: number[] = [];
    const offs = Array.from({ length: 600 }, (_, i) =>
      b.subscribe(`device:k${i}`, { message: (m) => got.push((m.values as number[][])[0]![2]! - 1_700_000_000_000) }),
    );
    const before = { ...a.stats };
    for (let i = 0; i < 600; i++) a.publish(`device:k${i}`, telemetry(i));
    await eventually(() => got.length === 600, 10_000, "600 messages on the other node");
    assert.deepEqual(
      got,
      Array.from({ length: 600 }, (_, i) => i),
    );
    const notifies = a.stats.notifies - before.notifies;
    // 500 envelopes a statement at most: two statements, each one NOTIFY (one transaction each).
    assert.equal(notifies, 2);
    await eventually(() => payloads.length >= 2, 5_000, "the raw listener's notifications");
    assert.equal(payloads.length, 2);
    for (const p of payloads) assert.ok(Buffer.byteLength(p) < 8_000, `a payload of ${Buffer.byteLength(p)} bytes`);
    assert.ok(a.stats.spilled - before.spilled >= 1, "a batch over a payload went through the table");
    assert.ok(payloads.some((p) => /^\{"r":\d+\}$/.test(p)));
    for (const off of offs) off();
  });

  test("telemetry and presence wait for the batch window and travel together; anything else goes at once, taking them along", async () => {
    payloads.length = 0;
    const got: BusMessage[] = [];
    const off = b.subscribe("device:w", { message: (m) => got.push(m) });
    const started = performance.now();
    a.publish("device:w", { kind: "telemetry", values: [["battery_percent", 1, 1]] });
    await new Promise((r) => setTimeout(r, 20));
    a.publish("device:w", { kind: "runtime", online: true, node: "n1" });
    await eventually(() => got.length === 2, 5_000, "both");
    assert.ok(performance.now() - started >= BATCH_WINDOW_MS - 5, "they waited for the window");
    await eventually(() => payloads.length >= 1, 2_000, "the notification");
    assert.equal(payloads.length, 1, "one NOTIFY for both");
    assert.equal((JSON.parse(payloads[0]!) as unknown[]).length, 2);
    // A status change is not held: it leaves at the next tick with the telemetry waiting.
    payloads.length = 0;
    got.length = 0;
    const t0 = performance.now();
    a.publish("device:w", { kind: "telemetry", values: [["battery_percent", 2, 2]] });
    a.publish("device:w", { kind: "status", v: 3 });
    await eventually(() => got.length === 2, 5_000, "both");
    assert.ok(performance.now() - t0 < BATCH_WINDOW_MS, `delivered in ${performance.now() - t0} ms`);
    await eventually(() => payloads.length >= 1, 2_000, "the notification");
    assert.equal(payloads.length, 1);
    off();
  });
});
