import { sql } from "kysely";
import { ContactRepository } from "./contacts.ts";
import { type Database, type Db, openDatabase } from "./database.ts";
import { DeviceTokenRepository } from "./device-tokens.ts";
import { NonceRepository } from "./nonces.ts";
import { PeerRepository } from "./peers.ts";
import { RuntimeRepository } from "./runtime.ts";
import { SessionRepository } from "./sessions.ts";
import { StatusRepository } from "./status.ts";
import { TelemetryRepository } from "./telemetry.ts";

export type { Db } from "./database.ts";

/** Every repository over one database handle. The only way the domain reaches stored state. */
export class Repositories {
  readonly peers: PeerRepository;
  readonly sessions: SessionRepository;
  readonly deviceTokens: DeviceTokenRepository;
  readonly assertionNonces: NonceRepository;
  readonly signalingNonces: NonceRepository;
  readonly status: StatusRepository;
  readonly runtime: RuntimeRepository;
  readonly telemetry: TelemetryRepository;
  readonly contacts: ContactRepository;

  constructor(protected readonly db: Db) {
    this.peers = new PeerRepository(db);
    this.sessions = new SessionRepository(db);
    this.deviceTokens = new DeviceTokenRepository(db);
    this.assertionNonces = new NonceRepository(db, "assertion_nonces");
    this.signalingNonces = new NonceRepository(db, "signaling_nonces");
    this.status = new StatusRepository(db);
    this.runtime = new RuntimeRepository(db);
    this.telemetry = new TelemetryRepository(db);
    this.contacts = new ContactRepository(db);
  }
}

/** The opened store: repositories over the pool, plus transactions, upkeep and shutdown. */
export class Store extends Repositories {
  private constructor(private readonly database: Database) {
    super(database.db);
  }

  static async open(url: string | undefined, dataDir: string): Promise<Store> {
    return new Store(await openDatabase(url, dataDir));
  }

  get dialect() {
    return this.database.dialect;
  }

  /** Runs `fn` in one transaction, with repositories bound to it; a throw rolls every write back. */
  transaction<T>(fn: (tx: Repositories) => Promise<T>): Promise<T> {
    return this.db.transaction().execute((tx) => fn(new Repositories(tx)));
  }

  /** Drops rows whose time has passed: nonces, expired sessions and device tokens. */
  async deleteExpired(now: number): Promise<void> {
    await this.assertionNonces.deleteExpired(now);
    await this.signalingNonces.deleteExpired(now);
    await this.sessions.deleteExpired(now);
    await this.deviceTokens.deleteExpired(now);
  }

  /** A round trip to the database. */
  async ping(): Promise<void> {
    await sql`select 1`.execute(this.db);
  }

  close(): Promise<void> {
    return this.database.close();
  }
}
