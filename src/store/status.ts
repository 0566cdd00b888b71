import { sql } from "kysely";
import { batched, compiled } from "./compiled.ts";
import type { Db } from "./database.ts";
import type { DialectName } from "./migrations.ts";
import type { WriteMemoryUnit } from "./write-memory.ts";

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

const documentsByKey = batched<{ public_key: string; document: string }>(
  (db, values) =>
    db
      .selectFrom("peer_status")
      .select(["public_key", "document"])
      .where("public_key", "in", values as string[]),
  [""],
);
/** PostgreSQL: an empty document for each key without one (a row to lock), then the documents locked, in key order. */
const ensureDocuments = batched(
  (db, values, rows) =>
    db
      .insertInto("peer_status")
      .values(
        Array.from({ length: rows }, (_, i) => ({ public_key: values[2 * i] as string, document: sql.lit("{}"), updated_at: values[2 * i + 1] as number })),
      )
      .onConflict((oc) => oc.column("public_key").doNothing()),
  ["", 0],
);
const documentsForUpdate = batched<{ public_key: string; document: string }>(
  (db, values) =>
    db
      .selectFrom("peer_status")
      .select(["public_key", "document"])
      .where("public_key", "in", values as string[])
      .orderBy("public_key")
      .forUpdate(),
  [""],
);
const putDocuments = batched(
  (db, values, rows) =>
    db
      .insertInto("peer_status")
      .values(
        Array.from({ length: rows }, (_, i) => ({
          public_key: values[3 * i] as string,
          document: values[3 * i + 1] as string,
          updated_at: values[3 * i + 2] as number,
        })),
      )
      .onConflict((oc) => oc.column("public_key").doUpdateSet((eb) => ({ document: eb.ref("excluded.document"), updated_at: eb.ref("excluded.updated_at") }))),
  ["", "", 0],
);

export class StatusRepository {
  private readonly db: Db;
  private readonly dialect: DialectName;
  /** SQLite: the documents the telemetry writes remember between transactions. */
  private readonly memory: WriteMemoryUnit | undefined;

  constructor(db: Db, dialect: DialectName, memory?: WriteMemoryUnit) {
    this.db = db;
    this.dialect = dialect;
    this.memory = memory;
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

  /**
   * `getForUpdate` for many peers at once: the documents of those that have one, not to be modified
   * (copied to change them). On SQLite, the documents the telemetry writes remember are not read again.
   */
  async getManyForUpdate(publicKeys: readonly string[], now: number): Promise<Map<string, Readonly<Record<string, unknown>>>> {
    const sorted = this.dialect === "postgres" ? [...publicKeys].sort() : publicKeys;
    let rows: Array<{ public_key: string; document: string }>;
    const known = new Map<string, Readonly<Record<string, unknown>>>();
    if (this.dialect === "sqlite") {
      const unread: string[][] = [];
      if (this.memory) this.memory.open();
      for (const key of sorted) {
        const document = this.memory?.memory.document(key);
        if (document) known.set(key, document);
        else unread.push([key]);
      }
      rows = unread.length > 0 ? await documentsByKey(this.db, this.dialect, unread) : [];
    } else {
      await ensureDocuments(
        this.db,
        this.dialect,
        sorted.map((k) => [k, now]),
      );
      rows = await documentsForUpdate(
        this.db,
        this.dialect,
        sorted.map((k) => [k]),
      );
    }
    for (const r of rows) {
      const document = JSON.parse(r.document) as Record<string, unknown>;
      known.set(r.public_key, document);
      this.memory?.keepDocument(r.public_key, document);
    }
    return known;
  }

  /**
   * `put` for many peers at once (on PostgreSQL in key order, the order every writer locks rows in):
   * the telemetry writer's, whose documents are remembered once committed (so not to be modified after).
   */
  async putMany(documents: ReadonlyArray<[publicKey: string, document: Readonly<Record<string, unknown>>]>, now: number): Promise<void> {
    const sorted = this.dialect === "postgres" ? [...documents].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0)) : documents;
    await putDocuments(
      this.db,
      this.dialect,
      sorted.map(([key, document]) => [key, JSON.stringify(document), now]),
    );
    for (const [key, document] of documents) {
      this.memory?.memory.setAside(key);
      this.memory?.keepDocument(key, document);
    }
  }

  /** Replaces the document (not the telemetry writer's: the telemetry writes forget theirs). */
  async put(publicKey: string, document: Record<string, unknown>, now: number): Promise<void> {
    this.memory?.memory.forgetDocument(publicKey);
    await putDocument(this.db, this.dialect, publicKey, JSON.stringify(document), now);
  }
}
