import type { Compilable, CompiledQuery } from "kysely";
import type { Db } from "./database.ts";
import type { DialectName } from "./migrations.ts";

/**
 * A query built and compiled once per dialect, then run with fresh parameters on any handle (the
 * pool or a transaction). For the queries on the hottest paths: building and compiling through
 * Kysely costs more than SQLite spends running them. `build` is called once with `shape`, values
 * of the right types that only fix the query's form; callers then pass the real values, in the
 * same order, each of which must become exactly one bound parameter.
 */
export function compiled<R, P extends unknown[]>(build: (db: Db, ...values: P) => Compilable<R>, ...shape: P) {
  const byDialect = new Map<DialectName, CompiledQuery<R>>();
  return async (db: Db, dialect: DialectName, ...parameters: P): Promise<R[]> => {
    let query = byDialect.get(dialect);
    if (!query) {
      query = build(db, ...shape).compile();
      if (query.parameters.length !== shape.length) throw new Error("compiled query: each value must be one bound parameter");
      byDialect.set(dialect, query);
    }
    const { rows } = await db.executeQuery<R>({ ...query, parameters });
    return rows;
  };
}
