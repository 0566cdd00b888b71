import type { Db } from "./database.ts";
import type { DialectName } from "./migrations.ts";

/** How long a message is kept for the processes that read it (they poll every few hundred ms). */
export const BUS_MESSAGE_KEEP_MS = 60_000;

/**
 * Bus messages for the other processes sharing a SQLite file (`SqliteBusFeed` reads them), written
 * in the transaction whose change they announce, so that a change and its message commit together.
 * On PostgreSQL nothing is written: `NOTIFY` carries every message to every node.
 */
export class BusMessageRepository {
  private readonly db: Db;
  private readonly dialect: DialectName;

  constructor(db: Db, dialect: DialectName) {
    this.db = db;
    this.dialect = dialect;
  }

  async add(origin: string, topic: string, message: object, now: number): Promise<void> {
    if (this.dialect !== "sqlite") return;
    await this.db
      .insertInto("bus_messages")
      .values({ origin, topic, message: JSON.stringify(message), created_at: now })
      .execute();
  }

  /** `created_at` is wall-clock time (what the readers' polling runs on), whatever clock the domain uses. */
  async deleteBefore(time: number): Promise<void> {
    await this.db.deleteFrom("bus_messages").where("created_at", "<", time).execute();
  }
}
