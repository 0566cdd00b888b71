/** `perch` runs on Node's own TypeScript support: nothing of the dev dependencies but the pinned Node. */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { perch } from "./support/cli.ts";
import { ROOT } from "./support/server.ts";

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
