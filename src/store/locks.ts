import { sql } from "kysely";
import type { Db } from "./database.ts";
import type { DialectName } from "./migrations.ts";

/**
 * Named locks held until the transaction ends, for count-then-insert limits across nodes
 * (PostgreSQL advisory locks). SQLite write transactions already run one at a time.
 */
export class LockRepository {
  private readonly db: Db;
  private readonly dialect: DialectName;

  constructor(db: Db, dialect: DialectName) {
    this.db = db;
    this.dialect = dialect;
  }

  /** Takes every named lock, in one order whatever the caller's, so that two transactions cannot deadlock on them. */
  async take(...names: string[]): Promise<void> {
    if (this.dialect !== "postgres") return;
    for (const name of [...new Set(names)].sort()) {
      await sql`select pg_advisory_xact_lock(hashtextextended(${name}, 0))`.execute(this.db);
    }
  }
}
