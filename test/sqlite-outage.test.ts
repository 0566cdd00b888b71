import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { closeSync, openSync, renameSync, rmSync, unlinkSync, writeSync } from "node:fs";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { after, before, describe, test } from "node:test";
import { CompiledQuery } from "kysely";
import { PerchApiError, type PerchClient } from "../src/sdk/client.ts";
import { StoreUnavailable } from "../src/store/errors.ts";
import type { ReadPool } from "../src/store/read-pool.ts";
import { startTestServer, type TestServer, tempDir } from "./support/server.ts";

/** The answer of a write the store could not take: 503 UNAVAILABLE with Retry-After. */
function unavailable(e: unknown): boolean {
  assert.ok(e instanceof PerchApiError, String(e));
  assert.equal(`${e.status} ${e.code}`, "503 UNAVAILABLE");
  assert.ok(Number(e.headers?.get("retry-after")) > 0, "Retry-After");
  return true;
}

/** A status document of about 15 KB. */
const bulky = (n: number) => ({ volume: n % 101, details: { note: `${n}:`.padEnd(15_000, "x") } });

/** A file system of `size` the test can fill: tmpfs, which needs root (CAP_SYS_ADMIN); otherwise why not. */
function smallFileSystem(dir: string, size: string): string | undefined {
  if (process.platform !== "linux") return `tmpfs needs Linux (this is ${process.platform})`;
  if (process.getuid?.() !== 0) return "mounting a small tmpfs needs root (CI runs as root)";
  try {
    execFileSync("mount", ["-t", "tmpfs", "-o", `size=${size},mode=0700`, "tmpfs", dir], { stdio: "pipe" });
    return undefined;
  } catch (err) {
    return `mount -t tmpfs failed: ${(err as { stderr?: Buffer }).stderr?.toString().trim() || (err as Error).message}`;
  }
}

describe("SQLite: the disk fills up", () => {
  const dir = tempDir("perch-full-");
  const why = smallFileSystem(dir, "6m");
  if (why) console.log(`SQLite disk-full test skipped: ${why}`);
  let server: TestServer;
  let device: PerchClient;
  const filler = join(dir, "filler");

  before(async () => {
    if (why) return;
    server = await startTestServer({ dataDir: join(dir, "data") });
    device = server.client();
    await device.login();
  });
  after(async () => {
    await server?.stop();
    if (!why) execFileSync("umount", [dir]);
    rmSync(dir, { recursive: true, force: true });
  });

  test("writes answer 503 + Retry-After, reads go on, nothing is corrupted, writes work again once space returns", { skip: why ?? false }, async () => {
    const stored = await device.putStatus(bulky(0));
    // Everything but a little is taken.
    const fd = openSync(filler, "w");
    const chunk = Buffer.alloc(64 * 1024, 1);
    try {
      for (;;) writeSync(fd, chunk);
    } catch (err) {
      assert.equal((err as NodeJS.ErrnoException).code, "ENOSPC");
    } finally {
      closeSync(fd);
    }
    // Writes until the database needs a page it cannot have.
    let acknowledged = stored;
    let refused = 0;
    for (let n = 1; n <= 200 && refused < 3; n++) {
      try {
        acknowledged = await device.putStatus(bulky(n));
      } catch (e) {
        unavailable(e);
        refused++;
      }
    }
    assert.equal(refused, 3, "writes were refused with 503");
    // Reads go on, with the last acknowledged write; liveness and readiness hold (the store answers).
    assert.deepEqual(await device.status(), acknowledged);
    assert.equal((await fetch(`${server.url}/healthz`)).status, 200);
    assert.equal((await fetch(`${server.url}/readyz`)).status, 200);
    // Logins write too: refused the same way.
    await assert.rejects(server.client().login(), unavailable);

    unlinkSync(filler);
    const after = await device.putStatus(bulky(1000));
    assert.deepEqual(await device.status(), after);
    await server.client().login();
    const check = new DatabaseSync(join(dir, "data", "perch.db"), { readOnly: true });
    try {
      assert.deepEqual(
        check
          .prepare("pragma integrity_check")
          .all()
          .map((r) => r.integrity_check),
        ["ok"],
      );
    } finally {
      check.close();
    }
  });
});

