import { setTimeout as sleep } from "node:timers/promises";
import { sql } from "kysely";
import type { Db } from "./database.ts";

/** How long a rewrite waits for the transactions older than it to end before rewriting anyway. */
export const REWRITE_WAIT_MS = 60_000;
/** The first delay before a rewrite that could not drop everything is tried again; doubled up to REWRITE_RETRY_MAX_MS. */
const REWRITE_RETRY_MS = 60_000;
const REWRITE_RETRY_MAX_MS = 3_600_000;

export interface TableRewriteHooks {
  /** A rewrite failed; it is tried again later. */
  onError?: (err: unknown) => void;
  /** A rewrite waits for `older` transactions of the database that began before it was asked for. */
  onWait?: (older: number) => void;
}

/**
 * PostgreSQL: rewrites one table (`VACUUM FULL`) after rows were deleted from it, so that their
 * bytes are left in none of its files. A rewrite copies every row version that some transaction
 * may still see, the deleted ones included while a transaction that began before the deletion is
 * open (one that wrote, or a snapshot still read from). The rewrite's own snapshot counts too, and
 * its oldest running transaction id is taken from every database of the server: a writer in
 * another database that began before the deletion keeps the deleted rows as well. So each rewrite
 * first waits until every transaction of this database, every writer of any database and every
 * prepared transaction that began before the rewrite was asked for has ended; past
 * `REWRITE_WAIT_MS` it rewrites anyway (dropping what it can) and is tried again later. Requests
 * while one runs are coalesced into one more rewrite after it.
 */
export class TableRewrite {
  private readonly db: Db;
  private readonly table: string;
  private readonly hooks: () => TableRewriteHooks;
  private running: Promise<void> | undefined;
  private again = false;
  private closed = false;
  private readonly stop = new AbortController();
  private retry: NodeJS.Timeout | undefined;
  private retryMs = REWRITE_RETRY_MS;

  constructor(db: Db, table: string, hooks: () => TableRewriteHooks) {
    this.db = db;
    this.table = table;
    this.hooks = hooks;
  }

  /** Asks for a rewrite covering every deletion committed so far; returns at once. */
  request(): void {
    if (this.closed) return;
    this.again = true;
    this.running ??= this.loop();
  }

  /** Resolves once no rewrite is under way or asked for (one tried again later aside). */
  get settled(): Promise<void> {
    return this.running ?? Promise.resolve();
  }

  /** Stops waiting for older transactions (the rewrite under way is done at once) and tries nothing again. */
  async close(): Promise<void> {
    this.closed = true;
    this.stop.abort();
    if (this.retry) clearTimeout(this.retry);
    await this.running;
  }

  private async loop(): Promise<void> {
    try {
      while (this.again && !this.closed) {
        this.again = false;
        let complete = false;
        try {
          complete = await this.rewrite();
        } catch (err) {
          // The hook is the node's log: should it throw, the loop still ends (no rejection nobody awaits).
          try {
            this.hooks().onError?.(err);
          } catch {}
        }
        if (complete) {
          this.retryMs = REWRITE_RETRY_MS;
        } else if (!this.closed && !this.retry) {
          this.retry = setTimeout(() => {
            this.retry = undefined;
            this.request();
          }, this.retryMs);
          this.retry.unref();
          this.retryMs = Math.min(this.retryMs * 2, REWRITE_RETRY_MAX_MS);
        }
      }
    } finally {
      // No await between the last check of `again` and here: a request from now on starts a new loop.
      this.running = undefined;
    }
  }

  /** One rewrite; true when no transaction older than the request was left to keep deleted rows. */
  private async rewrite(): Promise<boolean> {
    // Every transaction id below this one had been handed out when the rewrite was asked for.
    const next = await sql<{ next: string }>`select pg_snapshot_xmax(pg_current_snapshot())::text as next`.execute(this.db);
    // The same id as a 32-bit xid, for age(): the transactions whose id or snapshot is older than it.
    const before = (BigInt(next.rows[0]!.next) % 2n ** 32n).toString();
    const deadline = performance.now() + REWRITE_WAIT_MS;
    let pause = 10;
    let older = await this.olderTransactions(before);
    if (older > 0) this.hooks().onWait?.(older);
    while (older > 0 && performance.now() < deadline && !this.closed) {
      try {
        await sleep(pause, undefined, { signal: this.stop.signal, ref: false });
      } catch {
        break; // closing: rewrite now
      }
      pause = Math.min(pause * 2, 1_000);
      older = await this.olderTransactions(before);
    }
    // On a connection of its own, waiting at most 10 s for its lock (never queueing readers behind it for long).
    await this.db.connection().execute(async (conn) => {
      await sql`set lock_timeout = '10s'`.execute(conn);
      try {
        await sql`vacuum full ${sql.table(this.table)}`.execute(conn);
      } finally {
        await sql`reset lock_timeout`.execute(conn);
      }
    });
    return older === 0;
  }

  /**
   * How many sessions hold a transaction id older than `before` (in any database: `VACUUM FULL`'s own
   * snapshot has the server's oldest running id as its horizon), or a snapshot older than it (in
   * this database; other databases' snapshots hold none of its rows), and how many prepared
   * transactions (any database) are older.
   */
  private async olderTransactions(before: string): Promise<number> {
    const r = await sql<{ n: string }>`
      select (
        select count(*) from pg_stat_activity
        where pid <> pg_backend_pid()
          and (
            age(backend_xid) > age(${before}::xid)
            or (datid = (select oid from pg_database where datname = current_database()) and age(backend_xmin) > age(${before}::xid))
          )
      ) + (
        select count(*) from pg_prepared_xacts where age(transaction) > age(${before}::xid)
      ) as n`.execute(this.db);
    return Number(r.rows[0]!.n);
  }
}
