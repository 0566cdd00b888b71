import { sql } from "kysely";
import { ContactRepository } from "./contacts.ts";
import { type Database, type Db, openDatabase } from "./database.ts";
import { DeviceTokenRepository } from "./device-tokens.ts";
import { GroupCommit } from "./group-commit.ts";
import type { DialectName } from "./migrations.ts";
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

  protected readonly db: Db;
  readonly dialect: DialectName;

  constructor(db: Db, dialect: DialectName) {
    this.db = db;
    this.dialect = dialect;
    this.peers = new PeerRepository(db, dialect);
    this.sessions = new SessionRepository(db, dialect);
    this.deviceTokens = new DeviceTokenRepository(db);
    this.assertionNonces = new NonceRepository(db, dialect, "assertion_nonces");
    this.signalingNonces = new NonceRepository(db, dialect, "signaling_nonces");
    this.status = new StatusRepository(db, dialect);
    this.runtime = new RuntimeRepository(db);
    this.telemetry = new TelemetryRepository(db);
    this.contacts = new ContactRepository(db);
  }
}

/** The opened store: repositories over the pool, plus transactions, upkeep and shutdown. */
export class Store extends Repositories {
  /** SQLite has one connection, so its transactions are grouped into shared commits. */
  private readonly groupCommit: GroupCommit | undefined;

  private readonly database: Database;

  private constructor(database: Database) {
    super(database.db, database.dialect);
    this.database = database;
    this.groupCommit = database.dialect === "sqlite" ? new GroupCommit(database.db) : undefined;
  }

  static async open(url: string | undefined, dataDir: string): Promise<Store> {
    return new Store(await openDatabase(url, dataDir));
  }

  /** Runs `fn` in one transaction, with repositories bound to it; a throw rolls every write back. */
  transaction<T>(fn: (tx: Repositories) => Promise<T>): Promise<T> {
    const work = (tx: Db) => fn(new Repositories(tx, this.dialect));
    return this.groupCommit ? this.groupCommit.run(work) : this.db.transaction().execute(work);
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
