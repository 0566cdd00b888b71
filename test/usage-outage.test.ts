import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { rmSync } from "node:fs";
import { test } from "node:test";
import { type ConfigInput, loadConfig } from "../src/config/config.ts";
import { systemClock } from "../src/domain/clock.ts";
import { UsageLimited, UsageMeter } from "../src/domain/usage-meter.ts";
import { Store } from "../src/store/index.ts";
import { tempDir } from "./support/server.ts";

const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");

test("usage (fast layer): with the store away, requests are still counted and a request limit still holds on what the node holds", async () => {
  const dir = tempDir();
  const store = await Store.open(undefined, dir, { readWorkers: 0 });
  const config = loadConfig({}, {
    data_dir: dir,
    api_keys: [{ name: "app", sha256: sha256("sk-app"), limits: [{ per: "day", requests: 3 }] }],
  } as ConfigInput);
  const meter = new UsageMeter({ store, clock: systemClock, config });
  const errors: unknown[] = [];
  meter.setHooks({ storeError: (err) => errors.push(err) });
  const who = { id: "api_key:app", apiKey: "app" };
  // The store goes away before the first claim.
  await store.close();
  let answered = 0;
  let refused = 0;
  for (let i = 0; i < 5; i++) {
    try {
      const admission = await meter.admit(who, "chat");
      admission.answered();
      answered++;
    } catch (err) {
      assert.ok(err instanceof UsageLimited, String(err));
      refused++;
    }
  }
  assert.ok(errors.length > 0, "the store's errors were told");
  assert.deepEqual([answered, refused], [3, 2]);
  // Kept for the next write: nothing answered is lost.
  const kept = meter.unwritten("api_key:app", "2000-01-01").reduce((n, u) => n + u.counts.requests, 0);
  assert.equal(kept, 3);
  await meter.close();
  rmSync(dir, { recursive: true, force: true });
});
