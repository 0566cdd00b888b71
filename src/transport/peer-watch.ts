import { DatabaseSync } from "node:sqlite";
import type { PeerMessage } from "../domain/events.ts";
import type { Domain } from "../domain/index.ts";
import { topics } from "../events/index.ts";

/**
 * Tells the transport, at once, that a connected peer was blocked or removed, whichever process
 * did it (`perch peers block/remove` runs apart from the node, writing to the store directly):
 *
 * - the event bus's `peers` topic: in this process, and across processes on PostgreSQL
 *   (`NOTIFY`); after a gap in the bus (the node stopped listening for a while) every connected
 *   peer is checked in the store;
 * - on SQLite, where processes share no bus: a connection of its own polls `PRAGMA data_version`
 *   (which changes when another connection commits, a few microseconds to read); when it changed,
 *   a signature of the peers table (rows and latest `updated_at`), and when that changed, the
 *   status of every connected peer.
 */
export class PeerWatch {
  private readonly domain: Domain;
  private readonly connected: () => string[];
  private readonly cut: (key: string, why: "blocked" | "removed") => void;
  private readonly onError: (err: unknown) => void;
  private readonly unsubscribe: () => void;
  private sqlite: DatabaseSync | undefined;
  private poller: NodeJS.Timeout | undefined;
  private dataVersion = -1;
  private signature = "";

  constructor(o: {
    domain: Domain;
    /** Keys of the peers connected here. */
    connected: () => string[];
    /** Closes the key's connection here. */
    cut: (key: string, why: "blocked" | "removed") => void;
    /** How often SQLite's data version is read; 0 turns the poll off. */
    pollMs: number;
    onError: (err: unknown) => void;
  }) {
    this.domain = o.domain;
    this.connected = o.connected;
    this.cut = o.cut;
    this.onError = o.onError;
    this.unsubscribe = o.domain.ctx.events.bus.subscribe(topics.peers, {
      message: (m) => {
        const { kind, key } = m as PeerMessage;
        if (kind === "blocked" || kind === "removed") this.cut(key, kind);
      },
      gap: () => void this.recheck(),
    });
    const file = o.domain.ctx.store.sqliteFile;
    if (file && o.pollMs > 0) {
      this.sqlite = new DatabaseSync(file, { readOnly: true });
      this.poller = setInterval(() => this.poll(), o.pollMs);
      this.poller.unref();
    }
  }

  private poll(): void {
    try {
      const db = this.sqlite!;
      const version = Number((db.prepare("PRAGMA data_version").get() as { data_version: number }).data_version);
      if (version === this.dataVersion) return;
      this.dataVersion = version;
      const row = db.prepare("SELECT count(*) AS n, max(updated_at) AS u FROM peers").get() as { n: number; u: number | null };
      const signature = `${row.n}/${row.u}`;
      if (signature === this.signature) return;
      const first = this.signature === "";
      this.signature = signature;
      if (first) return;
      const keys = this.connected();
      const status = new Map<string, string>();
      for (let i = 0; i < keys.length; i += 500) {
        const chunk = keys.slice(i, i + 500);
        const rows = db.prepare(`SELECT public_key, status FROM peers WHERE public_key IN (${chunk.map(() => "?").join(",")})`).all(...chunk) as Array<{
          public_key: string;
          status: string;
        }>;
        for (const r of rows) status.set(r.public_key, r.status);
      }
      for (const key of keys) {
        const s = status.get(key);
        if (s === undefined) this.cut(key, "removed");
        else if (s === "blocked") this.cut(key, "blocked");
      }
    } catch (err) {
      this.onError(err);
    }
  }

  /** Every connected peer, checked in the store (after the bus missed messages). */
  private async recheck(): Promise<void> {
    try {
      for (const key of this.connected()) {
        const peer = await this.domain.ctx.store.read((r) => r.peers.get(key));
        if (!peer) this.cut(key, "removed");
        else if (peer.status === "blocked") this.cut(key, "blocked");
      }
    } catch (err) {
      this.onError(err);
    }
  }

  stop(): void {
    this.unsubscribe();
    if (this.poller) clearInterval(this.poller);
    this.sqlite?.close();
    this.sqlite = undefined;
  }
}
