import type { Db } from "./database.ts";

export type NonceTable = "assertion_nonces" | "signaling_nonces";

export class NonceRepository {
  constructor(
    private readonly db: Db,
    private readonly table: NonceTable,
  ) {}

  /**
   * Records `(publicKey, nonce)` as used until `expiresAt`. Returns false when it is already recorded
   * and still live: the primary key decides, so this holds across processes. A row whose time has
   * passed is taken over, so cleanup lag never refuses a legitimate nonce.
   */
  async claim(publicKey: string, nonce: string, expiresAt: number, now: number): Promise<boolean> {
    const row = await this.db
      .insertInto(this.table)
      .values({ public_key: publicKey, nonce, expires_at: expiresAt })
      .onConflict((oc) => oc.columns(["public_key", "nonce"]).doUpdateSet({ expires_at: expiresAt }).where(`${this.table}.expires_at`, "<=", now))
      .returning("nonce")
      .executeTakeFirst();
    return row !== undefined;
  }

  async deleteExpired(now: number): Promise<void> {
    await this.db.deleteFrom(this.table).where("expires_at", "<=", now).execute();
  }
}
