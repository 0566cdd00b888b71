import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { ROOT } from "./server.ts";

/** No configuration file unless PERCH_CONFIG names one: a `perch.yaml` in the checkout (the README's tour writes one) never reaches a test. */
export const UNCONFIGURED = { PERCH_CONFIG: "" };

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * Runs the `perch` command line with `env` on top of this process's environment (in `cwd`, default
 * this process's). A `perch.yaml` of the developer's in the working directory is not read unless
 * PERCH_CONFIG names it (UNCONFIGURED). Killed after 90 s
 * (a result of code -1): a hang fails the test, while a loaded machine still gets its answer.
 */
export function perch(args: string[], env: Record<string, string | undefined>, cwd?: string): Promise<CliResult> {
  return new Promise((resolve) => {
    const environment: Record<string, string | undefined> = { ...UNCONFIGURED, ...process.env, ...env };
    for (const [k, v] of Object.entries(environment)) if (v === undefined) delete environment[k];
    execFile(join(ROOT, "bin/perch"), args, { env: environment, timeout: 90_000, ...(cwd ? { cwd } : {}) }, (err, stdout, stderr) => {
      resolve({ code: err ? ((err as { code?: number }).code ?? -1) : 0, stdout, stderr });
    });
  });
}

/** Runs a command that must succeed and parses its JSON output. */
export async function perchJson<T = unknown>(args: string[], env: Record<string, string | undefined>, cwd?: string): Promise<T> {
  const r = await perch(args, env, cwd);
  assert.equal(r.code, 0, `perch ${args.join(" ")} failed:\n${r.stderr}`);
  return JSON.parse(r.stdout) as T;
}

/** Asserts a command failed with exit code 1, a message on stderr matching `message`, and no output. */
export function assertFails(r: CliResult, message: RegExp): void {
  assert.equal(r.code, 1, `expected exit code 1, got ${r.code}:\n${r.stdout}${r.stderr}`);
  assert.match(r.stderr, message);
  assert.equal(r.stdout, "");
}
