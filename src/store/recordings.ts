import { type DeleteQueryBuilder, type DeleteResult, sql } from "kysely";
import type { Db } from "./database.ts";
import { type SecureWrites, secureWrite } from "./memories.ts";
import type { DialectName } from "./migrations.ts";
import type { Tables } from "./schema.ts";

export type RecordingRow = Tables["conversation_recordings"];
export type RecordingSide = "user" | "assistant";

/**
 * Stored turns' metrics and recordings (voice.md §8). Recordings are deleted by these methods
 * before their conversation's cascade would, with SQLite's `secure_delete` on, so that the audio
 * is overwritten in the file (the caller truncates the log afterwards; on PostgreSQL it compacts
 * the table once older transactions ended, `Store.eraseDeletedRecordings`).
 */
export class RecordingRepository {
  private readonly db: Db;
  private readonly dialect: DialectName;
  private readonly secureWrites: SecureWrites;

  constructor(db: Db, dialect: DialectName, secureWrites: SecureWrites) {
    this.db = db;
    this.dialect = dialect;
    this.secureWrites = secureWrites;
  }

  /** A stored turn's metrics; false when the conversation is not stored (a turn with no entries, or deleted). */
  async putMetrics(conversationId: string, turn: number, metrics: string): Promise<boolean> {
    const r = await this.db
      .insertInto("conversation_turns")
      .columns(["conversation_id", "turn", "metrics"])
      .expression((eb) =>
        eb
          .selectFrom("conversations")
          .select([eb.val(conversationId).as("conversation_id"), eb.val(turn).as("turn"), eb.val(metrics).as("metrics")])
          .where("id", "=", conversationId),
      )
      .onConflict((oc) => oc.columns(["conversation_id", "turn"]).doUpdateSet({ metrics }))
      .executeTakeFirst();
    return Number(r.numInsertedOrUpdatedRows ?? 0n) > 0;
  }

  /** The conversation's turns' metrics, by turn. */
  async metrics(conversationId: string): Promise<Map<number, string>> {
    const rows = await this.db.selectFrom("conversation_turns").select(["turn", "metrics"]).where("conversation_id", "=", conversationId).execute();
    return new Map(rows.map((r) => [r.turn, r.metrics]));
  }

  /** One side of a turn; false when its conversation is not stored (nothing is written). One statement: a delete racing it wins or comes after. */
  async put(row: RecordingRow): Promise<boolean> {
    const r = await this.db
      .insertInto("conversation_recordings")
      .columns(["conversation_id", "turn", "side", "public_key", "audio", "duration_ms", "at", "expires_at"])
      .expression((eb) =>
        eb
          .selectFrom("conversations")
          .select([
            eb.val(row.conversation_id).as("conversation_id"),
            eb.val(row.turn).as("turn"),
            eb.val(row.side).as("side"),
            eb.val(row.public_key).as("public_key"),
            eb.val(row.audio).as("audio"),
            eb.val(row.duration_ms).as("duration_ms"),
            eb.val(row.at).as("at"),
            eb.val(row.expires_at).as("expires_at"),
          ])
          .where("id", "=", row.conversation_id)
          .where("public_key", "=", row.public_key),
      )
      .onConflict((oc) => oc.columns(["conversation_id", "turn", "side"]).doNothing())
      .executeTakeFirst();
    return Number(r.numInsertedOrUpdatedRows ?? 0n) > 0;
  }

  /** The audio of one side of a turn of the device's conversation; undefined when there is none. */
  async get(publicKey: string, conversationId: string, turn: number, side: RecordingSide): Promise<Uint8Array | undefined> {
    const row = await this.db
      .selectFrom("conversation_recordings")
      .select("audio")
      .where("conversation_id", "=", conversationId)
      .where("turn", "=", turn)
      .where("side", "=", side)
      .where("public_key", "=", publicKey)
      .executeTakeFirst();
    return row?.audio;
  }

  /** Which sides of which turns the conversation has, as `turn:side`. */
  async sides(conversationId: string): Promise<Array<{ turn: number; side: string; duration_ms: number }>> {
    return this.db
      .selectFrom("conversation_recordings")
      .select(["turn", "side", "duration_ms"])
      .where("conversation_id", "=", conversationId)
      .orderBy("turn")
      .orderBy("side")
      .execute();
  }

  /** Deletes a conversation's recordings, overwritten in the file; how many. */
  deleteConversation(publicKey: string, conversationId: string): Promise<number> {
    return this.delete((q) => q.where("conversation_id", "=", conversationId).where("public_key", "=", publicKey));
  }

  /** Deletes every recording of the device, overwritten in the file; how many. */
  deleteDevice(publicKey: string): Promise<number> {
    return this.delete((q) => q.where("public_key", "=", publicKey));
  }

  /**
   * Deletes up to `batch` conversations' worth of recordings past their retention, or of
   * conversations last written before `conversationsBefore` (the transcripts' retention, whose
   * cascade would not overwrite them); how many.
   */
  deleteExpired(now: number, batch: number, conversationsBefore: number): Promise<number> {
    return this.delete((q) =>
      q.where((eb) =>
        eb(
          "conversation_id",
          "in",
          eb
            .selectFrom("conversation_recordings as r")
            .innerJoin("conversations as c", "c.id", "r.conversation_id")
            .select("r.conversation_id")
            .where((w) => w.or([w("r.expires_at", "<", now), w("c.last_at", "<", conversationsBefore)]))
            .limit(batch),
        ).and(
          eb.or([
            eb("expires_at", "<", now),
            eb("conversation_id", "in", eb.selectFrom("conversations").select("id").where("last_at", "<", conversationsBefore)),
          ]),
        ),
      ),
    );
  }

  private delete(where: (q: DeleteQuery) => DeleteQuery): Promise<number> {
    return secureWrite(this.db, this.dialect, this.secureWrites, async () => {
      const r = await where(this.db.deleteFrom("conversation_recordings")).executeTakeFirst();
      return Number(r.numDeletedRows);
    });
  }

  /** Bytes of audio stored (measurements). */
  async totalBytes(): Promise<number> {
    const row = await this.db.selectFrom("conversation_recordings").select(sql<number>`coalesce(sum(length(audio)), 0)`.as("n")).executeTakeFirstOrThrow();
    return Number(row.n);
  }
}

type DeleteQuery = DeleteQueryBuilder<Tables, "conversation_recordings", DeleteResult>;
