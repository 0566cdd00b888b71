import { AsyncLocalStorage } from "node:async_hooks";
import { sql } from "kysely";
import { BUS_MESSAGE_KEEP_MS, BusMessageRepository } from "./bus-messages.ts";
import { ContactRepository } from "./contacts.ts";
import { ConversationRepository } from "./conversations.ts";
import { type Database, type Db, openDatabase } from "./database.ts";
import { DeviceTokenRepository } from "./device-tokens.ts";
import { classify } from "./errors.ts";
import { GroupCommit } from "./group-commit.ts";
import { LiveStreamRepository } from "./live-streams.ts";
import { LockRepository } from "./locks.ts";
import { MemoryRepository, type SecureWrites } from "./memories.ts";
import type { DialectName } from "./migrations.ts";
import { NodeRepository } from "./nodes.ts";
import { NonceRepository } from "./nonces.ts";
import { PeerRepository } from "./peers.ts";
import { ReadPool } from "./read-pool.ts";
import { RecordingRepository } from "./recordings.ts";
import { RuntimeRepository } from "./runtime.ts";
import { SessionRepository } from "./sessions.ts";
import { StatusRepository } from "./status.ts";
import { TableRewrite } from "./table-rewrite.ts";
import { type QueryRunner, TelemetryRepository } from "./telemetry.ts";
import { UsageRepository } from "./usage.ts";
import { WriteMemory, WriteMemoryUnit } from "./write-memory.ts";

export type { Db } from "./database.ts";
export { StoreUnavailable } from "./errors.ts";

/** Every repository over one database handle: what `Store.read` and `Store.transaction` hand out. */
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
  readonly conversations: ConversationRepository;
  readonly memories: MemoryRepository;
  readonly recordings: RecordingRepository;
  readonly locks: LockRepository;
  readonly liveStreams: LiveStreamRepository;
  readonly busMessages: BusMessageRepository;
  readonly nodes: NodeRepository;
  readonly usage: UsageRepository;

  /**
   * `authChanged`: told of each write that can end a session's authentication (see `Store.authStamp`).
   * `memory`: the transaction's view of what the telemetry writes remember (SQLite only).
   * `secureWrites`: the store's count of memory writes under way (see MemoryRepository).
   */
  constructor(db: Db, dialect: DialectName, authChanged: () => void, secureWrites: SecureWrites, longReads?: QueryRunner, memory?: WriteMemoryUnit) {
    this.peers = new PeerRepository(db, dialect, authChanged, memory?.memory);
    this.sessions = new SessionRepository(db, dialect, authChanged);
    this.deviceTokens = new DeviceTokenRepository(db);
    this.assertionNonces = new NonceRepository(db, dialect, "assertion_nonces");
    this.signalingNonces = new NonceRepository(db, dialect, "signaling_nonces");
    this.status = new StatusRepository(db, dialect, memory);
    this.runtime = new RuntimeRepository(db);
    this.telemetry = new TelemetryRepository(db, dialect, longReads, memory);
    this.contacts = new ContactRepository(db, dialect);
    this.locks = new LockRepository(db, dialect);
    this.conversations = new ConversationRepository(db, this.locks);
    this.memories = new MemoryRepository(db, dialect, secureWrites);
    this.recordings = new RecordingRepository(db, dialect, secureWrites);
    this.liveStreams = new LiveStreamRepository(db, dialect);
    this.busMessages = new BusMessageRepository(db, dialect);
    this.nodes = new NodeRepository(db);
    this.usage = new UsageRepository(db, dialect);
  }
}

/** Set while a transaction's callback runs, so that nested store use fails at once. */
const inTransaction = new AsyncLocalStorage<true>();

export interface StoreOptions {
  /** SQLite only: worker threads that run long telemetry reads off the event loop (0: run them inline). */
  readWorkers?: number;
  /** Hears of errors on connections no request is using (PostgreSQL ending an idle connection). */
  onError?: (err: Error) => void;
}

/**
 * The opened store. Stored state is reached only through `read` (no transaction) and `transaction`;
 * neither may be called from inside a transaction's callback (on SQLite that would wait on the
 * very connection the transaction holds; on PostgreSQL it would silently run outside it).
 */
