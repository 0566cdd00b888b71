import type { Compilable, CompiledQuery, QueryResult } from "kysely";
import { type Db, directReadOf } from "./database.ts";
import type { DialectName } from "./migrations.ts";

/**
 * A query built and compiled once per dialect, then run with fresh parameters on any handle (the
 * pool or a transaction). For the queries on the hottest paths: building and compiling through
 * Kysely costs more than SQLite spends running them. `shape` gives the type of each value (a
 * nullable one by a value of its non-null type); `build` is called once with a distinct sentinel
 * per value, and the compiled parameters must be exactly those sentinels in the same order, so a
 * builder that binds its values in another order (or twice, or as SQL text) is refused at once
 * instead of binding silently wrong.
 */
export function compiled<R, P extends unknown[]>(build: (db: Db, ...values: P) => Compilable<R>, ...shape: P) {
  const run = compiledResult(build, ...shape);
  return async (db: Db, dialect: DialectName, ...parameters: P): Promise<R[]> => (await run(db, dialect, ...parameters)).rows;
}

/** `compiled`, resolving with the whole result (rows and the count of rows changed). */
function compiledResult<R, P extends unknown[]>(build: (db: Db, ...values: P) => Compilable<R>, ...shape: P) {
  const byDialect = new Map<DialectName, CompiledQuery<R>>();
  return (db: Db, dialect: DialectName, ...parameters: P): Promise<QueryResult<R>> => {
    let query = byDialect.get(dialect);
    if (!query) {
      query = compileChecked(db, build, shape);
      byDialect.set(dialect, query);
    }
    // A read on SQLite's main connection outside any transaction runs at once (see DirectRead).
    const rows = directReadOf(db)?.(query.sql, parameters);
    if (rows) return Promise.resolve({ rows: rows as R[] });
    return db.executeQuery<R>({ ...query, parameters });
  };
}

function compileChecked<R, P extends unknown[]>(db: Db, build: (db: Db, ...values: P) => Compilable<R>, shape: P): CompiledQuery<R> {
  const sentinels = shape.map((value, i) => sentinel(value, i)) as P;
  const query = build(db, ...sentinels).compile();
  const got = query.parameters;
  if (got.length !== sentinels.length || sentinels.some((s, i) => got[i] !== s)) {
    throw new Error(
      `compiled query: its parameters must be its values, each bound once and in argument order; got ${JSON.stringify(got)} for ${JSON.stringify(sentinels)}`,
    );
  }
  return query;
}

/** A value of the slot's type that no other slot has. */
function sentinel(value: unknown, i: number): unknown {
  switch (typeof value) {
    case "string":
      return `\u0001compiled-slot-${i}`;
    case "number":
      return 1_000_000_007 + i;
    case "bigint":
      return 1_000_000_007n + BigInt(i);
    case "boolean":
      throw new Error("compiled query: booleans bind as two values; pass a number");
    default:
      throw new Error(`compiled query: value ${i} must be shaped by a string or a number, got ${value === null ? "null" : typeof value}`);
  }
}

/** Rows one batched statement carries at most. */
export const MAX_BATCH_ROWS = 256;

/**
 * A statement over many rows (`build` receives every row's values, in order), compiled once per
 * row count: rows are cut into statements of power-of-two sizes up to `maxRows`, so at most a few
 * shapes are ever compiled. `row` gives the shape of one row's values (as `compiled`'s `shape`).
 * Resolves with every statement's result rows, in order; `each`, when given, hears each statement's
 * rows, the index and count of the rows it carried, and the count of rows it changed.
 */
export function batched<R>(build: (db: Db, values: unknown[], rows: number) => Compilable<R>, row: unknown[], maxRows = MAX_BATCH_ROWS) {
  const bySize = new Map<number, ReturnType<typeof compiledResult<R, unknown[]>>>();
  return async (
    db: Db,
    dialect: DialectName,
    rows: ReadonlyArray<readonly unknown[]>,
    each?: (result: R[], first: number, count: number, changed: number) => void,
  ): Promise<R[]> => {
    const out: R[] = [];
    for (let i = 0; i < rows.length; ) {
      const n = Math.min(maxRows, 2 ** Math.floor(Math.log2(rows.length - i)));
      let query = bySize.get(n);
      if (!query) {
        query = compiledResult<R, unknown[]>((d, ...values) => build(d, values, n), ...Array.from({ length: n }, () => row).flat());
        bySize.set(n, query);
      }
      const values: unknown[] = [];
      for (let j = i; j < i + n; j++) for (const v of rows[j]!) values.push(v);
      const { rows: result, numAffectedRows } = await query(db, dialect, ...values);
      each?.(result, i, n, Number(numAffectedRows ?? 0));
      for (const r of result) out.push(r);
      i += n;
    }
    return out;
  };
}
