import type { NodeLoad, NodeState } from "../store/nodes.ts";
import { newPeer } from "./auth.ts";
import type { DomainContext } from "./context.ts";
import { DomainError } from "./errors.ts";

/** How often a serving node writes its heartbeat. */
export const NODE_BEAT_MS = 2_000;
/**
 * A peer recorded online on a node whose last heartbeat is older than this is offline, and an event
 * stream held there no longer counts: the node died (a node that stops cleanly clears both itself). Readers compare the node's one
 * heartbeat row, so a dead node's peers show offline within this bound without per-peer writes.
 */
export const NODE_STALE_MS = 8_000;

/**
 * A node's presence in the store: its heartbeat (every serving node beats, so that what it holds
 * counts only while it lives: its peers' online records and its event streams) and the runtime
 * records it writes for the WebRTC connections it holds. A node only writes peers it owns (`node` =
 * its name), so nodes sharing one database need distinct names.
 */
export class PresenceService {
  private readonly ctx: DomainContext;

  constructor(ctx: DomainContext) {
    this.ctx = ctx;
  }

  private get node(): string {
    return this.ctx.config.node_name;
  }

  /**
   * An offer was answered (it passed every check): its key is registered now, not once the
   * connection is up, so that a device that sees itself connected is a peer the operator can block
   * or remove at once (`perch peers block` right after it connected found no peer before).
   */
  async answered(publicKey: string): Promise<void> {
    const now = this.ctx.clock.now();
    await this.ctx.store.transaction((tx) => tx.peers.register(newPeer(publicKey, now)));
  }

  /**
   * A connection became active: marks it online here. The offer registered the key; one blocked or
   * removed since (its bus message found no connection yet to close) is refused here.
   */
  async connected(publicKey: string, lastAddr: string | null): Promise<void> {
    const now = this.ctx.clock.now();
    await this.ctx.store.transaction(async (tx) => {
      const peer = await tx.peers.get(publicKey);
      if (peer?.status === "blocked") throw new DomainError("forbidden", "PEER_BLOCKED", "this peer is blocked");
      if (!peer) throw new DomainError("forbidden", "PEER_REMOVED", "this peer was removed");
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
    if (lost.length === 0) return lost;
    // A peer removed meanwhile has no row left: the peer watch closes its connection as removed, not replaced.
    const recorded = await this.ctx.store.read((r) => r.runtime.recorded(lost));
    return lost.filter((k) => recorded.has(k));
  }

  async disconnected(publicKey: string): Promise<void> {
    const now = this.ctx.clock.now();
    await this.ctx.store.transaction((tx) => tx.runtime.markOffline(publicKey, this.node, now));
    this.ctx.events.runtime(publicKey, false, this.node);
  }

  /**
   * This node starts: what a previous run of it left (after a crash) goes, the peers recorded online
   * here go offline and the event stream rows held here are deleted, and its first heartbeat is written.
   */
  async join(endpoint: string | null = null): Promise<void> {
    const now = this.ctx.clock.now();
    await this.ctx.store.transaction(async (tx) => {
      await tx.runtime.markNodeOffline(this.node, now, { seen: false });
      await tx.liveStreams.deleteNode(this.node);
      await tx.runtime.beat(this.node, now);
      await tx.nodes.start(this.node, endpoint, now);
    });
  }

  /**
   * This node is alive: one transaction, however many peers it holds, with its state and load in its
   * `nodes` row (fleet.md §1) when given; says whether a drain was asked of it since.
   */
  async beat(report?: { state: NodeState; load: NodeLoad }): Promise<{ drainRequested: boolean }> {
    const now = this.ctx.clock.now();
    return this.ctx.store.transaction(async (tx) => {
      await tx.runtime.beat(this.node, now);
      if (!report) return { drainRequested: false };
      return (await tx.nodes.beat(this.node, now, report.state, report.load)) ?? { drainRequested: false };
    });
  }

  /**
   * This node leaves (shutdown): its peers go offline (the one place that writes them so at
   * shutdown, and tells their subscribers), its event stream rows and its heartbeat row go.
   */
  async leave(): Promise<void> {
    const now = this.ctx.clock.now();
    const offline = await this.ctx.store.transaction(async (tx) => {
      const keys = await tx.runtime.markNodeOffline(this.node, now, { seen: true });
      await tx.liveStreams.deleteNode(this.node);
      await tx.runtime.endBeat(this.node);
      await tx.nodes.gone(this.node, now);
      return keys;
    });
    for (const key of offline) this.ctx.events.runtime(key, false, this.node);
  }

  /**
   * Beats every `NODE_BEAT_MS` until stopped. A failed beat (the store unreachable) is reported
   * once per outage through `onError` and tried again at the next beat. `stop()` resolves once no
   * beat is under way: one finishing after `leave()` would bring the row back.
   */
  startHeartbeat(o: {
    onError: (err: unknown) => void;
    onRecovered?: () => void;
    /** The node's state and load, written with each beat. */
    report?: () => { state: NodeState; load: NodeLoad };
    /** A drain was asked of this node (`perch nodes drain`, from any process): called at each beat that finds it asked. */
    onDrainRequested?: () => void;
  }): { stop(): Promise<void> } {
    let beating: Promise<void> | undefined;
    let failing = false;
    const timer = setInterval(() => {
      if (beating) return;
      beating = this.beat(o.report?.())
        .then(
          ({ drainRequested }) => {
            if (failing) o.onRecovered?.();
            failing = false;
            if (drainRequested) o.onDrainRequested?.();
          },
          (err) => {
            if (!failing) o.onError(err);
            failing = true;
          },
        )
        .finally(() => (beating = undefined));
    }, NODE_BEAT_MS);
    timer.unref();
    return {
      stop: async () => {
        clearInterval(timer);
        await beating;
      },
    };
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
