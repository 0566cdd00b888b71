import type { Db } from "./database.ts";
import type { DialectName } from "./migrations.ts";
import type { Tables } from "./schema.ts";

export type LiveStreamRow = Tables["live_streams"];

/**
 * The open Side Control event streams of every node sharing the store, one row each. A row counts
 * while its node's heartbeat is fresh; a node deletes its rows as its streams end, and all of them
 * when it leaves or starts again after a crash.
 */
export class LiveStreamRepository {
  private readonly db: Db;
  private readonly dialect: DialectName;

  constructor(db: Db, dialect: DialectName) {
    this.db = db;
    this.dialect = dialect;
  }

  /**
   * Whether the session is live (unrevoked, unexpired); on PostgreSQL its row stays locked
   * (`FOR UPDATE`) until the transaction ends, so that the session's streams are counted and added
   * by one transaction at a time on every node. SQLite's write transactions already run one at a time.
   */
  async lockLiveSession(sessionId: string, now: number): Promise<boolean> {
    let q = this.db.selectFrom("sessions").select("id").where("id", "=", sessionId).where("revoked_at", "is", null).where("expires_at", ">", now);
    if (this.dialect === "postgres") q = q.forUpdate();
    return (await q.executeTakeFirst()) !== undefined;
  }

  /** The session's streams held by nodes whose heartbeat is later than `beatAfter`. */
  async countFresh(sessionId: string, beatAfter: number): Promise<number> {
    const r = await this.db
      .selectFrom("live_streams as s")
      .innerJoin("node_heartbeats as h", "h.node", "s.node")
      .select((eb) => eb.fn.countAll<number>().as("n"))
      .where("s.session_id", "=", sessionId)
      .where("h.beat_at", ">", beatAfter)
      .executeTakeFirstOrThrow();
    return Number(r.n);
  }

  async insert(row: LiveStreamRow): Promise<void> {
    await this.db.insertInto("live_streams").values(row).execute();
  }

  async delete(ids: readonly string[]): Promise<void> {
    for (let i = 0; i < ids.length; i += 500)
      await this.db
        .deleteFrom("live_streams")
        .where("id", "in", ids.slice(i, i + 500))
        .execute();
  }

  /** Every stream row of `node` (it leaves, or starts again after a crash). */
  async deleteNode(node: string): Promise<void> {
    await this.db.deleteFrom("live_streams").where("node", "=", node).execute();
  }

  /** Rows of nodes other than `except` with no heartbeat row, or none later than `beatAfter` (nodes that died and never came back). */
  async deleteOfSilentNodes(beatAfter: number, except: string): Promise<void> {
    await this.db
      .deleteFrom("live_streams")
      .where("node", "<>", except)
      .where("node", "not in", (eb) => eb.selectFrom("node_heartbeats").select("node").where("beat_at", ">", beatAfter))
      .execute();
  }

  /** Rows of `node` (tests and diagnostics). */
  async countNode(node: string): Promise<number> {
    const r = await this.db
      .selectFrom("live_streams")
      .select((eb) => eb.fn.countAll<number>().as("n"))
      .where("node", "=", node)
      .executeTakeFirstOrThrow();
    return Number(r.n);
  }
}
