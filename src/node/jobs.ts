import type { Logger } from "pino";

/**
 * A running node's periodic jobs (cleanup, log flushing, and whatever a capability adds with one
 * `every` line): each runs at most once at a time, a failure is logged and the job runs again at
 * its next tick, and `stop()` waits for the runs under way, so nothing touches the store after it closes.
 */
export class Jobs {
  private readonly logger: Logger;
  private readonly timers: NodeJS.Timeout[] = [];
  private readonly running = new Set<Promise<void>>();
  private stopped = false;

  constructor(logger: Logger) {
    this.logger = logger;
  }

  /** Runs `job` every `intervalMs` (first after one interval) until `stop()`; the timer keeps no process alive. */
  every(name: string, intervalMs: number, job: () => unknown): void {
    if (this.stopped) throw new Error(`job ${name} added after the node's jobs stopped`);
    let busy = false;
    const timer = setInterval(() => {
      if (busy || this.stopped) return;
      busy = true;
      const run = (async () => job())()
        .then(
          () => undefined,
          (err: unknown) => this.logger.warn({ err, job: name }, `${name} failed`),
        )
        .finally(() => {
          busy = false;
          this.running.delete(run);
        });
      this.running.add(run);
    }, intervalMs);
    timer.unref();
    this.timers.push(timer);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    for (const t of this.timers) clearInterval(t);
    await Promise.all(this.running);
  }
}

/**
 * What a node opened, closed in the reverse order (what was opened last closes first), once; a
 * closer that fails does not keep the others open (the first failure is thrown after all ran).
 */
export class Closers {
  private readonly stack: Array<() => unknown> = [];
  private closing: Promise<void> | undefined;

  defer(close: () => unknown): void {
    if (this.closing) throw new Error("a closer added after closing");
    this.stack.push(close);
  }

  close(): Promise<void> {
    this.closing ??= (async () => {
      const failures: unknown[] = [];
      for (const close of this.stack.reverse()) await (async () => close())().catch((err: unknown) => failures.push(err));
      if (failures.length > 0) throw failures[0];
    })();
    return this.closing;
  }
}
