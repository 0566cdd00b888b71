import type { Logger } from "pino";
import type { Domain } from "../domain/index.ts";

/** What upkeep reads of a connection held here. */
export interface HeldConnection {
  readonly publicKey: string;
  readonly active: boolean;
  readonly link: { bytes(): { rx: number; tx: number }; remoteAddress(): string | undefined };
}

/**
 * This node's share of presence while its transport runs (the node's heartbeat is the server's):
 * - every `ownershipCheckMs`, the check that each peer connected here is still recorded here (a
 *   newer connection on another node replaced it: ours is closed);
 * - every `runtimeRefreshMs`, the peers' runtime (address, byte counters), which also tells of
 *   replacements the check above raced with.
 */
export class PresenceUpkeep {
  private readonly o: {
    domain: Domain;
    logger: Logger;
    ownershipCheckMs: number;
    runtimeRefreshMs: number;
    held: () => Iterable<HeldConnection>;
    /** Closes the key's connection here: it was replaced elsewhere. */
    replaced: (key: string) => void;
  };
  private readonly ticker: NodeJS.Timeout;
  private ticking = false;
  private stopped = false;
  private lastRefresh = 0;

  constructor(o: PresenceUpkeep["o"]) {
    this.o = o;
    this.ticker = setInterval(() => void this.tick(), o.ownershipCheckMs);
    this.ticker.unref();
  }

  stop(): void {
    this.stopped = true;
    clearInterval(this.ticker);
  }
  private async tick(): Promise<void> {
    if (this.ticking || this.stopped) return;
    this.ticking = true;
    const { presence } = this.o.domain;
    try {
      const active = [...this.o.held()].filter((c) => c.active);
      for (const key of await presence.replacedElsewhere(active.map((c) => c.publicKey))) this.o.replaced(key);
      if (Date.now() - this.lastRefresh >= this.o.runtimeRefreshMs) {
        this.lastRefresh = Date.now();
        const entries = active
          .filter((c) => c.active)
          .map((c) => {
            const { rx, tx } = c.link.bytes();
            return { publicKey: c.publicKey, lastAddr: c.link.remoteAddress() ?? null, rxBytes: rx, txBytes: tx };
          });
        for (const key of await presence.refresh(entries)) this.o.replaced(key);
      }
    } catch (err) {
      this.o.logger.warn({ err }, "runtime upkeep failed");
    } finally {
      this.ticking = false;
    }
  }
}
