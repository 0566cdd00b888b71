import type { Compilable, CompiledQuery } from "kysely";
import type { Db } from "./database.ts";

/**
 * A query built and compiled once, then run with fresh parameters. For the few queries on every
 * request's path: building and compiling through Kysely costs several times what SQLite does.
 * `build` receives placeholder values; `run` passes the real ones in the same order.
 */
export class CompiledStatement<R, P extends unknown[]> {
  private compiled: CompiledQuery<R> | undefined;

  constructor(
    private readonly db: Db,
    private readonly build: (db: Db, ...placeholders: P) => Compilable<R>,
    private readonly placeholders: P,
  ) {}

  async run(...parameters: P): Promise<R[]> {
    this.compiled ??= this.build(this.db, ...this.placeholders).compile();
    if (this.compiled.parameters.length !== parameters.length) throw new Error("compiled statement: parameter count mismatch");
    const { rows } = await this.db.executeQuery<R>({ ...this.compiled, parameters });
    return rows;
  }
}
