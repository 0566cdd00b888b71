import { compiled } from "./compiled.ts";
import type { Db } from "./database.ts";
import type { DialectName } from "./migrations.ts";

/** The peer's status document, stored whole as JSON. */
const documentByKey = compiled((db, key: string) => db.selectFrom("peer_status").select("document").where("public_key", "=", key), "");

const putDocument = compiled(
  (db, public_key: string, document: string, updated_at: number) =>
    db
      .insertInto("peer_status")
      .values({ public_key, document, updated_at })
      .onConflict((oc) => oc.column("public_key").doUpdateSet((eb) => ({ document: eb.ref("excluded.document"), updated_at: eb.ref("excluded.updated_at") }))),
  "",
  "",
  0,
);

export class StatusRepository {
  private readonly db: Db;
  private readonly dialect: DialectName;

  constructor(db: Db, dialect: DialectName) {
    this.db = db;
    this.dialect = dialect;
  }

  async get(publicKey: string): Promise<Record<string, unknown> | undefined> {
    const text = await this.getText(publicKey);
    return text === undefined ? undefined : (JSON.parse(text) as Record<string, unknown>);
  }

  /** The document as stored: JSON text, written only by `put` (so already what a reader would serialise). */
  async getText(publicKey: string): Promise<string | undefined> {
    const [row] = await documentByKey(this.db, this.dialect, publicKey);
    return row?.document;
  }

  /**
   * The document, locked until the transaction ends, for a read-modify-write. On PostgreSQL an
   * empty document is created first when there is none, so that there is a row to lock; SQLite
   * write transactions already run one at a time.
   */
  async getForUpdate(publicKey: string, now: number): Promise<Record<string, unknown> | undefined> {
    if (this.dialect === "sqlite") return this.get(publicKey);
    await this.db
      .insertInto("peer_status")
      .values({ public_key: publicKey, document: "{}", updated_at: now })
      .onConflict((oc) => oc.column("public_key").doNothing())
      .execute();
    const row = await this.db.selectFrom("peer_status").select("document").where("public_key", "=", publicKey).forUpdate().executeTakeFirstOrThrow();
    return JSON.parse(row.document) as Record<string, unknown>;
  }

  async put(publicKey: string, document: Record<string, unknown>, now: number): Promise<void> {
    await putDocument(this.db, this.dialect, publicKey, JSON.stringify(document), now);
  }
}
