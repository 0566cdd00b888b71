import { compiled } from "./compiled.ts";
import type { Db } from "./database.ts";
import type { DialectName } from "./migrations.ts";
import type { Tables } from "./schema.ts";

export type PeerRow = Tables["peers"];

const peerByKey = compiled((db, key: string) => db.selectFrom("peers").selectAll().where("public_key", "=", key), "");

export class PeerRepository {
  private readonly db: Db;
  private readonly dialect: DialectName;

  constructor(db: Db, dialect: DialectName) {
    this.db = db;
    this.dialect = dialect;
  }

  async get(publicKey: string): Promise<PeerRow | undefined> {
    return (await peerByKey(this.db, this.dialect, publicKey))[0];
  }

  list(): Promise<PeerRow[]> {
    return this.db.selectFrom("peers").selectAll().orderBy("created_at").orderBy("public_key").execute();
  }

  /** Registers the peer unless it already exists. */
  async register(row: PeerRow): Promise<void> {
    await this.db
      .insertInto("peers")
      .values(row)
      .onConflict((oc) => oc.column("public_key").doNothing())
      .execute();
  }

  async setStatus(publicKey: string, status: string, now: number): Promise<boolean> {
    const r = await this.db.updateTable("peers").set({ status, updated_at: now }).where("public_key", "=", publicKey).executeTakeFirst();
    return r.numUpdatedRows > 0n;
  }

  async setDeviceInfo(publicKey: string, deviceInfo: string, now: number): Promise<boolean> {
    const r = await this.db.updateTable("peers").set({ device_info: deviceInfo, updated_at: now }).where("public_key", "=", publicKey).executeTakeFirst();
    return r.numUpdatedRows > 0n;
  }

  /** Takes the peer's row lock for the rest of the transaction (serialises per-peer quotas across nodes). */
  async lock(publicKey: string): Promise<void> {
    await this.db
      .updateTable("peers")
      .set((eb) => ({ updated_at: eb.ref("updated_at") }))
      .where("public_key", "=", publicKey)
      .execute();
  }

  /** Removes the peer with everything that belongs to it. Run it in a transaction. */
  async remove(publicKey: string): Promise<boolean> {
    const r = await this.db.deleteFrom("peers").where("public_key", "=", publicKey).executeTakeFirst();
    if (r.numDeletedRows === 0n) return false;
    await this.db
      .deleteFrom("sessions")
      .where((eb) => eb.or([eb("public_key", "=", publicKey), eb("target_key", "=", publicKey)]))
      .execute();
    await this.db.deleteFrom("device_tokens").where("target_key", "=", publicKey).execute();
    for (const table of ["peer_status", "peer_runtime", "telemetry_samples", "contacts"] as const) {
      await this.db.deleteFrom(table).where("public_key", "=", publicKey).execute();
    }
    return true;
  }
}
