import type { Db } from "./database.ts";
import type { Tables } from "./schema.ts";

export type RuntimeRow = Tables["peer_runtime"];

/**
 * Where and whether a peer is connected; written by the node that holds its WebRTC connection.
 * Every write after the first is conditional on `node`: a node only touches the peers it owns, so
 * a newer connection on another node is never overwritten.
 */
export class RuntimeRepository {
  private readonly db: Db;

  constructor(db: Db) {
    this.db = db;
  }

  get(publicKey: string): Promise<RuntimeRow | undefined> {
    return this.db.selectFrom("peer_runtime").selectAll().where("public_key", "=", publicKey).executeTakeFirst();
  }

  /** The peer's record with its node's last heartbeat (null: the node never beat, or left). */
  getWithBeat(publicKey: string): Promise<(RuntimeRow & { beat_at: number | null }) | undefined> {
    return this.db
      .selectFrom("peer_runtime as r")
      .leftJoin("node_heartbeats as h", "h.node", "r.node")
      .selectAll("r")
      .select("h.beat_at")
      .where("r.public_key", "=", publicKey)
      .executeTakeFirst();
  }

  /** Records `node`'s heartbeat at `now` (one row per node, however many peers it holds). */
  async beat(node: string, now: number): Promise<void> {
    await this.db
      .insertInto("node_heartbeats")
      .values({ node, beat_at: now })
      .onConflict((oc) => oc.column("node").doUpdateSet({ beat_at: now }))
      .execute();
  }

  /** `node`'s last heartbeat; undefined when it never beat, or left. */
  async beatAt(node: string): Promise<number | undefined> {
    const row = await this.db.selectFrom("node_heartbeats").select("beat_at").where("node", "=", node).executeTakeFirst();
    return row === undefined ? undefined : Number(row.beat_at);
  }

  /** `node` left: its heartbeat row goes. */
  async endBeat(node: string): Promise<void> {
    await this.db.deleteFrom("node_heartbeats").where("node", "=", node).execute();
  }

  async put(row: RuntimeRow): Promise<void> {
    const { public_key, ...rest } = row;
    await this.db
      .insertInto("peer_runtime")
      .values(row)
      .onConflict((oc) => oc.column("public_key").doUpdateSet(rest))
      .execute();
  }

  /** Refreshes a live connection's counters; false when `node` no longer owns the peer. */
  async refresh(publicKey: string, node: string, o: { lastAddr: string | null; rxBytes: number; txBytes: number; now: number }): Promise<boolean> {
    const r = await this.db
      .updateTable("peer_runtime")
      .set({ last_seen_at: o.now, last_addr: o.lastAddr, rx_bytes: o.rxBytes, tx_bytes: o.txBytes, updated_at: o.now })
      .where("public_key", "=", publicKey)
      .where("node", "=", node)
      .where("online", "=", 1)
      .executeTakeFirst();
    return r.numUpdatedRows > 0n;
  }

  /** Marks the peer offline if `node` still owns it, keeping `last_seen_at` at `now`. */
  async markOffline(publicKey: string, node: string, now: number): Promise<void> {
    await this.db
      .updateTable("peer_runtime")
      .set({ online: 0, last_seen_at: now, updated_at: now })
      .where("public_key", "=", publicKey)
      .where("node", "=", node)
      .where("online", "=", 1)
      .execute();
  }

  /**
   * Marks every peer `node` holds offline; returns their keys. `seen`: the node held them until now
   * (its shutdown), so `last_seen_at` is `now`; after a crash it is left as the node last wrote it.
   */
  async markNodeOffline(node: string, now: number, o: { seen: boolean }): Promise<string[]> {
    const rows = await this.db
      .updateTable("peer_runtime")
      .set(o.seen ? { online: 0, last_seen_at: now, updated_at: now } : { online: 0, updated_at: now })
      .where("node", "=", node)
      .where("online", "=", 1)
      .returning("public_key")
      .execute();
    return rows.map((r) => r.public_key);
  }

  /** Which node each of `keys` is recorded online on (absent: offline or unknown). */
  /** The keys of `keys` that have a runtime row at all (a removed peer's went with it). */
  async recorded(keys: readonly string[]): Promise<Set<string>> {
    const out = new Set<string>();
    for (let i = 0; i < keys.length; i += 500) {
      const rows = await this.db
        .selectFrom("peer_runtime")
        .select(["public_key"])
        .where("public_key", "in", keys.slice(i, i + 500))
        .execute();
      for (const r of rows) out.add(r.public_key);
    }
    return out;
  }

  async owners(keys: readonly string[]): Promise<Map<string, string>> {
    const out = new Map<string, string>();
    for (let i = 0; i < keys.length; i += 500) {
      const rows = await this.db
        .selectFrom("peer_runtime")
        .select(["public_key", "node"])
        .where("public_key", "in", keys.slice(i, i + 500))
        .where("online", "=", 1)
        .execute();
      for (const r of rows) if (r.node !== null) out.set(r.public_key, r.node);
    }
    return out;
  }
}
