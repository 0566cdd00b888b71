import { sql } from "kysely";
import { compiled } from "./compiled.ts";
import type { Db } from "./database.ts";
import type { DialectName } from "./migrations.ts";
import type { Tables } from "./schema.ts";

export type SessionRow = Tables["sessions"];

export class SessionRepository {
  private readonly db: Db;
  private readonly dialect: DialectName;
  /** Told of every write that can end a session's authentication. */
  private readonly authChanged: () => void;

  constructor(db: Db, dialect: DialectName, authChanged: () => void = () => {}) {
    this.db = db;
    this.dialect = dialect;
    this.authChanged = authChanged;
  }

  async insert(row: SessionRow): Promise<void> {
    await insertSession(
      this.db,
      this.dialect,
      row.id,
      row.token_hash,
      row.kind,
      row.public_key,
      row.target_key,
      row.created_at,
      row.expires_at,
      row.revoked_at,
    );
  }

  /** The session behind a bearer token, with what authentication re-checks on every request. */
  async findByTokenHash(tokenHash: string): Promise<SessionWithPeers | undefined> {
    return (await sessionByTokenHash(this.db, this.dialect, tokenHash))[0];
  }

  /** Live (unrevoked, unexpired) sessions, newest first; optionally only Side Control ones aimed at `targetKey`. */
  listLive(now: number, filter: { kind?: string; targetKey?: string } = {}): Promise<SessionRow[]> {
    let q = this.db.selectFrom("sessions").selectAll().where("revoked_at", "is", null).where("expires_at", ">", now);
    if (filter.kind) q = q.where("kind", "=", filter.kind);
    if (filter.targetKey) q = q.where("target_key", "=", filter.targetKey);
    return q.orderBy("created_at", "desc").orderBy("id").execute();
  }

  /** Live sessions; optionally only of one kind, aimed at one device, or held by one key. */
  async countLive(now: number, filter: { kind?: string; targetKey?: string; publicKey?: string } = {}): Promise<number> {
    let q = this.db
      .selectFrom("sessions")
      .select((eb) => eb.fn.countAll<number>().as("n"))
      .where("revoked_at", "is", null)
      .where("expires_at", ">", now);
    if (filter.kind) q = q.where("kind", "=", filter.kind);
    if (filter.targetKey) q = q.where("target_key", "=", filter.targetKey);
    if (filter.publicKey) q = q.where("public_key", "=", filter.publicKey);
    const r = await q.executeTakeFirstOrThrow();
    return Number(r.n);
  }

  /** Deletes the peer's oldest live primary sessions so that at most `keep` remain. */
  async trimPrimary(publicKey: string, now: number, keep: number): Promise<void> {
    this.authChanged();
    await trimPrimarySessions(this.db, this.dialect, publicKey, now, keep);
  }

  /** Revokes a live session; with `targetKey`, only a Side Control session aimed at that device. */
  async revoke(id: string, now: number, targetKey?: string): Promise<boolean> {
    this.authChanged();
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

const sessionByTokenHash = compiled(
  (db, tokenHash: string) =>
    db
      .selectFrom("sessions as s")
      .leftJoin("peers as p", "p.public_key", "s.public_key")
      .leftJoin("peers as t", "t.public_key", "s.target_key")
      .selectAll("s")
      .select(["p.status as peer_status", "t.status as target_status"])
      .where("s.token_hash", "=", tokenHash),
  "",
);

const insertSession = compiled(
  (
    db,
    id: string,
    token_hash: string,
    kind: string,
    public_key: string,
    target_key: string,
    created_at: number,
    expires_at: number,
    revoked_at: number | null,
  ) => db.insertInto("sessions").values({ id, token_hash, kind, public_key, target_key, created_at, expires_at, revoked_at }),
  "",
  "",
  "",
  "",
  "",
  0,
  0,
  0 as number | null,
);

/** One statement on the login path: every live primary session of the peer but the newest `keep`. */
const trimPrimarySessions = compiled(
  (db, public_key: string, now: number, keep: number) =>
    db.deleteFrom("sessions").where(
      "id",
      "in",
      db
        .selectFrom("sessions")
        .select("id")
        .where("public_key", "=", public_key)
        .where("kind", "=", sql.lit("primary"))
        .where("revoked_at", "is", null)
        .where("expires_at", ">", now)
        .orderBy("created_at", "desc")
        .orderBy("id", "desc")
        // SQLite needs a LIMIT before an OFFSET; this one never binds.
        .limit(sql.lit(1_000_000_000))
        .offset(keep),
    ),
  "",
  0,
  0,
);
