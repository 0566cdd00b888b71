/**
 * `npx tsx bench/telemetry-queries.ts [samples]`: the store's telemetry queries over one device's
 * window of `samples` samples (default 1,000,000, one a second) on SQLite, through `Store.read`
 * (so on the read worker), as the Side Control routes run them. Prints JSON.
 */
import { mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { encodeKey, generateKeyPair } from "../src/crypto/keys.ts";
import { Store } from "../src/store/index.ts";

const SAMPLES = Number(process.argv[2] ?? 1_000_000);
const RUNS = 30;
const dir = mkdtempSync(join(tmpdir(), "perch-telemetry-"));
const store = await Store.open(undefined, dir);
try {
  const key = encodeKey(generateKeyPair().publicKey);
  const start = 1_700_000_000_000;
  const end = start + SAMPLES * 1000;
  await store.transaction((tx) => tx.peers.register({ public_key: key, role: "client", status: "active", device_info: "{}", created_at: 0, updated_at: 0 }));
  const seeding = performance.now();
  for (let i = 0; i < SAMPLES; i += 20_000) {
    const batch = Array.from({ length: Math.min(20_000, SAMPLES - i) }, (_, j) => ({
      field: "battery.percent",
      observedAt: start + (i + j) * 1000,
      value: (i + j) % 101,
    }));
    await store.transaction((tx) => tx.telemetry.insert(key, batch));
  }
  const seedSeconds = (performance.now() - seeding) / 1000;

  const time = async (run: () => Promise<unknown[]>) => {
    const ms: number[] = [];
    const cpu: number[] = [];
    let points = 0;
    for (let i = 0; i < RUNS; i++) {
      const t = performance.now();
      const c = process.cpuUsage();
      points = (await run()).length;
      const used = process.cpuUsage(c);
      ms.push(performance.now() - t);
      cpu.push((used.user + used.system) / 1000);
    }
    const at = (list: number[], q: number) => Math.round(list.sort((a, b) => a - b)[Math.min(list.length - 1, Math.floor(q * list.length))]! * 100) / 100;
    // CPU time of the process (the worker's query and the main thread's share) is what a loaded machine does not inflate.
    return { points, p50_ms: at(ms, 0.5), p99_ms: at(ms, 0.99), cpu_p50_ms: at(cpu, 0.5) };
  };
  const window = { publicKey: key, field: "battery.percent", start, end };
  const bucket = Math.ceil((end - start) / 1000);
  const figures: Record<string, unknown> = {};
  for (const fn of ["avg", "sum", "count", "min", "max", "last"] as const) {
    figures[`aggregate ${fn}, 1000 buckets`] = await time(() => store.read((r) => r.telemetry.aggregate({ ...window, bucket, fn })));
  }
  for (const order of ["asc", "desc"] as const) {
    figures[`stepped range ${order}, 1000 steps`] = await time(() =>
      store.read((r) => r.telemetry.lastPerStep({ ...window, step: bucket, order, limit: 1000 })),
    );
  }
  figures["raw range, limit 1000"] = await time(() => store.read((r) => r.telemetry.range({ ...window, order: "desc", limit: 1000 })));
  await store.close();
  const bytes = ["perch.db", "perch.db-wal"].reduce((n, f) => n + (statSync(join(dir, f), { throwIfNoEntry: false })?.size ?? 0), 0);
  process.stdout.write(
    `${JSON.stringify({ store: "sqlite", node: process.version, samples: SAMPLES, seed_seconds: Math.round(seedSeconds * 10) / 10, bytes_per_sample: Math.round((bytes / SAMPLES) * 10) / 10, runs: RUNS, figures }, null, 2)}\n`,
  );
} finally {
  rmSync(dir, { recursive: true, force: true });
}
