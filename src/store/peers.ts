import { batched, compiled } from "./compiled.ts";
import type { Db } from "./database.ts";
import type { DialectName } from "./migrations.ts";
import type { Tables } from "./schema.ts";
import type { WriteMemory } from "./write-memory.ts";

export type PeerRow = Tables["peers"];

const peerByKey = compiled((db, key: string) => db.selectFrom("peers").selectAll().where("public_key", "=", key), "");
/** PostgreSQL only (SQLite has no row locks). */
const peerByKeyForShare = compiled((db, key: string) => db.selectFrom("peers").selectAll().where("public_key", "=", key).forKeyShare(), "");
/** Which of the keys are registered peers; on PostgreSQL each found peer is key-share locked, in key order. */
const existingPeers = batched<{ public_key: string }>(
  (db, values) =>
    db
      .selectFrom("peers")
      .select("public_key")
      .where("public_key", "in", values as string[]),
  [""],
);
const existingPeersForShare = batched<{ public_key: string }>(
  (db, values) =>
    db
      .selectFrom("peers")
      .select("public_key")
      .where("public_key", "in", values as string[])
      .orderBy("public_key")
      .forKeyShare(),
  [""],
);

export class PeerRepository {
  private readonly db: Db;
  private readonly dialect: DialectName;
  /** Told of every write that can end a session's authentication (status, removal). */
  private readonly authChanged: () => void;
  private readonly memory: WriteMemory | undefined;

  constructor(db: Db, dialect: DialectName, authChanged: () => void = () => {}, memory?: WriteMemory) {
    this.db = db;
    this.dialect = dialect;
    this.authChanged = authChanged;
    this.memory = memory;
  }

  async get(publicKey: string): Promise<PeerRow | undefined> {
    return (await peerByKey(this.db, this.dialect, publicKey))[0];
  }

  /**
   * The peer, kept from removal until the transaction ends (a key-share lock on PostgreSQL, which
   * still lets it be blocked; SQLite write transactions run one at a time).
   */
  async getForShare(publicKey: string): Promise<PeerRow | undefined> {
    return (await (this.dialect === "postgres" ? peerByKeyForShare : peerByKey)(this.db, this.dialect, publicKey))[0];
  }

  /** `getForShare` for many peers at once: the keys of those that exist. */
  async existingForShare(publicKeys: readonly string[]): Promise<Set<string>> {
    const keys = publicKeys.map((k) => [k]);
    const rows = await (this.dialect === "postgres" ? existingPeersForShare : existingPeers)(this.db, this.dialect, keys);
    return new Set(rows.map((r) => r.public_key));
  }

  list(): Promise<PeerRow[]> {
    return this.db.selectFrom("peers").selectAll().orderBy("created_at").orderBy("public_key").execute();
  }

  /** Registers the peer unless it already exists; true when this call registered it. */
  async register(row: PeerRow): Promise<boolean> {
    const r = await this.db
      .insertInto("peers")
      .values(row)
      .onConflict((oc) => oc.column("public_key").doNothing())
      .executeTakeFirst();
    return r.numInsertedOrUpdatedRows !== undefined && r.numInsertedOrUpdatedRows > 0n;
  }

  async setStatus(publicKey: string, status: string, now: number): Promise<boolean> {
    this.authChanged();
    const r = await this.db.updateTable("peers").set({ status, updated_at: now }).where("public_key", "=", publicKey).executeTakeFirst();
    return r.numUpdatedRows > 0n;
  }

  async setDeviceInfo(publicKey: string, deviceInfo: string, now: number): Promise<boolean> {
    const r = await this.db.updateTable("peers").set({ device_info: deviceInfo, updated_at: now }).where("public_key", "=", publicKey).executeTakeFirst();
    return r.numUpdatedRows > 0n;
  }

  /** Sets the device's voice agent (an id, `off`, or null for the default); false when there is no such peer. */
  async setVoiceAgent(publicKey: string, voiceAgent: string | null, now: number): Promise<boolean> {
    const r = await this.db.updateTable("peers").set({ voice_agent: voiceAgent, updated_at: now }).where("public_key", "=", publicKey).executeTakeFirst();
    return r.numUpdatedRows > 0n;
  }

  /** The device's voice agent setting: undefined when there is no such peer. */
  async voiceAgent(publicKey: string): Promise<string | null | undefined> {
    const row = await this.db.selectFrom("peers").select("voice_agent").where("public_key", "=", publicKey).executeTakeFirst();
    return row ? (row.voice_agent ?? null) : undefined;
  }

  /** Takes the peer's row lock for the rest of the transaction (serialises per-peer quotas across nodes). */
  async lock(publicKey: string): Promise<void> {
    await this.db
      .updateTable("peers")
      .set((eb) => ({ updated_at: eb.ref("updated_at") }))
      .where("public_key", "=", publicKey)
      .execute();
  }

  /**
   * Removes the peer; the foreign keys cascade to everything that belongs to it. Its sessions as
   * a controller of other devices are not the other devices' data, so they are deleted here.
   */
  async remove(publicKey: string): Promise<boolean> {
    this.authChanged();
    // Its telemetry series and status go with it: what the telemetry writes remember of them too.
    this.memory?.forget();
    const r = await this.db.deleteFrom("peers").where("public_key", "=", publicKey).executeTakeFirst();
    if (r.numDeletedRows === 0n) return false;
    await this.db.deleteFrom("sessions").where("public_key", "=", publicKey).execute();
    return true;
  }
}