describe("SQLite: the database file locked by another process past the wait", () => {
  let server: TestServer;
  let device: PerchClient;
  before(async () => {
    server = await startTestServer();
    device = server.client();
    await device.login();
  });
  after(() => server.stop());

  test("writes answer 503 + Retry-After after the wait, reads go on meanwhile, writes work once the lock is let go", async () => {
    const stored = await device.putStatus({ volume: 1 });
    // Another process takes the write lock and holds it past the wait (5 s), until told to let go.
    const holder = spawn(
      process.execPath,
      [
        "-e",
        `const { DatabaseSync } = require("node:sqlite");
         const db = new DatabaseSync(process.argv[1]);
         db.exec("begin immediate");
         console.log("locked");
         process.stdin.once("data", () => { db.exec("commit"); db.close(); process.exit(0); });`,
        join(server.dataDir, "perch.db"),
      ],
      { stdio: ["pipe", "pipe", "inherit"] },
    );
    await new Promise<void>((resolve, reject) => {
      holder.stdout.once("data", () => resolve());
      holder.once("exit", (code) => reject(new Error(`the lock holder exited (${code})`)));
    });
    try {
      let settled = false;
      const write = device.putStatus({ volume: 2 }).finally(() => (settled = true));
      // The node keeps serving while the write waits: reads answer, with the stored document.
      for (let i = 0; i < 5; i++) assert.deepEqual(await device.status(), stored);
      assert.equal((await fetch(`${server.url}/healthz`)).status, 200);
      assert.equal(settled, false, "the write is still waiting for the lock");
      await assert.rejects(write, unavailable);
      assert.deepEqual(await device.status(), stored, "the refused write left nothing");
    } finally {
      holder.stdin.write("go\n");
      await new Promise((r) => holder.once("exit", r));
    }
    const third = await device.putStatus({ volume: 3 });
    assert.equal(third.volume, 3);
    assert.deepEqual(await device.status(), third);
  });
});

describe("SQLite: the read pool (a WorkerPool of read workers)", () => {
  let server: TestServer;
  let phone: PerchClient;
  let pool: ReadPool;
  /** A telemetry range: a long read, run on the read pool. */
  const range = () => phone.sideControl.telemetry({ field: "battery.percent" });
  before(async () => {
    server = await startTestServer();
    const device = server.client();
    await device.login();
    phone = server.client();
    await phone.login({ deviceToken: (await device.createDeviceToken()).token });
    await server.domain.telemetry.record(device.publicKey, [{ field: "battery.percent", observedAt: Date.now() - 1000, value: 42 }]);
    pool = (server.store as unknown as { readPool: ReadPool }).readPool;
  });
  after(() => server.stop());

  test("a read worker that ends mid-query fails that query only, as unavailable; it is replaced and reads go on", async () => {
    assert.equal((await range()).points.length, 1);
    const restarts = pool.restarts;
    const [worker] = pool.workers();
    assert.ok(worker && pool.workers().length === 1, "one read worker, ready");
    // A query that runs a while (so that it is still running when its worker ends), and one that
    // waits behind it for the pool's only worker.
    const lost = pool.query(CompiledQuery.raw("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3000000) SELECT count(*) AS n FROM c"));
    const waiting = pool.query(CompiledQuery.raw("SELECT 42 AS n"));
    assert.equal(worker.busy, true, "the long query is out to the worker");
    assert.equal(pool.waiting, 1, "the short one waits for it");
    await worker.terminate();
    await assert.rejects(lost, (e) => e instanceof StoreUnavailable && /a database read worker ended/.test(e.message));
    assert.deepEqual(await waiting, [{ n: 42 }], "the query that waited is run by the new worker");
    assert.equal(pool.restarts, restarts + 1);
    assert.notEqual(pool.workers()[0]?.id, worker.id, "a new worker serves");
    assert.equal((await range()).points.length, 1);
  });

  test("a read worker that keeps ending is replaced each time (with back-off); reads go on", async () => {
    await pool.ready();
    const restarts = pool.restarts;
    const ended = new Set<number>();
    for (let i = 0; i < 3; i++) {
      const [worker] = pool.workers();
      assert.ok(worker, "a read worker is ready");
      ended.add(worker.id);
      await worker.terminate();
      // Its replacement: ready again (no query answered in between, so each waits longer).
      await pool.ready();
    }
    assert.equal(pool.restarts, restarts + 3);
    assert.equal((await range()).points.length, 1);
    assert.ok(!ended.has(pool.workers()[0]!.id), "a new worker serves");
  });

  test("a read worker that cannot open the database answers 503, and opens it on a later read", async () => {
    // The file is away while a new worker starts and takes its first query.
    const file = join(server.dataDir, "perch.db");
    await pool.ready();
    renameSync(file, `${file}.away`);
    try {
      const [worker] = pool.workers();
      await worker!.terminate();
      await pool.ready();
      await assert.rejects(range(), unavailable);
      await assert.rejects(range(), unavailable);
    } finally {
      renameSync(`${file}.away`, file);
    }
    assert.equal((await range()).points.length, 1);
    assert.equal((await range()).points.length, 1);
  });
});
