import type { Compilable, CompiledQuery } from "kysely";
import type { Db } from "./database.ts";
import type { DialectName } from "./migrations.ts";

/**
 * A query built and compiled once per dialect, then run with fresh parameters on any handle (the
 * pool or a transaction). For the queries on the hottest paths: building and compiling through
 * Kysely costs more than SQLite spends running them. `build` gets placeholder values; callers pass
 * the real ones in the same order.
 */
export function compiled<R, P extends unknown[]>(build: (db: Db, ...placeholders: P) => Compilable<R>, ...placeholders: P) {
  const byDialect = new Map<DialectName, CompiledQuery<R>>();
  return async (db: Db, dialect: DialectName, ...parameters: P): Promise<R[]> => {
    let query = byDialect.get(dialect);
    if (!query) {
      query = build(db, ...placeholders).compile();
      if (query.parameters.length !== placeholders.length) throw new Error("compiled query: each placeholder must be one parameter");
      byDialect.set(dialect, query);
    }
    const { rows } = await db.executeQuery<R>({ ...query, parameters });
    return rows;
  };
}
