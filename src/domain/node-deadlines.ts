import type { Clock } from "./clock.ts";
import type { PeerService } from "./peers.ts";

/** Something showing a device online on a node (a Side Control stream hub). */
export interface NodeWatcher {
  /** The node stopped beating: what the store says of its devices changed to offline. */
  nodeStale(): void;
}

/** After a failed heartbeat read, the next one. */
const RETRY_MS = 1_000;

/**
 * When the devices recorded online on each node turn offline in the store's view (the node's
 * last heartbeat plus `NODE_STALE_MS`; a node that dies writes nothing more): one timer per node
 * and, at its deadline, one read of the node's heartbeat. A node that beat meanwhile gets a later
 * deadline; one that did not has its watchers told at once, so the `runtime` event follows the
 * store's change instead of waiting for a periodic re-read.
 */
export class NodeDeadlines {
  private readonly clock: Clock;
  private readonly peers: PeerService;
  private readonly byNode = new Map<string, { at: number; timer: NodeJS.Timeout | undefined; watchers: Set<NodeWatcher> }>();
  private readonly nodeOf = new Map<NodeWatcher, string>();

  constructor(clock: Clock, peers: PeerService) {
    this.clock = clock;
    this.peers = peers;
  }

  /** `w` shows its device online on `node` until `at` (what it last read); without them, offline: nothing to watch. */
  watch(w: NodeWatcher, node?: string, at?: number): void {
    const previous = this.nodeOf.get(w);
    if (previous !== undefined && previous !== node) this.unwatch(w);
    if (node === undefined || at === undefined) return;
    this.nodeOf.set(w, node);
    const e = this.byNode.get(node);
    if (!e) {
      const entry = { at, timer: undefined, watchers: new Set([w]) };
      this.byNode.set(node, entry);
      this.arm(node, entry);
      return;
    }
    e.watchers.add(w);
    if (at > e.at) {
      e.at = at;
      if (e.timer) this.arm(node, e);
    }
  }

  unwatch(w: NodeWatcher): void {
    const node = this.nodeOf.get(w);
    if (node === undefined) return;
    this.nodeOf.delete(w);
    const e = this.byNode.get(node);
    if (!e?.watchers.delete(w) || e.watchers.size > 0) return;
    clearTimeout(e.timer);
    this.byNode.delete(node);
  }

  private arm(node: string, e: { at: number; timer: NodeJS.Timeout | undefined }): void {
    clearTimeout(e.timer);
    // Just past the deadline: the store's view says offline from `at` on.
    e.timer = setTimeout(() => void this.due(node), Math.max(0, e.at - this.clock.now()) + 1);
    e.timer.unref();
  }

  private async due(node: string): Promise<void> {
    const e = this.byNode.get(node);
    if (!e) return;
    e.timer = undefined;
    let at: number | undefined;
    try {
      at = await this.peers.nodeOfflineAt(node);
    } catch {
      // The store cannot be reached: nothing is known; asked again shortly.
      at = this.clock.now() + RETRY_MS;
    }
    if (this.byNode.get(node) !== e || e.timer) return;
    e.at = Math.max(e.at, at ?? 0);
    if (e.at > this.clock.now()) {
      this.arm(node, e);
      return;
    }
    this.byNode.delete(node);
    for (const w of e.watchers) {
      this.nodeOf.delete(w);
      w.nodeStale();
    }
  }
}
