import type { Db } from "./database.ts";
import type { Tables } from "./schema.ts";

export type DeviceTokenRow = Tables["device_tokens"];

export class DeviceTokenRepository {
  private readonly db: Db;

  constructor(db: Db) {
    this.db = db;
  }

  async countUsable(targetKey: string, now: number): Promise<number> {
    const r = await this.db
      .selectFrom("device_tokens")
      .select((eb) => eb.fn.countAll<number>().as("n"))
      .where("target_key", "=", targetKey)
      .where("consumed_at", "is", null)
      .where("expires_at", ">", now)
      .executeTakeFirstOrThrow();
    return Number(r.n);
  }

  async insert(row: DeviceTokenRow): Promise<void> {
    await this.db.insertInto("device_tokens").values(row).execute();
  }

  /** A token that can still be exchanged (unconsumed, unexpired), without consuming it. */
  findUsable(tokenHash: string, now: number): Promise<DeviceTokenRow | undefined> {
    return this.db
      .selectFrom("device_tokens")
      .selectAll()
      .where("token_hash", "=", tokenHash)
      .where("consumed_at", "is", null)
      .where("expires_at", ">", now)
      .executeTakeFirst();
  }

  /** Consumes the token if it is still usable. The conditional update makes exactly one caller win, on any node. */
  consume(tokenHash: string, now: number): Promise<DeviceTokenRow | undefined> {
    return this.db
      .updateTable("device_tokens")
      .set({ consumed_at: now })
      .where("token_hash", "=", tokenHash)
      .where("consumed_at", "is", null)
      .where("expires_at", ">", now)
      .returningAll()
      .executeTakeFirst();
  }

  /** Withdraws an unconsumed, unexpired token of `targetKey`. */
  async revoke(id: string, targetKey: string, now: number): Promise<boolean> {
    const r = await this.db
      .deleteFrom("device_tokens")
      .where("id", "=", id)
      .where("target_key", "=", targetKey)
      .where("consumed_at", "is", null)
      .where("expires_at", ">", now)
      .executeTakeFirst();
    return r.numDeletedRows > 0n;
  }

  async deleteExpired(now: number): Promise<void> {
    await this.db.deleteFrom("device_tokens").where("expires_at", "<=", now).execute();
  }
}
