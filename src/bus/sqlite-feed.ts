import { DatabaseSync, type StatementSync } from "node:sqlite";
import { type BusMessage, InProcessBus } from "./bus.ts";

/** Rows read per poll at most; more wait for the next poll. */
const BATCH = 1_000;

/** Topics addressed to one node or one bus instance: commands and their replies. */
const ADDRESSED = /^(node|replies):/;

/** Writes a message to `bus_messages` for the other processes (the store's own transaction). */
export type Persist = (origin: string, topic: string, message: BusMessage) => Promise<void>;

/**
 * The bus of a node on SQLite: this process's subscribers, plus the messages other processes
 * sharing the file (the `perch` command line, a second node) wrote to `bus_messages` in the
 * transactions whose changes they announce.
 *
 * A read-only connection of its own reads `PRAGMA data_version` every `pollMs` (it changes when
 * another connection commits; a few microseconds to read); when it changed, the rows after the
 * last one seen, and delivers those another bus wrote here as if they had been published here.
 * Rows written before the node started are history and skipped.
 *
 * Commands to a node and their replies (`commands.ts`) have no change to ride with: published here
 * for nobody in this process, they are written to `bus_messages` through `persist` (the store), so
 * that the command line can ask a node on the same file (`perch peers tools`).
 */
export class SqliteBus extends InProcessBus {
  private readonly db: DatabaseSync;
  private readonly poller: NodeJS.Timeout;
  private readonly onFeedError: (err: unknown) => void;
  private readonly persist: Persist | undefined;
  private readonly dataVersionQuery: StatementSync;
  private readonly rowsAfter: StatementSync;
  private dataVersion = -1;
  private lastId: number;

  constructor(o: { file: string; pollMs: number; onError: (err: unknown) => void; persist?: Persist }) {
    super(o.onError);
    this.onFeedError = o.onError;
    this.persist = o.persist;
    this.db = new DatabaseSync(o.file, { readOnly: true });
    this.lastId = Number((this.db.prepare("SELECT coalesce(max(id), 0) AS id FROM bus_messages").get() as { id: number }).id);
    this.dataVersionQuery = this.db.prepare("PRAGMA data_version");
    this.rowsAfter = this.db.prepare("SELECT id, origin, topic, message FROM bus_messages WHERE id > ? ORDER BY id LIMIT ?");
    this.poller = setInterval(() => this.poll(), o.pollMs);
    this.poller.unref();
  }

  override publish(topic: string, message: BusMessage): void {
    super.publish(topic, message);
    if (this.persist && ADDRESSED.test(topic) && !this.subs.has(topic)) {
      this.persist(this.instance, topic, message).catch((err: unknown) => this.onFeedError(err));
    }
  }

  /** Also a command or reply for another process, which goes to it through the store. */
  override listened(topic: string): boolean {
    return super.listened(topic) || (this.persist !== undefined && ADDRESSED.test(topic));
  }

  private poll(): void {
    try {
      const version = Number((this.dataVersionQuery.get() as { data_version: number }).data_version);
      if (version === this.dataVersion) return;
      this.dataVersion = version;
      const rows = this.rowsAfter.all(this.lastId, BATCH) as Array<{
        id: number;
        origin: string;
        topic: string;
        message: string;
      }>;
      for (const r of rows) {
        this.lastId = Number(r.id);
        if (r.origin !== this.instance) this.deliver(r.topic, r.message);
      }
      // A full batch: more may wait, whatever the version says next time.
      if (rows.length === BATCH) this.dataVersion = -1;
    } catch (err) {
      this.onFeedError(err);
    }
  }

  /** One row's message; one that cannot be read is reported and skipped. */
  private deliver(topic: string, text: string): void {
    try {
      super.publish(topic, JSON.parse(text));
    } catch (err) {
      this.onFeedError(err);
    }
  }

  override async close(): Promise<void> {
    clearInterval(this.poller);
    if (this.db.isOpen) this.db.close();
    await super.close();
  }
}
