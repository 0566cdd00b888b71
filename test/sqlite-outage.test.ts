import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { closeSync, openSync, rmSync, unlinkSync, writeSync } from "node:fs";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { after, before, describe, test } from "node:test";
import { PerchApiError, type PerchClient } from "../src/sdk/client.ts";
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

describe("SQLite: the read pool", () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer();
  });
  after(() => server.stop());

  test("a read worker that ends is replaced; reads go on", async () => {
    const device = server.client();
    await device.login();
    const phone = server.client();
    await phone.login({ deviceToken: (await device.createDeviceToken()).token });
    await server.domain.telemetry.record(device.publicKey, [{ field: "battery.percent", observedAt: Date.now() - 1000, value: 42 }]);
    const range = () => phone.sideControl.telemetry({ field: "battery.percent" });
    assert.equal((await range()).points.length, 1);
    const pool = (server.store as unknown as { readPool: { workers: Array<{ terminate(): Promise<number>; threadId: number }> } }).readPool;
    const [first] = pool.workers;
    assert.ok(first, "a read worker runs");
    for (let i = 0; i < 3; i++) {
      const [worker] = pool.workers;
      if (!worker) {
        await new Promise((r) => setTimeout(r, 300));
        continue;
      }
      await worker.terminate();
    }
    // Replaced (with back-off after repeated ends): reads come back.
    for (let i = 0; ; i++) {
      try {
        assert.equal((await range()).points.length, 1);
        break;
      } catch (e) {
        assert.ok(e instanceof PerchApiError && e.status === 503, String(e));
        assert.ok(i < 100, "reads came back");
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    assert.notEqual(pool.workers[0]?.threadId, first.threadId, "a new worker serves");
  });
});
