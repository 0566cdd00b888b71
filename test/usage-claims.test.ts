import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { rmSync } from "node:fs";
import { describe, test } from "node:test";
import pg from "pg";
import { type ConfigInput, loadConfig } from "../src/config/config.ts";
import { dayOf } from "../src/domain/usage-limits.ts";
import { UsageLimited, UsageMeter } from "../src/domain/usage-meter.ts";
import { Store } from "../src/store/index.ts";
import { USAGE_COLUMNS } from "../src/store/usage.ts";
import { STORES, tempDir } from "./support/server.ts";
import { eventually } from "./support/webrtc.ts";

const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");
const CAP = 5;
const NOW = Date.UTC(2026, 5, 15, 12);
const WHO = { id: "api_key:app", apiKey: "app" };

/**
 * Two nodes' meters (each its own store, on one database) claim a request unit of one API key at
 * once, with one unit left under its daily cap: a claim reads what is used and adds its units in one
 * transaction, and two such transactions must not both read the same count (the claim's named lock
 * on PostgreSQL; SQLite's write transactions run one at a time).
 */
for (const entry of STORES)
  describe(`usage (fast layer): two meters on one database race for the last request unit (${entry.name})`, () => {
    test("one is given it, the other is refused; the store counts the cap, not one more", async () => {
      const url = await entry.url();
      const dir = tempDir();
      const stores = [await Store.open(url, dir, { readWorkers: 0 }), await Store.open(url, dir, { readWorkers: 0 })];
      const config = loadConfig({}, {
        data_dir: dir,
        api_keys: [{ name: "app", sha256: sha256("sk-app"), limits: [{ per: "day", requests: CAP }] }],
      } as ConfigInput);
      const clock = { now: () => NOW };
      const meters = stores.map((store) => new UsageMeter({ store, clock, config }));
      const zero = Object.fromEntries(USAGE_COLUMNS.map((c) => [c, 0])) as Record<(typeof USAGE_COLUMNS)[number], number>;
      const used = async () => (await stores[0]!.read((r) => r.usage.rows([WHO.id], dayOf(NOW)))).reduce((n, r) => n + r.requests, 0);
      let holder: pg.Client | undefined;
      try {
        // CAP - 1 requests counted today already (other nodes'): one unit is left.
        await stores[0]!.transaction((tx) => tx.usage.add([{ principal: WHO.id, day: dayOf(NOW), agent: "chat", ...zero, requests: CAP - 1, estimated: 0 }]));
        if (url) {
          // PostgreSQL: the row is held (as another node's write would) until both claims are under way,
          // so that they interleave: each has read the row, or waits to, before either may write it.
          holder = new pg.Client({ connectionString: url });
          await holder.connect();
          await holder.query("begin");
          await holder.query("select * from usage_days where principal = $1 for update", [WHO.id]);
        }
        const outcomes = meters.map(async (meter) => {
          try {
            (await meter.admit(WHO, "chat")).answered();
            return "answered";
          } catch (err) {
            assert.ok(err instanceof UsageLimited, String(err));
            return "refused";
          }
        });
        if (holder) {
          // Both claims wait: on the held row, or on the claim before them.
          const waiting = `select count(distinct l.pid)::int as n from pg_locks l join pg_stat_activity a on a.pid = l.pid
                           where not l.granted and a.datname = current_database()`;
          await eventually(async () => (await holder!.query<{ n: number }>(waiting)).rows[0]!.n === 2, 20_000, "both claims waiting");
          await holder.query("commit");
        }
        assert.deepEqual((await Promise.all(outcomes)).sort(), ["answered", "refused"]);
        for (const m of meters) await m.flush("all");
        assert.equal(await used(), CAP);
      } finally {
        await holder?.end();
        for (const m of meters) await m.close();
        for (const s of stores) await s.close();
        rmSync(dir, { recursive: true, force: true });
      }
    });
  });
