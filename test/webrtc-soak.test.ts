import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { test } from "node:test";
import { ROOT } from "./support/server.ts";

const CYCLES = 200;
/** Two lanes of sequential cycles at once: the same 200 connects (see soak.ts) in about half the time. */
const LANES = 2;

test(`soak: ${CYCLES} connect/disconnect cycles in ${LANES} lanes, each with a voice conversation, leave handles, descriptors and memory where they were`, {
  timeout: 300_000,
}, async () => {
  const output = await new Promise<string>((resolve, reject) => {
    execFile(
      join(ROOT, "node_modules/.bin/tsx"),
      [join(ROOT, "test/support/soak.ts"), String(CYCLES), String(LANES)],
      { timeout: 240_000 },
      (err, stdout, stderr) => (err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout)),
    );
  });
  const r = JSON.parse(output.trim().split("\n").at(-1)!) as {
    before: { fds: number; handles: number; heap_mb: number; rss_mb: number };
    after: { fds: number; handles: number; heap_mb: number; rss_mb: number };
    offline: boolean;
    conversations: { peak: number; open: number };
  };
  assert.ok(r.after.fds - r.before.fds <= 5, `descriptors ${r.before.fds} → ${r.after.fds}`);
  assert.ok(r.after.handles - r.before.handles <= 3, `handles ${r.before.handles} → ${r.after.handles}`);
  assert.ok(r.after.heap_mb - r.before.heap_mb <= 15, `heap ${r.before.heap_mb.toFixed(1)} → ${r.after.heap_mb.toFixed(1)} MB`);
  assert.ok(r.after.rss_mb - r.before.rss_mb <= 80, `rss ${r.before.rss_mb.toFixed(1)} → ${r.after.rss_mb.toFixed(1)} MB`);
  assert.equal(r.offline, true);
  // Each connection had its voice conversation (at most one a lane at a time), and each was freed with it.
  assert.ok(r.conversations.peak >= 1 && r.conversations.peak <= LANES, `peak conversations ${r.conversations.peak}`);
  assert.equal(r.conversations.open, 0);
});
