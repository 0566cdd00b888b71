/**
 * Calls in flight per provider, each provider bounded on its own: a call beyond the bound is
 * refused at once rather than queued (a voice turn fails fast instead of waiting behind others).
 */
export class InFlight {
  private readonly running = new Map<string, number>();

  /** A release function for one more call to `provider`, or undefined when `limit` are already running. */
  tryAcquire(provider: string, limit: number): (() => void) | undefined {
    const now = this.running.get(provider) ?? 0;
    if (now >= limit) return undefined;
    this.running.set(provider, now + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const left = (this.running.get(provider) ?? 1) - 1;
      if (left === 0) this.running.delete(provider);
      else this.running.set(provider, left);
    };
  }

  /** Calls running now to `provider`. */
  count(provider: string): number {
    return this.running.get(provider) ?? 0;
  }
}
