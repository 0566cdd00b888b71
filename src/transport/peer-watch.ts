import { topics } from "../bus/index.ts";
import type { PeerMessage } from "../domain/changes.ts";
import type { Domain } from "../domain/index.ts";

/**
 * Tells the transport, at once, that a connected peer was blocked or removed, whichever process
 * did it (`perch peers block/remove` runs apart from the node, writing to the store directly):
 * the event bus's `peers` topic carries it, in this process, across processes on PostgreSQL
 * (`NOTIFY`), and from other processes on SQLite (`SqliteBus`, reading what they wrote to the
 * file). After a gap in the bus (the node stopped listening for a while) every connected peer is
 * checked in the store.
 */
export class PeerWatch {
  private readonly domain: Domain;
  private readonly connected: () => string[];
  private readonly cut: (key: string, why: "blocked" | "removed") => void;
  private readonly onError: (err: unknown) => void;
  private readonly unsubscribe: () => void;

  constructor(o: {
    domain: Domain;
    /** Keys of the peers connected here. */
    connected: () => string[];
    /** Closes the key's connection here. */
    cut: (key: string, why: "blocked" | "removed") => void;
    onError: (err: unknown) => void;
  }) {
    this.domain = o.domain;
    this.connected = o.connected;
    this.cut = o.cut;
    this.onError = o.onError;
    this.unsubscribe = o.domain.ctx.events.bus.subscribe(topics.peers, {
      message: (m) => {
        const { kind, key } = m as PeerMessage;
        if (kind === "blocked" || kind === "removed") this.cut(key, kind);
      },
      gap: () => void this.recheck(),
    });
  }

  /** Every connected peer, checked in the store (after the bus missed messages). */
  private async recheck(): Promise<void> {
    try {
      for (const key of this.connected()) {
        const peer = await this.domain.ctx.store.read((r) => r.peers.get(key));
        if (!peer) this.cut(key, "removed");
        else if (peer.status === "blocked") this.cut(key, "blocked");
      }
    } catch (err) {
      this.onError(err);
    }
  }

  stop(): void {
    this.unsubscribe();
  }
}
