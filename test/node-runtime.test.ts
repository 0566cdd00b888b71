/** `perch` runs on Node's own TypeScript support: nothing of the dev dependencies but the pinned Node. */
import assert from "node:assert/strict";
import { readdirSync, readFileSync, rmSync } from "node:fs";
import { availableParallelism } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { perch } from "./support/cli.ts";
import { ROOT, spawnServer, tempDir } from "./support/server.ts";

test("npm start, npm run perch and bin/perch run without tsx, and print no warning", async () => {
  const scripts = (JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { scripts: Record<string, string> }).scripts;
  for (const name of ["start", "perch"]) assert.doesNotMatch(scripts[name] ?? "", /tsx/, `npm run ${name}`);
  assert.doesNotMatch(readFileSync(join(ROOT, "bin/perch"), "utf8"), /^[^#]*\btsx\b/m, "bin/perch runs no tsx");
  // Only the system's directories on the path: bin/perch finds the pinned Node itself.
  const r = await perch(["keygen"], { PATH: "/usr/bin:/bin" });
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stderr, "");
  assert.match((JSON.parse(r.stdout) as { public_key: string }).public_key, /^[1-9A-HJ-NP-Za-km-z]{32,44}$/);
});

/** The server's process as the system sees it: its arguments and its environment. */
function processOf(pid: number): { args: string[]; env: Map<string, string> } {
  const split = (file: string) => readFileSync(`/proc/${pid}/${file}`, "utf8").split("\0").filter(Boolean);
  return { args: split("cmdline"), env: new Map(split("environ").map((kv) => [kv.slice(0, kv.indexOf("=")), kv.slice(kv.indexOf("=") + 1)])) };
}

/** The processes `pid` started (its children), by their ids. */
function childrenOf(pid: number): number[] {
  return readdirSync(`/proc/${pid}/task`).flatMap((task) => readFileSync(`/proc/${pid}/task/${task}/children`, "utf8").split(" ").filter(Boolean).map(Number));
}

test("perch serve runs with the memory defaults of bin/perch, unless the operator set them", { skip: process.platform !== "linux" }, async () => {
  const dir = tempDir();
  // Not in the environment at all, as on a machine where nobody set it.
  const inherited = process.env.MALLOC_ARENA_MAX;
  delete process.env.MALLOC_ARENA_MAX;
  const none = { GLIBC_TUNABLES: "", NODE_OPTIONS: "" };
  const started = Promise.all([
    // Recognition preloaded: a node with no agent starts its engines only on first use (docs/voice.md).
    spawnServer({ ...none, PERCH_DATA_DIR: join(dir, "plain"), PERCH_ENGINES_PRELOAD: "recognition" }),
    spawnServer({ ...none, PERCH_DATA_DIR: join(dir, "operators"), MALLOC_ARENA_MAX: "7", NODE_OPTIONS: "--max-semi-space-size=4" }),
  ]);
  if (inherited !== undefined) process.env.MALLOC_ARENA_MAX = inherited;
  const [plain, operators] = await started;
  try {
    // docs/decisions.md, "Memory of a process": a young generation of at most 16 MB a
    // semi-space, one malloc arena a core (at least two).
    const p = processOf(plain.process.pid!);
    assert.ok(p.args.includes("--max-semi-space-size=16"), p.args.join(" "));
    assert.equal(p.env.get("MALLOC_ARENA_MAX"), String(Math.max(2, availableParallelism())));
    const o = processOf(operators.process.pid!);
    assert.ok(!o.args.some((a) => a.startsWith("--max-semi-space-size")), o.args.join(" "));
    assert.equal(o.env.get("NODE_OPTIONS"), "--max-semi-space-size=4");
    assert.equal(o.env.get("MALLOC_ARENA_MAX"), "7");
    // Its recogniser processes, which hold no connection, run without the young generation's cap.
    let forked: string[][] = [];
    for (let i = 0; i < 600 && forked.length === 0; i++) {
      forked = childrenOf(plain.process.pid!)
        .map((pid) => processOf(pid).args)
        .filter((args) => args.some((a) => a.endsWith("recognition-worker.ts")));
      if (forked.length === 0) await new Promise((r) => setTimeout(r, 100));
    }
    assert.ok(forked.length > 0, "no recogniser process started");
    for (const args of forked) assert.ok(!args.some((a) => a.startsWith("--max-semi-space-size")), args.join(" "));
  } finally {
    await Promise.all([plain.stop(), operators.stop()]);
    rmSync(dir, { recursive: true, force: true });
  }
});
