import { sql } from "kysely";
import type { Db } from "./database.ts";

interface Pending<T> {
  work: (tx: Db) => Promise<T>;
  resolve: (value: T) => void;
  reject: (reason: unknown) => void;
}

/** At most this many units share one commit, so one batch cannot hold the connection for long. */
const MAX_BATCH = 64;

/**
 * Group commit for a single-connection database (SQLite): transactions that arrive while one is
 * committing are run together in the next database transaction, each inside its own savepoint.
 * A unit that throws is rolled back to its savepoint alone; the others commit. Every caller is
 * answered only after the shared commit, so nobody sees a success that was not durable. Under
 * load this turns many small commits (a WAL write each) into few.
 */
export class GroupCommit {
  private queue: Pending<any>[] = [];
  private running = false;

  private readonly db: Db;

  constructor(db: Db) {
    this.db = db;
  }

  run<T>(work: (tx: Db) => Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      this.queue.push({ work, resolve, reject });
      if (!this.running) {
        this.running = true;
        // Wait one turn of the event loop: the requests that arrived with this one join the batch.
        setImmediate(() => void this.drain());
      }
    });
  }

  private async drain(): Promise<void> {
    try {
      while (this.queue.length > 0) {
        const batch = this.queue.splice(0, MAX_BATCH);
        const outcomes: Outcome[] = [];
        try {
          await this.db.connection().execute(async (tx) => {
            // IMMEDIATE takes the write lock at once (waiting up to busy_timeout for another
            // process's writer): a deferred transaction that read first fails whole with
            // SQLITE_BUSY_SNAPSHOT when another connection commits before its first write.
            await sql`begin immediate`.execute(tx);
            try {
              await this.runUnits(tx, batch, outcomes);
              await sql`commit`.execute(tx);
            } catch (error) {
              await sql`rollback`.execute(tx).catch(() => {});
              throw error;
            }
          });
        } catch (error) {
          for (const unit of batch) unit.reject(error);
          continue;
        }
        batch.forEach((unit, i) => {
          const outcome = outcomes[i]!;
          if (outcome.ok) unit.resolve(outcome.value);
          else unit.reject(outcome.error);
        });
      }
    } finally {
      this.running = false;
    }
  }

  /** Each unit in its own savepoint: one that throws is rolled back alone. */
  private async runUnits(tx: Db, batch: Pending<any>[], outcomes: Outcome[]): Promise<void> {
    for (const unit of batch) {
      await sql`savepoint unit`.execute(tx);
      try {
        outcomes.push({ ok: true, value: await unit.work(tx) });
        await sql`release savepoint unit`.execute(tx);
      } catch (error) {
        await sql`rollback to savepoint unit`.execute(tx);
        await sql`release savepoint unit`.execute(tx);
        outcomes.push({ ok: false, error });
      }
    }
  }
}

type Outcome = { ok: true; value: unknown } | { ok: false; error: unknown };
