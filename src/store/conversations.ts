import { sql } from "kysely";
import type { Db } from "./database.ts";
import type { LockRepository } from "./locks.ts";
import type { Tables } from "./schema.ts";

export type ConversationRow = Tables["conversations"];
export type ConversationEntryRow = Tables["conversation_entries"];

/** Stored voice transcripts: a device's conversations and their entries. */
export class ConversationRepository {
  private readonly db: Db;
  private readonly locks: LockRepository;

  constructor(db: Db, locks: LockRepository) {
    this.db = db;
    this.locks = locks;
  }

  /**
   * Appends an entry (its `seq` is the conversation's count so far), creating the conversation on
   * its first entry; false when the device is no longer registered or the conversation was deleted
   * (nothing is written). The device's lock orders it with a delete on PostgreSQL.
   */
  async append(c: { id: string; publicKey: string; startedAt: number }, e: Omit<ConversationEntryRow, "conversation_id" | "seq">): Promise<boolean> {
    await this.locks.take(`conversations:${c.publicKey}`);
    const peer = await this.db.selectFrom("peers").select("public_key").where("public_key", "=", c.publicKey).executeTakeFirst();
    if (!peer) return false;
    const deleted = await this.db.selectFrom("conversation_deletions").select("id").where("id", "=", c.id).executeTakeFirst();
    if (deleted) return false;
    const created = await this.db
      .insertInto("conversations")
      .values({ id: c.id, public_key: c.publicKey, started_at: c.startedAt, ended_at: null, last_at: e.at, turns: 0, entries: 0, last_text: "" })
      .onConflict((oc) => oc.column("id").doNothing())
      .executeTakeFirst();
    // A device converses over one connection at a time: a conversation of its still open here was
    // left by a node that died before its connection closed, or is the previous connection's, whose
    // last entries may still come (they move its end on, below). The newest conversation stays open
    // and every older one ends with its last entry. The device's lock makes two first entries racing
    // on PostgreSQL (READ COMMITTED) take turns, so the second sees the first.
    if (Number(created.numInsertedOrUpdatedRows ?? 0n) > 0) {
      const newest = await this.db
        .selectFrom("conversations")
        .select(["id", "started_at"])
        .where("public_key", "=", c.publicKey)
        .where("ended_at", "is", null)
        .orderBy("started_at", "desc")
        .orderBy("id", "desc")
        .limit(1)
        .executeTakeFirstOrThrow();
      await this.db
        .updateTable("conversations")
        .set((eb) => ({ ended_at: eb.ref("last_at") }))
        .where("public_key", "=", c.publicKey)
        .where("ended_at", "is", null)
        .where("id", "<>", newest.id)
        .execute();
    }
    // One statement takes the entry's sequence number and moves the summary on.
    const row = await this.db
      .updateTable("conversations")
      .set((eb) => ({
        entries: eb("entries", "+", 1),
        turns: sql<number>`case when turns > ${e.turn} then turns else ${e.turn} end`,
        last_text: e.text,
        last_at: e.at,
        // An entry of a conversation already ended (a newer one began) moves its end on with it.
        ended_at: sql<number | null>`case when ended_at < ${e.at} then ${e.at} else ended_at end`,
      }))
      .where("id", "=", c.id)
      .returning("entries")
      .executeTakeFirstOrThrow();
    await this.db
      .insertInto("conversation_entries")
      .values({ ...e, conversation_id: c.id, seq: row.entries - 1 })
      .execute();
    return true;
  }

  /**
   * Marks the conversation ended (its connection closed); nothing when it was never stored. One that a
   * newer conversation ended earlier takes its real end.
   */
  async end(id: string, at: number): Promise<void> {
    await this.db
      .updateTable("conversations")
      .set({ ended_at: at })
      .where("id", "=", id)
      .where((eb) => eb.or([eb("ended_at", "is", null), eb("ended_at", "<", at)]))
      .execute();
  }

  /** The device's conversations newest first, strictly before `before` (start time, id) when given. */
  list(
    publicKey: string,
    before: { startedAt: number; id: string } | undefined,
    limit: number,
  ): Promise<Array<ConversationRow & { first_question: string | null }>> {
    let q = this.db
      .selectFrom("conversations")
      .selectAll()
      // What was asked first: the conversation's first user entry (entries are keyed by conversation and seq).
      .select((eb) =>
        eb
          .selectFrom("conversation_entries as e")
          .select("e.text")
          .whereRef("e.conversation_id", "=", "conversations.id")
          .where("e.role", "=", "user")
          .orderBy("e.seq")
          .limit(1)
          .as("first_question"),
      )
      .where("public_key", "=", publicKey);
    if (before) q = q.where((eb) => eb(eb.refTuple("started_at", "id"), "<", eb.tuple(before.startedAt, before.id)));
    return q.orderBy("started_at", "desc").orderBy("id", "desc").limit(limit).execute();
  }

  get(publicKey: string, id: string): Promise<ConversationRow | undefined> {
    return this.db.selectFrom("conversations").selectAll().where("id", "=", id).where("public_key", "=", publicKey).executeTakeFirst();
  }

  entries(id: string): Promise<ConversationEntryRow[]> {
    return this.db.selectFrom("conversation_entries").selectAll().where("conversation_id", "=", id).orderBy("seq").execute();
  }

  /**
   * Deletes one of the device's conversations with its entries, for good: its later entries (it may
   * still be going) are not stored. False when it has none of that id.
   */
  async delete(publicKey: string, id: string, at: number): Promise<boolean> {
    await this.locks.take(`conversations:${publicKey}`);
    const r = await this.db.deleteFrom("conversations").where("id", "=", id).where("public_key", "=", publicKey).executeTakeFirst();
    if (r.numDeletedRows === 0n) return false;
    await this.db
      .insertInto("conversation_deletions")
      .values({ id, public_key: publicKey, at })
      .onConflict((oc) => oc.column("id").doNothing())
      .execute();
    return true;
  }

  /** Deletes every conversation of the device, for good as `delete` does; returns how many. */
  async deleteAll(publicKey: string, at: number): Promise<number> {
    await this.locks.take(`conversations:${publicKey}`);
    await this.db
      .insertInto("conversation_deletions")
      .columns(["id", "public_key", "at"])
      .expression((eb) =>
        eb
          .selectFrom("conversations")
          .select(["id", "public_key", eb.val(at).as("at")])
          .where("public_key", "=", publicKey),
      )
      .onConflict((oc) => oc.column("id").doNothing())
      .execute();
    const r = await this.db.deleteFrom("conversations").where("public_key", "=", publicKey).executeTakeFirst();
    return Number(r.numDeletedRows);
  }

  /** Forgets deletions older than `before` (the retention job: a conversation going on that long is a rarity left to it). */
  async forgetDeletionsBefore(before: number): Promise<void> {
    await this.db.deleteFrom("conversation_deletions").where("at", "<", before).execute();
  }

  /** Deletes up to `batch` conversations whose last entry is older than `before`; returns how many. */
  async deleteOlderThan(before: number, batch: number): Promise<number> {
    const r = await this.db
      .deleteFrom("conversations")
      .where("id", "in", (eb) => eb.selectFrom("conversations").select("id").where("last_at", "<", before).limit(batch))
      .executeTakeFirst();
    return Number(r.numDeletedRows);
  }
}
