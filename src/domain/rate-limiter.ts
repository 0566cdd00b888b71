import type { Clock } from "./clock.ts";

/**
 * Fixed one-minute windows per key, in this process's memory. Limits protect a node from bursts;
 * they are deliberately not shared through the store (a write per request would cost more than
 * the requests they guard). With N nodes a client can reach N times a limit.
 */
export class RateLimiter {
  private windowStart = 0;
  private counts = new Map<string, number>();

  private readonly perMinute: number;
  private readonly clock: Clock;

  constructor(perMinute: number, clock: Clock) {
    this.perMinute = perMinute;
    this.clock = clock;
  }

  /** Counts one request for `key`; returns the seconds to wait when over the limit, else 0. */
  hit(key: string): number {
    return this.over(key, true);
  }

  /** Like `hit`, but counts nothing: the seconds to wait when `key` has already used up this window, else 0. */
  check(key: string): number {
    return this.over(key, false);
  }

  /** The wait when one more request for `key` would exceed the limit; `count` records that request. */
  private over(key: string, count: boolean): number {
    if (this.perMinute <= 0) return 0;
    const now = this.clock.now();
    if (now - this.windowStart >= 60_000 || now < this.windowStart) {
      this.windowStart = now - (now % 60_000);
      this.counts.clear();
    }
    const next = (this.counts.get(key) ?? 0) + 1;
    if (count) this.counts.set(key, next);
    return next > this.perMinute ? Math.max(1, Math.ceil((this.windowStart + 60_000 - now) / 1000)) : 0;
  }
}
