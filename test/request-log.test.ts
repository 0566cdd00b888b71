/**
 * The request log of a `perch serve` process: one JSON line per request on standard output, in
 * order, none lost or cut when lines are gathered into batches (src/node/log-lines.ts), the last
 * ones written when the process stops.
 */
import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { test } from "node:test";
import { spawnServer, tempDir } from "./support/server.ts";

test("every request's line reaches standard output whole and in order, the last ones at SIGTERM", async () => {
  const dataDir = tempDir();
  const server = await spawnServer({ PERCH_DATA_DIR: dataDir });
  try {
    // Past one batch (4,096 characters, about 18 lines), with a part of one left pending at the end.
    const ids = Array.from({ length: 30 }, (_, i) => `log-line-${i}`);
    for (const id of ids) {
      const res = await fetch(`${server.url}/me/status`, { headers: { "x-request-id": id } });
      assert.equal(res.status, 401);
      await res.body?.cancel();
    }
    assert.equal(await server.stop(), 0);
    const lines = server
      .output()
      .split("\n")
      .filter((l) => l.includes('"msg":"request"'))
      .map((l) => JSON.parse(l) as { req_id: string; route: string; status: number });
    assert.deepEqual(
      lines.map((l) => l.req_id),
      ids,
    );
    assert.ok(lines.every((l) => l.route === "/me/status" && l.status === 401));
  } finally {
    await server.stop();
    rmSync(dataDir, { recursive: true, force: true });
  }
});
