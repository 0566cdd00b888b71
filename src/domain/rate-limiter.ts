import type { Clock } from "./clock.ts";

/**
 * Fixed one-minute windows per key, in this process's memory. Limits protect a node from bursts;
 * they are deliberately not shared through the store (a write per request would cost more than
 * the requests they guard). With N nodes a client can reach N times a limit.
 */
export class RateLimiter {
  private windowStart = 0;
  private counts = new Map<string, number>();

  constructor(
    private readonly perMinute: number,
    private readonly clock: Clock,
  ) {}

  /** Counts one request for `key`; returns the seconds to wait when over the limit, else 0. */
  hit(key: string): number {
    if (this.perMinute <= 0) return 0;
    const now = this.clock.now();
    if (now - this.windowStart >= 60_000 || now < this.windowStart) {
      this.windowStart = now - (now % 60_000);
      this.counts.clear();
    }
    const n = (this.counts.get(key) ?? 0) + 1;
    this.counts.set(key, n);
    return n > this.perMinute ? Math.max(1, Math.ceil((this.windowStart + 60_000 - now) / 1000)) : 0;
  }

  /** Like `hit`, but counts nothing: the seconds to wait when `key` has already used up this window, else 0. */
  check(key: string): number {
    if (this.perMinute <= 0) return 0;
    const now = this.clock.now();
    if (now - this.windowStart >= 60_000 || now < this.windowStart) return 0;
    return (this.counts.get(key) ?? 0) >= this.perMinute ? Math.max(1, Math.ceil((this.windowStart + 60_000 - now) / 1000)) : 0;
  }
}
