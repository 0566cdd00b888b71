/**
 * The conversation's clock: the monotonic time and the timers every part of a conversation runs
 * on (the jitter buffer's tick, the end of a turn without packets, the playout's pacing). Tests
 * drive a fake one, so that what happens at which moment is exact and nothing sleeps.
 */
export interface VoiceClock {
  /** Milliseconds, monotonic (performance.now()). */
  now(): number;
  /** Calls `fn` once after `ms`; returns what cancels it. */
  after(ms: number, fn: () => void): () => void;
  /** Calls `fn` every `ms`; returns what stops it. */
  every(ms: number, fn: () => void): () => void;
}

export const systemClock: VoiceClock = {
  now: () => performance.now(),
  after(ms, fn) {
    const timer = setTimeout(fn, ms);
    return () => clearTimeout(timer);
  },
  every(ms, fn) {
    const timer = setInterval(fn, ms);
    return () => clearInterval(timer);
  },
};
