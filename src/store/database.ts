import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { DatabaseSync, type StatementSync } from "node:sqlite";
import { Kysely, PostgresDialect, type SqliteDatabase, SqliteDialect, type SqliteStatement } from "kysely";
import { Migrator } from "kysely/migration";
import pg from "pg";
import { type DialectName, migrationProvider } from "./migrations.ts";
import type { Tables } from "./schema.ts";

export type Db = Kysely<Tables>;

export interface Database {
  db: Db;
  dialect: DialectName;
  close(): Promise<void>;
}

/** Adapts `node:sqlite` to the better-sqlite3 shape Kysely's SQLite dialect drives, caching statements. */
function nodeSqlite(path: string): SqliteDatabase {
  const db = new DatabaseSync(path);
  db.exec(`PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 5000; PRAGMA foreign_keys = ON; ${process.env.XPRAGMA ?? ""}`);
  const cache = new Map<string, SqliteStatement>();
  const wrap = (stmt: StatementSync): SqliteStatement => ({
    reader: stmt.columns().length > 0,
    all: (params) => stmt.all(...(params as never[])),
    run: (params) => stmt.run(...(params as never[])),
    iterate: (params) => stmt.iterate(...(params as never[])) as IterableIterator<unknown>,
  });
  return {
    close: () => db.close(),
    prepare(sql) {
      let stmt = cache.get(sql);
      if (!stmt) {
        if (cache.size >= 500) cache.clear();
        stmt = wrap(db.prepare(sql));
        cache.set(sql, stmt);
      }
      return stmt;
    },
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
export async function openDatabase(url: string | undefined, dataDir: string): Promise<Database> {
  let dialect: DialectName;
  let db: Db;
  if (url && /^postgres(ql)?:\/\//.test(url)) {
    dialect = "postgres";
    const pool = new pg.Pool({ connectionString: url, max: 10, types: pgTypes });
    db = new Kysely<Tables>({ dialect: new PostgresDialect({ pool }) });
  } else {
    dialect = "sqlite";
    const file = url ? url.replace(/^sqlite:(\/\/)?/, "") : join(dataDir, "perch.db");
    if (!url) mkdirSync(dataDir, { recursive: true });
    db = new Kysely<Tables>({ dialect: new SqliteDialect({ database: nodeSqlite(file) }) });
  }
  const { error, results } = await new Migrator({ db, provider: migrationProvider(dialect) }).migrateToLatest();
  const failed = results?.find((r) => r.status === "Error");
  if (error || failed) {
    await db.destroy();
    throw new Error(`store migration failed${failed ? ` at ${failed.migrationName}` : ""}: ${String(error)}`);
  }
  return { db, dialect, close: () => db.destroy() };
}
