import { type ChildProcessByStdio, spawn } from "node:child_process";
import { accessSync, constants, statSync } from "node:fs";
import { delimiter, join } from "node:path";
import type { Readable, Writable } from "node:stream";

/** Keep this much of a child's standard error for error messages. */
const STDERR_TAIL = 4096;

export interface ChildExit {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** The last few KiB of standard error. */
  stderr: string;
}

export interface Child {
  proc: ChildProcessByStdio<Writable, Readable, Readable>;
  /** Settles when the child has exited and its streams are closed; rejects only when it could not start. */
  exited: Promise<ChildExit>;
  kill(): void;
}

/** Starts `command` with piped stdio; an abort of `signal` kills it (SIGKILL). */
export function startChild(command: string, args: readonly string[], signal?: AbortSignal): Child {
  const proc = spawn(command, args, { stdio: ["pipe", "pipe", "pipe"] });
  let stderr = "";
  proc.stderr.setEncoding("utf8");
  proc.stderr.on("data", (text: string) => {
    stderr = (stderr + text).slice(-STDERR_TAIL);
  });
  // A child that exits before reading all its input makes our writes fail with EPIPE; its exit status tells the story.
  proc.stdin.on("error", () => {});
  const kill = () => {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
  };
  const onAbort = () => kill();
  signal?.addEventListener("abort", onAbort, { once: true });
  const exited = new Promise<ChildExit>((resolve, reject) => {
    proc.once("error", (error) => {
      signal?.removeEventListener("abort", onAbort);
      reject(error);
    });
    proc.once("close", (code, sig) => {
      signal?.removeEventListener("abort", onAbort);
      resolve({ code, signal: sig, stderr: stderr.trim() });
    });
  });
  // Callers that only iterate stdout must not see an unhandled rejection when the spawn fails.
  exited.catch(() => {});
  if (signal?.aborted) kill();
  return { proc, exited, kill };
}

/** The first executable file called `name` on PATH. */
export function findExecutable(name: string): string | undefined {
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    if (!dir) continue;
    const candidate = join(dir, name);
    try {
      if (!statSync(candidate).isFile()) continue;
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {}
  }
  return undefined;
}

/** Writes `chunk` to a child's stdin, waiting for the pipe to drain when it is full. */
export function writeInput(stdin: Writable, chunk: Uint8Array): Promise<void> {
  if (stdin.destroyed || stdin.writableEnded) return Promise.resolve();
  if (stdin.write(chunk)) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      stdin.off("drain", done);
      stdin.off("close", done);
      resolve();
    };
    stdin.on("drain", done);
    stdin.on("close", done);
  });
}
