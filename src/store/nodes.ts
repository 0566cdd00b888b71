import type { Db } from "./database.ts";
import type { Tables } from "./schema.ts";

export type NodeRow = Tables["nodes"];
export type NodeState = "serving" | "full" | "draining" | "gone";
export interface NodeLoad {
  connections: number;
  conversations: number;
  cpu: number;
}

/**
 * The fleet's nodes, one row each (fleet.md §1), written by the node itself (its start, each
 * heartbeat, its leaving); a drain is asked of it by any process through `drain_requested_at`.
 */
export class NodeRepository {
  private readonly db: Db;

  constructor(db: Db) {
    this.db = db;
  }

  /** The node starts (again): its row is new, serving, with no drain asked. */
  async start(name: string, endpoint: string | null, now: number): Promise<void> {
    const row = { name, endpoint, started_at: now, heartbeat_at: now, state: "serving", connections: 0, conversations: 0, cpu: 0, drain_requested_at: null };
    const { name: _, ...rest } = row;
    await this.db
      .insertInto("nodes")
      .values(row)
      .onConflict((oc) => oc.column("name").doUpdateSet(rest))
      .execute();
  }

  /**
   * The node's heartbeat with its state and load, in one statement; returns whether a drain was
   * asked of it (undefined: its row is gone, as after `perch nodes forget`).
   */
  async beat(name: string, now: number, state: NodeState, load: NodeLoad): Promise<{ drainRequested: boolean } | undefined> {
    const row = await this.db
      .updateTable("nodes")
      .set({ heartbeat_at: now, state, connections: load.connections, conversations: load.conversations, cpu: load.cpu })
      .where("name", "=", name)
      .returning("drain_requested_at")
      .executeTakeFirst();
    return row && { drainRequested: row.drain_requested_at !== null };
  }

  /**
   * Asks `name` to drain; false when no such node is serving: unknown, gone, or silent since before
   * `aliveSince` (a crashed node's row still says it serves: no one would ever read the request).
   */
  async requestDrain(name: string, now: number, aliveSince: number): Promise<boolean> {
    const r = await this.db
      .updateTable("nodes")
      .set({ drain_requested_at: now })
      .where("name", "=", name)
      .where("state", "!=", "gone")
      .where("heartbeat_at", ">=", aliveSince)
      .executeTakeFirst();
    return r.numUpdatedRows > 0n;
  }

  /** The node left: its row stays, `gone`, with no load. */
  async gone(name: string, now: number): Promise<void> {
    await this.db.updateTable("nodes").set({ state: "gone", heartbeat_at: now, connections: 0, conversations: 0, cpu: 0 }).where("name", "=", name).execute();
  }

  get(name: string): Promise<NodeRow | undefined> {
    return this.db.selectFrom("nodes").selectAll().where("name", "=", name).executeTakeFirst();
  }

  list(): Promise<NodeRow[]> {
    return this.db.selectFrom("nodes").selectAll().orderBy("name").execute();
  }
}
