import { LRUCache } from "lru-cache";
import type { Clock } from "./clock.ts";

const MINUTE_MS = 60_000;

/**
 * `perMinute` requests a minute per key, with a burst of `perMinute`, as GCRA (a token bucket kept
 * as one number per key: the theoretical arrival time of the next request). Unlike fixed windows it
 * holds across any minute: no key gets more than `perMinute` plus what refills meanwhile.
 *
 * Kept in this process's memory. Limits protect a node from bursts; they are deliberately not
 * shared through the store (a write per request would cost more than the requests they guard), so
 * with N nodes a client can reach N times a limit. At most `maxKeys` keys are remembered, the
 * least recently used forgotten first: a key being limited is a key in use, so it stays.
 */
export class RateLimiter {
  /** Key → theoretical arrival time (ms). A time already past means a full bucket, the same as absent. */
  private readonly arrivals: LRUCache<string, number>;
  /** Milliseconds one request uses up of the bucket. */
  private readonly interval: number;

  private readonly perMinute: number;
  private readonly clock: Clock;
  /** Milliseconds of requests a key may have ahead of the clock: `burst` requests' worth. */
  private readonly window: number;

  /** `burst`: requests a key may make at once (default `perMinute`, a minute's worth). */
  constructor(perMinute: number, clock: Clock, maxKeys: number, burst = perMinute) {
    this.perMinute = perMinute;
    this.clock = clock;
    this.interval = perMinute > 0 ? MINUTE_MS / perMinute : 0;
    this.window = burst * this.interval;
    this.arrivals = new LRUCache({ max: Math.max(1, maxKeys) });
  }

  /** Counts one request for `key`; returns the seconds to wait when over the limit (nothing counted then), else 0. */
  hit(key: string): number {
    return this.over(key, true);
  }

  /** Like `hit`, but counts nothing: the seconds to wait when one more request for `key` would be refused, else 0. */
  check(key: string): number {
    return this.over(key, false);
  }

  /** How many keys are remembered (bounded by `maxKeys`). */
  get size(): number {
    return this.arrivals.size;
  }

  private over(key: string, count: boolean): number {
    if (this.perMinute <= 0) return 0;
    const now = this.clock.now();
    const stored = this.arrivals.get(key);
    const next = Math.max(stored ?? now, now) + this.interval;
    const excess = next - now - this.window;
    // A thousandth of a millisecond of slack: `interval` is not always a whole number.
    if (excess > 0.001) return Math.max(1, Math.ceil(excess / 1000));
    if (count) this.arrivals.set(key, next);
    else if (stored !== undefined && stored <= now) this.arrivals.delete(key);
    return 0;
  }
}
