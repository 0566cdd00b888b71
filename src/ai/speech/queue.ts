import { abortReason, EngineBusyError } from "./errors.ts";

export interface QueueLimits {
  /** Jobs running at once. */
  concurrency: number;
  /** Jobs waiting for a slot; one more is refused with EngineBusyError. */
  maxQueued: number;
}

interface Waiter {
  grant: (release: () => void) => void;
  reject: (reason: unknown) => void;
  signal: AbortSignal | undefined;
  onAbort: () => void;
}

/**
 * A counting semaphore with a bounded FIFO of waiters. A slot is held from `acquire` until its
 * release function is called; a waiter whose signal aborts leaves the queue at once.
 */
export class WorkQueue {
  private active = 0;
  private readonly waiting: Waiter[] = [];
  private readonly limits: QueueLimits;

  constructor(limits: QueueLimits) {
    if (!(limits.concurrency >= 1) || !(limits.maxQueued >= 0)) throw new RangeError("concurrency must be ≥ 1 and maxQueued ≥ 0");
    this.limits = limits;
  }

  get running(): number {
    return this.active;
  }

  get queued(): number {
    return this.waiting.length;
  }

  /** Whether `acquire` would be accepted now (run at once or queued). */
  accepts(): boolean {
    return this.active < this.limits.concurrency || this.waiting.length < this.limits.maxQueued;
  }

  /** Resolves with a release function once a slot is free. Throws EngineBusyError when the queue is full. */
  acquire(signal?: AbortSignal): Promise<() => void> {
    if (signal?.aborted) return Promise.reject(abortReason(signal));
    if (this.active < this.limits.concurrency) {
      this.active++;
      return Promise.resolve(this.releaser());
    }
    if (this.waiting.length >= this.limits.maxQueued) return Promise.reject(new EngineBusyError());
    return new Promise((grant, reject) => {
      const waiter: Waiter = {
        grant,
        reject,
        signal,
        onAbort: () => {
          const i = this.waiting.indexOf(waiter);
          if (i >= 0) this.waiting.splice(i, 1);
          reject(abortReason(signal!));
        },
      };
      signal?.addEventListener("abort", waiter.onAbort, { once: true });
      this.waiting.push(waiter);
    });
  }

  /** Runs `work` in a slot; the slot is released when it settles. */
  async run<T>(work: () => Promise<T>, signal?: AbortSignal): Promise<T> {
    const release = await this.acquire(signal);
    try {
      return await work();
    } finally {
      release();
    }
  }

  private releaser(): () => void {
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.waiting.shift();
      if (!next) {
        this.active--;
        return;
      }
      next.signal?.removeEventListener("abort", next.onAbort);
      next.grant(this.releaser());
    };
  }
}
