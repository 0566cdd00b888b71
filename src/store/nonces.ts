import { compiled } from "./compiled.ts";
import type { Db } from "./database.ts";
import type { DialectName } from "./migrations.ts";

export type NonceTable = "assertion_nonces" | "signaling_nonces";

/** Inserts a nonce, or takes over an expired row; returns a row only when the claim succeeded. */
const claimFor = (table: NonceTable) =>
  compiled(
    (db, public_key: string, nonce: string, expires_at: number, now: number) =>
      db
        .insertInto(table)
        .values({ public_key, nonce, expires_at })
        .onConflict((oc) =>
          oc
            .columns(["public_key", "nonce"])
            .doUpdateSet((eb) => ({ expires_at: eb.ref("excluded.expires_at") }))
            .where(`${table}.expires_at`, "<=", now),
        )
        .returning("nonce"),
    "",
    "",
    0,
    0,
  );
const claims = { assertion_nonces: claimFor("assertion_nonces"), signaling_nonces: claimFor("signaling_nonces") };

export class NonceRepository {
  private readonly db: Db;
  private readonly dialect: DialectName;
  private readonly table: NonceTable;

  constructor(db: Db, dialect: DialectName, table: NonceTable) {
    this.db = db;
    this.dialect = dialect;
    this.table = table;
  }

  /**
   * Records `(publicKey, nonce)` as used until `expiresAt`. Returns false when it is already recorded
   * and still live: the primary key decides, so this holds across processes. A row whose time has
   * passed is taken over, so cleanup lag never refuses a legitimate nonce.
   */
  async claim(publicKey: string, nonce: string, expiresAt: number, now: number): Promise<boolean> {
    return (await claims[this.table](this.db, this.dialect, publicKey, nonce, expiresAt, now)).length > 0;
  }

  async deleteExpired(now: number): Promise<void> {
    await this.db.deleteFrom(this.table).where("expires_at", "<=", now).execute();
  }
}
