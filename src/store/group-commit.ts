import { sql } from "kysely";
import type { Db } from "./database.ts";
import { unavailableReason } from "./errors.ts";

interface Pending<T> {
  work: (tx: Db) => Promise<T>;
  resolve: (value: T) => void;
  reject: (reason: unknown) => void;
}

/** At most this many units share one commit, so one batch cannot hold the connection for long. */
const MAX_BATCH = 64;
/** How long a batch waits for another process's write lock before its units fail as unavailable (what `busy_timeout` was). */
export const LOCK_WAIT_MS = 5_000;
const LOCK_RETRY_MIN_MS = 10;
const LOCK_RETRY_MAX_MS = 250;

/** `begin immediate` found the write lock held by another process (SQLITE_BUSY). */
class LockBusy extends Error {}

/**
 * Group commit for a single-connection database (SQLite): transactions that arrive while one is
 * committing are run together in the next database transaction, each inside its own savepoint.
 * A unit that throws is rolled back to its savepoint alone; the others commit. Every caller is
 * answered only after the shared commit, so nobody sees a success that was not durable. Under
 * load this turns many small commits (a WAL write each) into few.
 *
 * When the shared commit fails for a reason other than the store being unavailable, each unit is
 * run again alone, so a unit fails only when it fails by itself. While another process holds the
 * write lock, the batch waits off the event loop (the connection's own `busy_timeout` is short)
 * and the connection stays free for reads; after `LOCK_WAIT_MS` its units fail (unavailable).
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
        try {
          settle(batch, await this.commit(batch));
        } catch (error) {
          if (batch.length === 1 || unavailableReason(error) !== undefined) {
            for (const unit of batch) unit.reject(error);
            continue;
          }
          // Not an outage: something in the batch broke the shared commit. Each unit alone.
          for (const unit of batch) {
            try {
              settle([unit], await this.commit([unit]));
            } catch (alone) {
              unit.reject(alone);
            }
          }
        }
      }
    } finally {
      this.running = false;
    }
  }

  /** Runs the batch in one transaction, waiting (off the event loop) for another process's write lock. */
  private async commit(batch: Pending<any>[]): Promise<Outcome[]> {
    const deadline = Date.now() + LOCK_WAIT_MS;
    for (let wait = LOCK_RETRY_MIN_MS; ; wait = Math.min(LOCK_RETRY_MAX_MS, wait * 2)) {
      try {
        return await this.db.connection().execute(async (tx) => {
          // IMMEDIATE takes the write lock at once: a deferred transaction that read first fails
          // whole with SQLITE_BUSY_SNAPSHOT when another connection commits before its first write.
          try {
            await sql`begin immediate`.execute(tx);
          } catch (error) {
            if (isBusy(error)) throw new LockBusy("the database is locked by another process", { cause: error });
            throw error;
          }
          try {
            const outcomes = await this.runUnits(tx, batch);
            await sql`commit`.execute(tx);
            return outcomes;
          } catch (error) {
            await sql`rollback`.execute(tx).catch(() => {});
            throw error;
          }
        });
      } catch (error) {
        if (!(error instanceof LockBusy)) throw error;
        // Past the wait: the SQLite error itself, which the store reports as unavailable.
        if (Date.now() + wait > deadline) throw error.cause;
        await new Promise((r) => setTimeout(r, wait));
      }
    }
  }

  /** Each unit in its own savepoint: one that throws is rolled back alone. */
  private async runUnits(tx: Db, batch: Pending<any>[]): Promise<Outcome[]> {
    const outcomes: Outcome[] = [];
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
    return outcomes;
  }
}

type Outcome = { ok: true; value: unknown } | { ok: false; error: unknown };

function settle(batch: Pending<any>[], outcomes: Outcome[]): void {
  batch.forEach((unit, i) => {
    const outcome = outcomes[i]!;
    if (outcome.ok) unit.resolve(outcome.value);
    else unit.reject(outcome.error);
  });
}

/** SQLITE_BUSY (5), with any extended code. */
function isBusy(error: unknown): boolean {
  const e = error as { code?: unknown; errcode?: unknown };
  return e?.code === "ERR_SQLITE_ERROR" && typeof e.errcode === "number" && (e.errcode & 0xff) === 5;
}
