import { CompiledStatement } from "./compiled.ts";
import type { Db } from "./database.ts";

/** The peer's status document, stored whole as JSON. */
export class StatusRepository {
  private readonly byKey: CompiledStatement<{ document: string }, [string]>;

  constructor(private readonly db: Db) {
    this.byKey = new CompiledStatement(db, (d, key: string) => d.selectFrom("peer_status").select("document").where("public_key", "=", key), [""]);
  }

  async get(publicKey: string): Promise<Record<string, unknown> | undefined> {
    const [row] = await this.byKey.run(publicKey);
    return row ? (JSON.parse(row.document) as Record<string, unknown>) : undefined;
  }

  async put(publicKey: string, document: Record<string, unknown>, now: number): Promise<void> {
    const text = JSON.stringify(document);
    await this.db
      .insertInto("peer_status")
      .values({ public_key: publicKey, document: text, updated_at: now })
      .onConflict((oc) => oc.column("public_key").doUpdateSet({ document: text, updated_at: now }))
      .execute();
  }
}
