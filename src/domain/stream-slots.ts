import type { DomainContext } from "./context.ts";
import { DomainError } from "./errors.ts";
import { NODE_STALE_MS } from "./presence.ts";

export const MAX_STREAMS_PER_SESSION = 4;
/**
 * Rows of a node that stopped beating are deleted once its heartbeat is this old (or gone). They
 * stop counting sooner, once the heartbeat is stale (`NODE_STALE_MS`): the margin keeps the rows of
 * a node that was only cut off from the store for a while, whose streams may still be open.
 */
export const SILENT_NODE_ROWS_MS = 5 * 60_000;

/**
 * The open event streams of each Side Control session, counted across every node sharing the store:
 * a stream takes a slot (a row) before it sends anything and gives it back when it ends.
 */
export class StreamSlots {
  private readonly ctx: DomainContext;
  /** Slots whose row could not be deleted (the store failed): tried again by `sweep()`. */
  private readonly unreleased = new Set<string>();

  constructor(ctx: DomainContext) {
    this.ctx = ctx;
  }

  private get node(): string {
    return this.ctx.config.node_name;
  }

  /**
   * Takes a slot of `sessionId` for stream `id`: locks the session (one opener at a time on every
   * node), counts its streams on nodes whose heartbeat is fresh, and adds this one when fewer than 4.
   * 429 `RATE_LIMITED` when full; 401 `INVALID_SESSION` when the session ended meanwhile.
   */
  async take(sessionId: string, id: string): Promise<void> {
    const now = this.ctx.clock.now();
    const outcome = await this.ctx.store.transaction(async (tx) => {
      if (!(await tx.liveStreams.lockLiveSession(sessionId, now))) return "ended" as const;
      if ((await tx.liveStreams.countFresh(sessionId, now - NODE_STALE_MS)) >= MAX_STREAMS_PER_SESSION) return "full" as const;
      await tx.liveStreams.insert({ id, session_id: sessionId, node: this.node, opened_at: now });
      return "taken" as const;
    });
    if (outcome === "ended") throw new DomainError("unauthenticated", "INVALID_SESSION", "the session was revoked or has expired");
    if (outcome === "full") {
      throw new DomainError("rate_limited", "RATE_LIMITED", `at most ${MAX_STREAMS_PER_SESSION} event streams may be open per session`, undefined, 1);
    }
  }

  /** Gives the slot back (its row is deleted in the background; a failure is retried by `sweep()`). */
  release(id: string): void {
    this.unreleased.add(id);
    void this.deleteUnreleased();
  }

  /**
   * Upkeep, now and then: slots whose release failed are released again, and rows of nodes silent
   * for `SILENT_NODE_ROWS_MS` (they died and never came back under their name) are deleted; never
   * this node's own (it deletes them itself as its streams end).
   */
  async sweep(): Promise<void> {
    await this.deleteUnreleased();
    const now = this.ctx.clock.now();
    await this.ctx.store.transaction((tx) => tx.liveStreams.deleteOfSilentNodes(now - SILENT_NODE_ROWS_MS, this.node));
  }

  private async deleteUnreleased(): Promise<void> {
    const ids = [...this.unreleased];
    if (ids.length === 0) return;
    try {
      await this.ctx.store.transaction((tx) => tx.liveStreams.delete(ids));
      for (const id of ids) this.unreleased.delete(id);
    } catch {
      // Kept for the next sweep; the node's rows also go when it leaves or starts again.
    }
  }
}