export class Store {
  readonly dialect: DialectName;
  /** The SQLite file (for a connection of one's own, as the transport's watch of other processes' commits), if any. */
  get sqliteFile(): string | undefined {
    return this.database.file;
  }
  /** SQLite has one connection, so its transactions are grouped into shared commits. */
  private readonly groupCommit: GroupCommit | undefined;
  /** SQLite: what the telemetry writes remember between transactions (see WriteMemory). */
  private readonly memory: WriteMemory | undefined;
  private readonly readers: Repositories;
  private readonly readPool: ReadPool | undefined;
  private readonly database: Database;
  private authStampValue = 0;
  /** A log truncation tried again later (readers kept it busy). */
  private truncateRetry: NodeJS.Timeout | undefined;
  private closed = false;
  private readonly secureWrites: SecureWrites = { count: 0 };
  private lastDataVersion: number | undefined;

  private constructor(database: Database, readPool: ReadPool | undefined) {
    this.database = database;
    this.dialect = database.dialect;
    this.readPool = readPool;
    this.groupCommit = database.dialect === "sqlite" ? new GroupCommit(database.db) : undefined;
    this.memory = database.dataVersion && new WriteMemory(database.dataVersion);
    this.readers = new Repositories(
      database.db,
      database.dialect,
      () => this.authStampValue++,
      this.secureWrites,
      readPool && ((query) => readPool.query(query)),
      this.memory && new WriteMemoryUnit(this.memory),
    );
  }

  static async open(url: string | undefined, dataDir: string, options: StoreOptions = {}): Promise<Store> {
    const database = await openDatabase(url, dataDir, options.onError);
    const workers = options.readWorkers ?? 1;
    const pool = database.file !== undefined && workers > 0 ? new ReadPool(database.file, workers) : undefined;
    return new Store(database, pool);
  }

  /** Runs reads outside any transaction (on the pool for PostgreSQL); long telemetry reads run off the event loop. */
  read<T>(fn: (r: Repositories) => Promise<T>): Promise<T> {
    const nested = nestedUse("read");
    return nested ? Promise.reject(nested) : fn(this.readers).catch(rethrowClassified);
  }

  /** Runs `fn` in one write transaction, with repositories bound to it; a throw rolls every write back. */
  transaction<T>(fn: (tx: Repositories) => Promise<T>): Promise<T> {
    const nested = nestedUse("transaction");
    if (nested) return Promise.reject(nested);
    let authChanged = false;
    const onAuthChange = () => {
      authChanged = true;
      this.authStampValue++;
    };
    // A new view of the memory for each run of the work (a group commit may run it again alone).
    let memory: WriteMemoryUnit | undefined;
    const work = (tx: Db) => {
      memory = this.memory && new WriteMemoryUnit(this.memory);
      return inTransaction.run(true, () => fn(new Repositories(tx, this.dialect, onAuthChange, this.secureWrites, undefined, memory)));
    };
    // Stamped again once the outcome is known: a read between the write and its commit saw the state before it.
    const stamp = () => {
      if (authChanged) this.authStampValue++;
    };
    return (this.groupCommit ? this.groupCommit.run(work) : this.database.db.transaction().execute(work)).then(
      (value) => {
        stamp();
        memory?.committed();
        return value;
      },
      (err: unknown) => {
        stamp();
        return rethrowClassified(err);
      },
    );
  }

  /**
   * A number that changes whenever what authentication reads may have changed: in this process, a
   * session revoked or trimmed, a peer's status changed or a peer removed (when the transaction
   * writes it and again once it ended); any commit by another process (the command line). Read it
   * before reading a session: a result cached under it is current while it holds. Undefined on
   * PostgreSQL, where other nodes' writes cannot be seen without a query.
   */
  authStamp(): number | undefined {
    if (!this.database.dataVersion) return undefined;
    const version = this.database.dataVersion();
    if (version !== this.lastDataVersion) {
      this.lastDataVersion = version;
      this.authStampValue++;
    }
    return this.authStampValue;
  }

  /**
   * Drops rows whose time has passed: nonces, expired sessions and device tokens, read bus messages, and telemetry
   * older than `telemetryBefore`, the latter in batches of at most `batch` rows, each its own
   * transaction, so that cleanup never holds the database for long.
   */
  async deleteExpired(now: number, telemetryBefore?: number, batch = 5_000): Promise<void> {
    await this.transaction(async (tx) => {
      await tx.assertionNonces.deleteExpired(now);
      await tx.signalingNonces.deleteExpired(now);
      await tx.sessions.deleteExpired(now);
      await tx.deviceTokens.deleteExpired(now);
      await tx.busMessages.deleteBefore(Date.now() - BUS_MESSAGE_KEEP_MS);
    });
    if (telemetryBefore === undefined) return;
    let cursor: number | undefined = 0;
    while (cursor !== undefined) {
      const after: number = cursor;
      cursor = (await this.transaction((tx) => tx.telemetry.deleteBefore(telemetryBefore, after, batch))).next;
      // Let waiting requests run between batches.
      await new Promise((resolve) => setImmediate(resolve));
    }
  }

