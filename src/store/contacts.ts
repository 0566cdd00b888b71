import { sql } from "kysely";
import type { Db } from "./database.ts";
import type { DialectName } from "./migrations.ts";
import type { Tables } from "./schema.ts";

export type ContactRow = Tables["contacts"];

export class ContactRepository {
  private readonly db: Db;
  private readonly dialect: DialectName;

  constructor(db: Db, dialect: DialectName) {
    this.db = db;
    this.dialect = dialect;
  }

  async count(publicKey: string): Promise<number> {
    const r = await this.db
      .selectFrom("contacts")
      .select((eb) => eb.fn.countAll<number>().as("n"))
      .where("public_key", "=", publicKey)
      .executeTakeFirstOrThrow();
    return Number(r.n);
  }

  /** Contacts ordered by name, strictly after `afterName` when given. */
  list(publicKey: string, afterName: string | undefined, limit: number): Promise<ContactRow[]> {
    let q = this.db.selectFrom("contacts").selectAll().where("public_key", "=", publicKey);
    if (afterName !== undefined) q = q.where("name", ">", afterName);
    return q.orderBy("name").limit(limit).execute();
  }

  get(publicKey: string, name: string): Promise<ContactRow | undefined> {
    return this.db.selectFrom("contacts").selectAll().where("public_key", "=", publicKey).where("name", "=", name).executeTakeFirst();
  }

  /** The contact, locked until the transaction ends (PostgreSQL; SQLite write transactions run one at a time). */
  getForUpdate(publicKey: string, name: string): Promise<ContactRow | undefined> {
    const q = this.db.selectFrom("contacts").selectAll().where("public_key", "=", publicKey).where("name", "=", name);
    return (this.dialect === "postgres" ? q.forUpdate() : q).executeTakeFirst();
  }

  /** Inserts; returns false when the name or the phone number is already taken (the unique keys decide). */
  async insert(row: ContactRow): Promise<boolean> {
    const r = await this.db
      .insertInto("contacts")
      .values(row)
      .onConflict((oc) => oc.doNothing())
      .returning("name")
      .executeTakeFirst();
    return r !== undefined;
  }

  /**
   * Updates the mutable fields; "conflict" when the new phone number belongs to another contact.
   * Runs in a savepoint, so that a refused update leaves the transaction usable (PostgreSQL aborts
   * a transaction on any error).
   */
  async update(row: ContactRow): Promise<"updated" | "missing" | "conflict"> {
    await sql`savepoint contact_update`.execute(this.db);
    try {
      const r = await this.db
        .updateTable("contacts")
        .set({ display_name: row.display_name, phone_number: row.phone_number, phone_digits: row.phone_digits, updated_at: row.updated_at })
        .where("public_key", "=", row.public_key)
        .where("name", "=", row.name)
        .executeTakeFirst();
      await sql`release savepoint contact_update`.execute(this.db);
      return r.numUpdatedRows > 0n ? "updated" : "missing";
    } catch (err) {
      await sql`rollback to savepoint contact_update`.execute(this.db);
      await sql`release savepoint contact_update`.execute(this.db);
      if (isUniqueViolation(err)) return "conflict";
      throw err;
    }
  }

  delete(publicKey: string, name: string): Promise<ContactRow | undefined> {
    return this.db.deleteFrom("contacts").where("public_key", "=", publicKey).where("name", "=", name).returningAll().executeTakeFirst();
  }
}

/** SQLite (`SQLITE_CONSTRAINT_UNIQUE`/`_PRIMARYKEY`) and PostgreSQL (23505) unique-key violations. */
function isUniqueViolation(err: unknown): boolean {
  const e = err as { code?: string; errcode?: number; message?: string };
  return e?.code === "23505" || e?.errcode === 2067 || e?.errcode === 1555 || /UNIQUE constraint failed/.test(e?.message ?? "");
}
