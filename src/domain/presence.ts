import { newPeer } from "./auth.ts";
import type { DomainContext } from "./context.ts";
import { DomainError } from "./errors.ts";

/**
 * WebRTC presence: the runtime records a node writes for the connections it holds. A node only
 * writes peers it owns (`node` = its name), so nodes sharing one database need distinct names.
 */
export class PresenceService {
  private readonly ctx: DomainContext;

  constructor(ctx: DomainContext) {
    this.ctx = ctx;
  }

  private get node(): string {
    return this.ctx.config.nodeName;
  }

  /** A connection became active: registers the key when unknown (the offer passed the policy) and marks it online here. */
  async connected(publicKey: string, lastAddr: string | null): Promise<void> {
    const now = this.ctx.clock.now();
    await this.ctx.store.transaction(async (tx) => {
      const peer = await tx.peers.get(publicKey);
      if (peer?.status === "blocked") throw new DomainError("forbidden", "PEER_BLOCKED", "this peer is blocked");
      if (!peer) await tx.peers.register(newPeer(publicKey, now));
      await tx.runtime.put({
        public_key: publicKey,
        online: 1,
        last_seen_at: now,
        last_addr: lastAddr,
        rx_bytes: 0,
        tx_bytes: 0,
        node: this.node,
        updated_at: now,
      });
    });
    this.ctx.events.runtime(publicKey, true, this.node);
  }

  /** Refreshes live connections' counters; returns the keys this node no longer owns. */
  async refresh(entries: Array<{ publicKey: string; lastAddr: string | null; rxBytes: number; txBytes: number }>): Promise<string[]> {
    if (entries.length === 0) return [];
    const now = this.ctx.clock.now();
    const lost: string[] = [];
    await this.ctx.store.transaction(async (tx) => {
      for (const e of entries) if (!(await tx.runtime.refresh(e.publicKey, this.node, { ...e, now }))) lost.push(e.publicKey);
    });
    return lost;
  }

  async disconnected(publicKey: string): Promise<void> {
    const now = this.ctx.clock.now();
    await this.ctx.store.transaction((tx) => tx.runtime.markOffline(publicKey, this.node, now));
    this.ctx.events.runtime(publicKey, false, this.node);
  }

  /** Every peer recorded online on this node goes offline (shutdown, or start after a crash). */
  async nodeOffline(): Promise<void> {
    const now = this.ctx.clock.now();
    await this.ctx.store.transaction((tx) => tx.runtime.markNodeOffline(this.node, now));
  }

  /** Of `keys`, those now recorded online on another node: their connections here were replaced. */
  async replacedElsewhere(keys: readonly string[]): Promise<string[]> {
    if (keys.length === 0) return [];
    const owners = await this.ctx.store.read((r) => r.runtime.owners(keys));
    return keys.filter((k) => {
      const owner = owners.get(k);
      return owner !== undefined && owner !== this.node;
    });
  }
}
