import { CompiledStatement } from "./compiled.ts";
import type { Db } from "./database.ts";
import type { Tables } from "./schema.ts";

export type SessionRow = Tables["sessions"];

export class SessionRepository {
  private readonly lookup: CompiledStatement<SessionWithPeers, [string]>;

  constructor(private readonly db: Db) {
    this.lookup = new CompiledStatement(db, findSessionWithPeers, [""]);
  }

  async insert(row: SessionRow): Promise<void> {
    await this.db.insertInto("sessions").values(row).execute();
  }

  /** The session behind a bearer token, with what authentication re-checks on every request. */
  async findByTokenHash(tokenHash: string): Promise<SessionWithPeers | undefined> {
    return (await this.lookup.run(tokenHash))[0];
  }

  /** Live (unrevoked, unexpired) sessions, newest first; optionally only Side Control ones aimed at `targetKey`. */
  listLive(now: number, filter: { kind?: string; targetKey?: string } = {}): Promise<SessionRow[]> {
    let q = this.db.selectFrom("sessions").selectAll().where("revoked_at", "is", null).where("expires_at", ">", now);
    if (filter.kind) q = q.where("kind", "=", filter.kind);
    if (filter.targetKey) q = q.where("target_key", "=", filter.targetKey);
    return q.orderBy("created_at", "desc").orderBy("id").execute();
  }

  async countLive(now: number): Promise<number> {
    const r = await this.db
      .selectFrom("sessions")
      .select((eb) => eb.fn.countAll<number>().as("n"))
      .where("revoked_at", "is", null)
      .where("expires_at", ">", now)
      .executeTakeFirstOrThrow();
    return Number(r.n);
  }

  /** Revokes a live session; with `targetKey`, only a Side Control session aimed at that device. */
  async revoke(id: string, now: number, targetKey?: string): Promise<boolean> {
    let q = this.db.updateTable("sessions").set({ revoked_at: now }).where("id", "=", id).where("revoked_at", "is", null).where("expires_at", ">", now);
    if (targetKey) q = q.where("kind", "=", "side_control").where("target_key", "=", targetKey);
    const r = await q.executeTakeFirst();
    return r.numUpdatedRows > 0n;
  }

  async deleteExpired(now: number): Promise<void> {
    await this.db.deleteFrom("sessions").where("expires_at", "<=", now).execute();
  }
}

/** A session with the registration status of the peers behind it (null when not registered). */
export interface SessionWithPeers extends SessionRow {
  peer_status: string | null;
  target_status: string | null;
}

function findSessionWithPeers(db: Db, tokenHash: string) {
  return db
    .selectFrom("sessions as s")
    .leftJoin("peers as p", "p.public_key", "s.public_key")
    .leftJoin("peers as t", "t.public_key", "s.target_key")
    .selectAll("s")
    .select(["p.status as peer_status", "t.status as target_status"])
    .where("s.token_hash", "=", tokenHash);
}