  /**
   * SQLite: moves the write-ahead log into the database file and truncates it (`wal_checkpoint(TRUNCATE)`),
   * so that text just deleted with `secure_delete` is left in neither file; tried again while readers
   * hold the log. True once done; always true on PostgreSQL (nothing to do).
   */
  async truncateLog(tries = 20): Promise<boolean> {
    if (this.dialect !== "sqlite") return true;
    const nested = nestedUse("truncateLog");
    if (nested) throw nested;
    for (let i = 0; i < tries; i++) {
      const r = await sql<{ busy: number }>`PRAGMA wal_checkpoint(TRUNCATE)`.execute(this.database.db).catch(rethrowClassified);
      if (r.rows[0]?.busy === 0) return true;
      await new Promise((resolve) => setTimeout(resolve, 10 * (i + 1)));
    }
    return false;
  }

  /**
   * `truncateLog`, and when readers kept the log busy throughout, again in the background (backing
   * off to a minute) until it is done: forgotten text must not stay in the log file for good.
   */
  async truncateLogSoon(): Promise<boolean> {
    const done = await this.truncateLog();
    if (!done) this.retryTruncate(1_000);
    return done;
  }

  private retryTruncate(delayMs: number): void {
    if (this.truncateRetry || this.closed) return;
    this.truncateRetry = setTimeout(() => {
      this.truncateRetry = undefined;
      if (this.closed) return;
      this.truncateLog(1).then(
        (done) => {
          if (!done) this.retryTruncate(Math.min(delayMs * 2, 60_000));
        },
        () => this.retryTruncate(Math.min(delayMs * 2, 60_000)),
      );
    }, delayMs);
    this.truncateRetry.unref();
  }

  /**
   * Deleted recordings out of the database files: on SQLite they were overwritten (`secure_delete`)
   * and the log is truncated now; on PostgreSQL the recordings table is rewritten (`VACUUM FULL`,
   * which drops the files that held the dead rows) in the background, once every transaction older
   * than the deletion has ended (see TableRewrite), once for the deletions of a moment. Resolves once
   * the SQLite log is done (PostgreSQL: at once).
   */
  async eraseDeletedRecordings(): Promise<void> {
    if (this.dialect === "sqlite") {
      await this.truncateLogSoon();
      return;
    }
    this.recordingsRewrite ??= new TableRewrite(this.database.db, "conversation_recordings", () => ({
      onError: this.onCompactError,
      onWait: this.onCompactWait,
    }));
    this.recordingsRewrite.request();
  }

  /** Hears of a PostgreSQL rewrite that failed (it is tried again later, and with the next deletion). */
  onCompactError: ((err: unknown) => void) | undefined;
  /** Hears that a PostgreSQL rewrite waits for `older` transactions that began before the deletion. */
  onCompactWait: ((older: number) => void) | undefined;
  private recordingsRewrite: TableRewrite | undefined;

  /** Once no rewrite of the recordings table is under way or asked for (tests). */
  get recordingsCompacted(): Promise<void> {
    return this.recordingsRewrite?.settled ?? Promise.resolve();
  }

  /** A round trip to the database. */
  async ping(): Promise<void> {
    const nested = nestedUse("ping");
    if (nested) throw nested;
    await sql`select 1`.execute(this.database.db).catch(rethrowClassified);
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.truncateRetry) clearTimeout(this.truncateRetry);
    await this.recordingsRewrite?.close();
    await this.readPool?.close();
    await this.database.close();
  }
}

/**
 * A failure that means the store is unavailable (unreachable, restarting, full, locked) becomes
 * `StoreUnavailable`, which every surface answers with 503 and `Retry-After`.
 */
function rethrowClassified(err: unknown): never {
  throw classify(err);
}

function nestedUse(what: string): Error | undefined {
  return inTransaction.getStore()
    ? new Error(`store.${what}() called inside a transaction: use the repositories the transaction hands its callback`)
    : undefined;
}
