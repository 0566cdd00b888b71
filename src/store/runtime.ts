import type { Db } from "./database.ts";
import type { Tables } from "./schema.ts";

export type RuntimeRow = Tables["peer_runtime"];

/** Where and whether a peer is connected; written by the node that holds its WebRTC connection. */
export class RuntimeRepository {
  private readonly db: Db;

  constructor(db: Db) {
    this.db = db;
  }

  get(publicKey: string): Promise<RuntimeRow | undefined> {
    return this.db.selectFrom("peer_runtime").selectAll().where("public_key", "=", publicKey).executeTakeFirst();
  }

  async put(row: RuntimeRow): Promise<void> {
    const { public_key, ...rest } = row;
    await this.db
      .insertInto("peer_runtime")
      .values(row)
      .onConflict((oc) => oc.column("public_key").doUpdateSet(rest))
      .execute();
  }
}
