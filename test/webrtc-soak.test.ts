import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { test } from "node:test";
import { ROOT } from "./support/server.ts";

const CYCLES = 200;

test(`soak: ${CYCLES} sequential connect/disconnect cycles (each with a voice conversation) leave handles, descriptors and memory where they were`, {
  timeout: 300_000,
}, async () => {
  const output = await new Promise<string>((resolve, reject) => {
    execFile(join(ROOT, "node_modules/.bin/tsx"), [join(ROOT, "test/support/soak.ts"), String(CYCLES)], { timeout: 240_000 }, (err, stdout, stderr) =>
      err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout),
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
  // Each connection had its voice conversation, and each was freed with it.
  assert.equal(r.conversations.peak, 1);
  assert.equal(r.conversations.open, 0);
});
