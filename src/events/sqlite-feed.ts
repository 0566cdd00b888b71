import { DatabaseSync } from "node:sqlite";
import { InProcessBus } from "./bus.ts";

/** Rows read per poll at most; more wait for the next poll. */
const BATCH = 1_000;

/**
 * The bus of a node on SQLite: this process's subscribers, plus the messages other processes
 * sharing the file (the `perch` command line, a second node) wrote to `bus_messages` in the
 * transactions whose changes they announce.
 *
 * A read-only connection of its own reads `PRAGMA data_version` every `pollMs` (it changes when
 * another connection commits; a few microseconds to read); when it changed, the rows after the
 * last one seen, and delivers those another bus wrote here as if they had been published here.
 * Rows written before the node started are history and skipped.
 */
export class SqliteBus extends InProcessBus {
  private readonly db: DatabaseSync;
  private readonly poller: NodeJS.Timeout;
  private readonly onFeedError: (err: unknown) => void;
  private dataVersion = -1;
  private lastId: number;

  constructor(o: { file: string; pollMs: number; onError: (err: unknown) => void }) {
    super(o.onError);
    this.onFeedError = o.onError;
    this.db = new DatabaseSync(o.file, { readOnly: true });
    this.lastId = Number((this.db.prepare("SELECT coalesce(max(id), 0) AS id FROM bus_messages").get() as { id: number }).id);
    this.poller = setInterval(() => this.poll(), o.pollMs);
    this.poller.unref();
  }

  private poll(): void {
    try {
      const version = Number((this.db.prepare("PRAGMA data_version").get() as { data_version: number }).data_version);
      if (version === this.dataVersion) return;
      this.dataVersion = version;
      const rows = this.db.prepare("SELECT id, origin, topic, message FROM bus_messages WHERE id > ? ORDER BY id LIMIT ?").all(this.lastId, BATCH) as Array<{
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
      this.publish(topic, JSON.parse(text));
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
