import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { ROOT } from "./server.ts";

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * Runs the `perch` command line with `env` on top of this process's environment. Killed after 90 s
 * (a result of code -1): a hang fails the test, while a loaded machine still gets its answer.
 */
export function perch(args: string[], env: Record<string, string>): Promise<CliResult> {
  return new Promise((resolve) => {
    execFile(join(ROOT, "bin/perch"), args, { env: { ...process.env, ...env }, timeout: 90_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? ((err as { code?: number }).code ?? -1) : 0, stdout, stderr });
    });
  });
}

/** Runs a command that must succeed and parses its JSON output. */
export async function perchJson<T = unknown>(args: string[], env: Record<string, string>): Promise<T> {
  const r = await perch(args, env);
  assert.equal(r.code, 0, `perch ${args.join(" ")} failed:\n${r.stderr}`);
  return JSON.parse(r.stdout) as T;
}

/** Asserts a command failed with exit code 1, a message on stderr matching `message`, and no output. */
export function assertFails(r: CliResult, message: RegExp): void {
  assert.equal(r.code, 1, `expected exit code 1, got ${r.code}:\n${r.stdout}${r.stderr}`);
  assert.match(r.stderr, message);
  assert.equal(r.stdout, "");
}
