import { type ExpressionBuilder, sql } from "kysely";
import type { Db } from "./database.ts";
import type { DialectName } from "./migrations.ts";
import type { Tables } from "./schema.ts";

export type MemoryRow = Tables["memories"];

/** A device's memory as a conversation or a rewrite reads it: the switch, when it was last forgotten, and the row. */
export interface MemoryState {
  /** The device's voice agent setting: an agent id, `off`, or null for `voice.agent`. */
  voiceAgent: string | null;
  off: boolean;
  forgottenAt: number | null;
  row: MemoryRow | undefined;
}

/**
 * Devices' memories (one row each). Every write of the text happens with SQLite's `secure_delete`
 * on, so that the text it replaces or deletes is overwritten in the file, not left in free space.
 */
export class MemoryRepository {
  private readonly db: Db;
  private readonly dialect: DialectName;
  private readonly secureWrites: SecureWrites;

  /** `secureWrites`: the database's own count of memory writes under way (one per store, never per process). */
  constructor(db: Db, dialect: DialectName, secureWrites: SecureWrites) {
    this.db = db;
    this.dialect = dialect;
    this.secureWrites = secureWrites;
  }

  /** undefined when the device is not registered. */
  async state(publicKey: string): Promise<MemoryState | undefined> {
    const row = await this.db
      .selectFrom("peers")
      .leftJoin("memories", "memories.public_key", "peers.public_key")
      .select(["peers.voice_agent", "peers.memory_off", "peers.memory_forgotten_at", "memories.text", "memories.rev", "memories.updated_at"])
      .where("peers.public_key", "=", publicKey)
      .executeTakeFirst();
    if (!row) return undefined;
    return {
      voiceAgent: row.voice_agent ?? null,
      off: row.memory_off === 1,
      forgottenAt: row.memory_forgotten_at ?? null,
      row:
        row.rev === null || row.rev === undefined ? undefined : { public_key: publicKey, text: row.text ?? "", rev: row.rev, updated_at: row.updated_at ?? 0 },
    };
  }

  /** Sets the text whatever it was (the phone's edit); false when the device is not registered. */
  async put(publicKey: string, text: string, rev: string, at: number): Promise<boolean> {
    const peer = await this.db.selectFrom("peers").select("public_key").where("public_key", "=", publicKey).executeTakeFirst();
    if (!peer) return false;
    await this.secure(() =>
      this.db
        .insertInto("memories")
        .values({ public_key: publicKey, text, rev, updated_at: at })
        .onConflict((oc) => oc.column("public_key").doUpdateSet({ text, rev, updated_at: at }))
        .execute(),
    );
    return true;
  }

  /**
   * A rewrite's write: only over the row it read (`base` its rev; undefined: there was none), and
   * only while the device's people have remembering on and have not forgotten since `startedAt` (in
   * the same statement, so that a switch or a forgetting during the model call is never overwritten;
   * on PostgreSQL the peer's row is read `FOR SHARE`, so that one still committing is waited for and
   * read as committed, not as the statement's snapshot had it).
   * False when the row changed since (an edit, another rewrite, forgetting), the switch is off, or
   * the device is gone.
   */
  async replace(publicKey: string, base: string | undefined, startedAt: number, text: string, rev: string, at: number): Promise<boolean> {
    if (base === undefined) {
      const r = await this.secure(() =>
        this.db
          .insertInto("memories")
          .columns(["public_key", "text", "rev", "updated_at"])
          .expression((eb) =>
            eb
              .selectFrom("peers")
              .select([eb.val(publicKey).as("public_key"), eb.val(text).as("text"), eb.val(rev).as("rev"), eb.val(at).as("updated_at")])
              .where("public_key", "=", publicKey)
              .where((w) => remembering(w, startedAt))
              .$if(this.dialect === "postgres", (q) => q.forShare()),
          )
          .onConflict((oc) => oc.column("public_key").doNothing())
          .executeTakeFirst(),
      );
      return Number(r.numInsertedOrUpdatedRows ?? 0n) > 0;
    }
    const r = await this.secure(() =>
      this.db
        .updateTable("memories")
        .set({ text, rev, updated_at: at })
        .where("public_key", "=", publicKey)
        .where("rev", "=", base)
        .where((eb) =>
          eb.exists(
            eb
              .selectFrom("peers")
              .select("peers.public_key")
              .where("peers.public_key", "=", publicKey)
              .where((w) => remembering(w, startedAt))
              .$if(this.dialect === "postgres", (q) => q.forShare()),
          ),
        )
        .executeTakeFirst(),
    );
    return r.numUpdatedRows > 0n;
  }

  /** Deletes the text for good and records when; false when there was none. */
  async forget(publicKey: string, at: number): Promise<boolean> {
    await this.db.updateTable("peers").set({ memory_forgotten_at: at }).where("public_key", "=", publicKey).execute();
    const r = await this.secure(() => this.db.deleteFrom("memories").where("public_key", "=", publicKey).executeTakeFirst());
    return r.numDeletedRows > 0n;
  }

  /** Deletes the row (with its peer's removal, before the cascade would, so that it is overwritten too). */
  async delete(publicKey: string): Promise<void> {
    await this.secure(() => this.db.deleteFrom("memories").where("public_key", "=", publicKey).execute());
  }

  /** The device's people's switch; false when the device is not registered. */
  async setOff(publicKey: string, off: boolean): Promise<boolean> {
    const r = await this.db
      .updateTable("peers")
      .set({ memory_off: off ? 1 : 0 })
      .where("public_key", "=", publicKey)
      .executeTakeFirst();
    return r.numUpdatedRows > 0n;
  }

  /**
   * SQLite: `work` with `secure_delete` on (a flag of the connection, read as pages are freed). The
   * process's transactions share one connection (a group commit runs several at once), so the flag
   * is set by the first memory write under way and cleared by the last. Counted per store, as the
   * flag is per connection. (node:sqlite runs each statement synchronously and a group commit runs
   * its units one after another, so no test makes two stores' memory writes overlap today; the
   * count is kept so that an asynchronous driver would stay correct.)
   */
  private secure<T>(work: () => Promise<T>): Promise<T> {
    return secureWrite(this.db, this.dialect, this.secureWrites, work);
  }
}

/** SQLite: `work` with `secure_delete` on, counted in `secureWrites` (see MemoryRepository.secure); PostgreSQL: `work`. */
export async function secureWrite<T>(db: Db, dialect: DialectName, secureWrites: SecureWrites, work: () => Promise<T>): Promise<T> {
  if (dialect !== "sqlite") return work();
  if (secureWrites.count++ === 0) await sql`PRAGMA secure_delete = 1`.execute(db);
  try {
    return await work();
  } finally {
    if (--secureWrites.count === 0) await sql`PRAGMA secure_delete = 0`.execute(db);
  }
}

/** The peer's people have remembering on and have not forgotten since `startedAt`. */
function remembering(eb: ExpressionBuilder<Tables, "peers">, startedAt: number) {
  return eb.and([eb("peers.memory_off", "=", 0), eb.or([eb("peers.memory_forgotten_at", "is", null), eb("peers.memory_forgotten_at", "<", startedAt)])]);
}

/** Memory writes under way on one SQLite connection (its store's, shared by all its transactions). */
export interface SecureWrites {
  count: number;
}
