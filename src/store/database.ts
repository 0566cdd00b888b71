import { closeSync, mkdirSync, openSync } from "node:fs";
import { join } from "node:path";
import { DatabaseSync, type StatementSync } from "node:sqlite";
import { Kysely, PostgresDialect, type SqliteDatabase, SqliteDialect, type SqliteStatement, sql } from "kysely";
import { Migrator } from "kysely/migration";
import pg from "pg";
import { type DialectName, migrationProvider } from "./migrations.ts";
import type { Tables } from "./schema.ts";

export type Db = Kysely<Tables>;

export interface Database {
  db: Db;
  dialect: DialectName;
  /** The SQLite file, when the database is one another connection can open. */
  file: string | undefined;
  /**
   * SQLite: the main connection's `PRAGMA data_version`, which changes when another connection
   * (another process) commits, never for this connection's own commits; a few microseconds.
   */
  dataVersion: (() => number) | undefined;
  close(): Promise<void>;
}

const PG_CONNECT_TIMEOUT_MS = 5_000;

/**
 * What every SQLite connection of the store runs first. A 64 MiB page cache (the default is 2 MiB)
 * holds the leaf page each telemetry series writes to: with 2,000 devices a batch touches some
 * 4,000 of them, read back from the file each batch with the default (docs/decisions.md).
 */
export const SQLITE_PRAGMAS =
  "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 5000; PRAGMA foreign_keys = ON; PRAGMA cache_size = -65536;";
/**
 * The main connection's `busy_timeout` once migrated: node:sqlite waits for another process's lock
 * on the event loop, so the group commit waits for the write lock itself, between short tries, and
 * the node keeps serving meanwhile.
 */
const SQLITE_SERVING_BUSY_MS = 20;

/**
 * SQLite: runs a compiled read on the main connection at once, without Kysely's executor (its
 * connection lock and promise chain cost more than the statement on the hottest reads). Undefined
 * when that is not safe: a transaction is open on the connection (a read must not see its
 * uncommitted writes; through Kysely it waits for the transaction to end), or the SQL is not a read.
 */
export type DirectRead = (sql: string, parameters: readonly unknown[]) => unknown[] | undefined;

/** Where a main SQLite handle keeps its direct read (a property of the handle itself: a transaction's has none; no process-wide table). */
const DIRECT_READ = Symbol("direct read");

/** The direct read of `db`: a main SQLite handle's, else undefined (a transaction, PostgreSQL). */
export function directReadOf(db: Db): DirectRead | undefined {
  return (db as Db & { [DIRECT_READ]?: DirectRead })[DIRECT_READ];
}

/** Adapts `node:sqlite` to the better-sqlite3 shape Kysely's SQLite dialect drives, caching statements. */
function nodeSqlite(path: string): SqliteDatabase & { dataVersion(): number; directRead: DirectRead } {
  const db = new DatabaseSync(path);
  db.exec(SQLITE_PRAGMAS);
  const dataVersion = db.prepare("PRAGMA data_version");
  const cache = new Map<string, SqliteStatement & { select: boolean }>();
  const wrap = (stmt: StatementSync, sql: string): SqliteStatement & { select: boolean } => ({
    reader: stmt.columns().length > 0,
    // A plain read (a write with RETURNING is a reader too, and stays with Kysely's executor).
    select: /^select /i.test(sql),
    all: (params) => stmt.all(...(params as never[])),
    run: (params) => stmt.run(...(params as never[])),
    iterate: (params) => stmt.iterate(...(params as never[])) as IterableIterator<unknown>,
  });
  const prepare = (sql: string) => {
    let stmt = cache.get(sql);
    if (!stmt) {
      if (cache.size >= 500) cache.clear();
      stmt = wrap(db.prepare(sql), sql);
      cache.set(sql, stmt);
    }
    return stmt;
  };
  return {
    close: () => db.close(),
    dataVersion: () => (dataVersion.get() as { data_version: number }).data_version,
    directRead(sql, parameters) {
      if (db.isTransaction) return undefined;
      const stmt = prepare(sql);
      return stmt.select ? stmt.all(parameters) : undefined;
    },
    prepare,
  };
}

// int8 (bigint, count(*)) comes back from pg as a string; every such value here fits a double.
const pgTypes = {
  getTypeParser: ((oid: number, format?: "text" | "binary") =>
    oid === 20 ? (v: string) => Number(v) : pg.types.getTypeParser(oid, format as "text")) as typeof pg.types.getTypeParser,
};

/**
 * Opens the store named by `url`: `postgres://…` (or `postgresql://…`) selects PostgreSQL, anything
 * else is a SQLite file path; empty means `perch.db` in `dataDir`. Migrations run before it returns.
 */
export async function openDatabase(url: string | undefined, dataDir: string, onError?: (err: Error) => void): Promise<Database> {
  const database = connect(url, dataDir, onError);
  const { db, dialect } = database;
  const { error, results } = await new Migrator({ db, provider: migrationProvider(dialect) }).migrateToLatest();
  const failed = results?.find((r) => r.status === "Error");
  if (error || failed) {
    await db.destroy();
    throw new Error(`store migration failed${failed ? ` at ${failed.migrationName}` : ""}: ${String(error)}`);
  }
  if (dialect === "sqlite") await sql`PRAGMA busy_timeout = ${sql.lit(SQLITE_SERVING_BUSY_MS)}`.execute(db);
  return database;
}

/**
 * Connects to the database `url` names, without migrating it. `onError` hears of errors on idle
 * pooled PostgreSQL connections (the server ending them: a restart, a failover, an idle timeout);
 * such a connection leaves the pool and the next query opens a new one.
 */
export function connect(url: string | undefined, dataDir: string, onError: (err: Error) => void = () => {}): Database {
  let dialect: DialectName;
  let db: Db;
  let file: string | undefined;
  let dataVersion: (() => number) | undefined;
  if (url && /^postgres(ql)?:\/\//.test(url)) {
    dialect = "postgres";
    // A connection (new, or a free one from the pool) within 5 s, or the query fails as unavailable:
    // no request waits on an unreachable server for longer.
    const pool = new pg.Pool({ connectionString: url, max: 10, types: pgTypes, connectionTimeoutMillis: PG_CONNECT_TIMEOUT_MS, keepAlive: true });
    // Without a listener, an error on an idle connection ends the process ("error" on the pool),
    // and so does one on a checked-out connection between its queries ("error" on the client:
    // the pool listens only while the client is idle). Such a client is not queryable any more;
    // its query or its release fails, and the pool drops it.
    pool.on("error", onError);
    pool.on("connect", (client) => client.on("error", onError));
    db = new Kysely<Tables>({ dialect: new PostgresDialect({ pool }) });
  } else {
    dialect = "sqlite";
    const path = url ? url.replace(/^sqlite:(\/\/)?/, "") : join(dataDir, "perch.db");
    if (!url) mkdirSync(dataDir, { recursive: true, mode: 0o700 });
    const inMemory = path === ":memory:" || path === "";
    // Created owner-only before SQLite opens it; SQLite gives -wal and -shm the main file's mode.
    if (!inMemory) closeSync(openSync(path, "a", 0o600));
    file = inMemory ? undefined : path;
    const database = nodeSqlite(path);
    dataVersion = database.dataVersion;
    db = new Kysely<Tables>({ dialect: new SqliteDialect({ database }) });
    Object.defineProperty(db, DIRECT_READ, { value: (sql: string, parameters: readonly unknown[]) => database.directRead(sql, parameters), enumerable: false });
  }
  return { db, dialect, file, dataVersion, close: () => db.destroy() };
}
