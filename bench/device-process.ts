/**
 * A process of simulated devices seen from its bench (bench/crowd.ts, capacity.ts and fleet.ts fork
 * crowd-worker.ts, capacity-worker.ts and fleet-worker.ts), commanded over the IPC channel: `ask`
 * sends a command under a fresh id and resolves with the reply of that id, `tell` sends one that
 * has none. The worker's side is bench/device-worker.ts.
 */
import { type ChildProcess, fork } from "node:child_process";
import { setPriority } from "node:os";
import { join } from "node:path";
import { ROOT } from "./support.ts";

/** The answer to every command still waiting when the process exits. */
export type Released = { type: "released"; id: number };

/** A command without its `id` (each of a union's members). */
type Unnumbered<C> = C extends unknown ? Omit<C, "id"> : never;

export class DeviceProcess<Command extends { type: string }, Reply extends { id: number }> {
  readonly child: ChildProcess;
  private readonly waiting = new Map<number, (r: Reply | Released) => void>();
  private next = 0;

  /** Forks `script` (a path below the checkout) with `env` added to this process's environment. */
  constructor(script: string, env: Record<string, string>) {
    // Node's own type stripping, as `perch serve` runs: no loader, a lighter process than tsx.
    this.child = fork(join(ROOT, script), [], {
      execArgv: ["--disable-warning=ExperimentalWarning"],
      env: { ...process.env, ...env },
      stdio: ["ignore", "inherit", "inherit", "ipc"],
    });
    // The simulated devices stand for other machines: on a shared machine they yield the CPU to
    // the server under test (it is measured, they only load it). BENCH_CROWD_NICE=0 turns it off.
    const nice = Number(process.env.BENCH_CROWD_NICE ?? 10);
    if (nice && this.child.pid !== undefined) setPriority(this.child.pid, nice);
    this.child.on("message", (r: Reply) => {
      const done = this.waiting.get(r.id);
      if (!done) return;
      this.waiting.delete(r.id);
      done(r);
    });
    this.child.once("exit", () => {
      for (const done of this.waiting.values()) done({ type: "released", id: -1 });
      this.waiting.clear();
    });
  }

  /** Sends `command` under a fresh id; its reply (or `released` if the process exits first). */
  ask<R extends Reply | Released>(command: Unnumbered<Extract<Command, { id: number }>>): Promise<R> {
    return new Promise((resolve, reject) => {
      if (this.child.exitCode !== null || !this.child.connected) {
        reject(new Error(`device process ${this.child.pid} (${this.child.spawnargs.at(-1)}) is gone`));
        return;
      }
      const id = ++this.next;
      this.waiting.set(id, resolve as (r: Reply | Released) => void);
      this.child.send({ ...command, id });
    });
  }

  tell(command: Command): void {
    if (this.child.connected) this.child.send(command);
  }
}
