import { sql } from "kysely";
import type { Db } from "./database.ts";
import type { DialectName } from "./migrations.ts";
import type { Tables } from "./schema.ts";

export type UsageRow = Tables["usage_days"];
/** What one flush or claim adds to a row (any of them may be negative: a lease given back). */
export type UsageDelta = UsageRow;

/** The counter columns of a row, in one place. */
export const USAGE_COLUMNS = ["requests", "input_tokens", "output_tokens", "speech_chars", "audio_ms", "tool_calls"] as const;
/** Rows per statement: well under either database's limit of bound parameters. */
const ROWS_PER_STATEMENT = 200;

/** Usage per principal, UTC day and agent or model (usage.md §1), and the devices' own limits. */
export class UsageRepository {
  private readonly db: Db;
  private readonly dialect: DialectName;

  constructor(db: Db, dialect: DialectName) {
    this.db = db;
    this.dialect = dialect;
  }

  /**
   * Adds each delta to its row, one statement for all of them (INSERT … ON CONFLICT DO UPDATE SET
   * x = x + excluded.x): several nodes adding to one row lose nothing, on either database. The
   * deltas must name distinct rows.
   */
  async add(deltas: readonly UsageDelta[]): Promise<void> {
    const larger = this.dialect === "postgres" ? "greatest" : "max";
    for (let i = 0; i < deltas.length; i += ROWS_PER_STATEMENT) {
      await this.db
        .insertInto("usage_days")
        .values(deltas.slice(i, i + ROWS_PER_STATEMENT))
        .onConflict((oc) =>
          oc.columns(["principal", "day", "agent"]).doUpdateSet({
            requests: sql`usage_days.requests + excluded.requests`,
            input_tokens: sql`usage_days.input_tokens + excluded.input_tokens`,
            output_tokens: sql`usage_days.output_tokens + excluded.output_tokens`,
            speech_chars: sql`usage_days.speech_chars + excluded.speech_chars`,
            audio_ms: sql`usage_days.audio_ms + excluded.audio_ms`,
            tool_calls: sql`usage_days.tool_calls + excluded.tool_calls`,
            estimated: sql`${sql.raw(larger)}(usage_days.estimated, excluded.estimated)`,
          }),
        )
        .execute();
    }
  }

  /** The rows of `principals` from `fromDay` (inclusive, `YYYY-MM-DD`) on. */
  async rows(principals: readonly string[], fromDay: string): Promise<UsageRow[]> {
    if (principals.length === 0) return [];
    return await this.db
      .selectFrom("usage_days")
      .selectAll()
      .where("principal", "in", principals)
      .where("day", ">=", fromDay)
      .orderBy("day", "desc")
      .orderBy("principal")
      .orderBy("agent")
      .execute();
  }

  /** Every row from `fromDay` on (the operators' report), newest day first. */
  async all(fromDay: string): Promise<UsageRow[]> {
    return await this.db
      .selectFrom("usage_days")
      .selectAll()
      .where("day", ">=", fromDay)
      .orderBy("day", "desc")
      .orderBy("principal")
      .orderBy("agent")
      .execute();
  }

  /** Drops rows of days before `day` (retention). */
  async deleteBefore(day: string): Promise<void> {
    await this.db.deleteFrom("usage_days").where("day", "<", day).execute();
  }

  /** Drops the rows of devices no longer registered (counts a node wrote after the removal). */
  async deleteOrphans(): Promise<void> {
    await sql`delete from usage_days where principal like 'device:%' and substr(principal, 8) not in (select public_key from peers)`.execute(this.db);
  }

  /** Drops a principal's rows (a device's registration removed). */
  async removePrincipal(principal: string): Promise<void> {
    await this.db.deleteFrom("usage_days").where("principal", "=", principal).execute();
  }

  /** The devices' own limits (JSON text) of those of `keys` that have some. */
  async deviceLimits(keys: readonly string[]): Promise<Map<string, string>> {
    if (keys.length === 0) return new Map();
    const rows = await this.db
      .selectFrom("peers")
      .select(["public_key", "usage_limits"])
      .where("public_key", "in", keys)
      .where("usage_limits", "is not", null)
      .execute();
    return new Map(rows.map((r) => [r.public_key, r.usage_limits!]));
  }

  /** Sets (or with null clears) a device's own limits; false when the device is not registered. */
  async setDeviceLimits(key: string, limits: string | null): Promise<boolean> {
    const r = await this.db.updateTable("peers").set({ usage_limits: limits }).where("public_key", "=", key).executeTakeFirst();
    return r.numUpdatedRows > 0n;
  }
}
