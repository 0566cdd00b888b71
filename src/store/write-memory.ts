/** Peers remembered at most (by series and by documents); beyond, everything is forgotten and refilled. */
const MAX_PEERS = 100_000;

/**
 * What the telemetry writes of this process remember between transactions on SQLite, so that a
 * batch need not read them again: the ids of telemetry series (whose existence also proves that
 * their peer is still registered, as a peer's removal takes its series with it) and the peers'
 * status documents. It holds only while this process is the database's only writer of them:
 *
 * - another connection's commit (another process sharing the file) changes SQLite's
 *   `data_version`, and everything is forgotten before it is used again;
 * - in this process, a peer's removal forgets everything, and a status document written by
 *   anything but the telemetry writer forgets that document;
 * - what a transaction learnt is kept only after it committed, and only if nothing was forgotten
 *   since it started (another unit of the same group commit may have removed the peer).
 *
 * PostgreSQL has no such memory: several nodes write the same rows, and it reads them each batch.
 */
export class WriteMemory {
  private generation = 0;
  private version: number;
  private readonly seriesIds = new Map<string, Map<string, number>>();
  private readonly documents = new Map<string, Readonly<Record<string, unknown>>>();
  private readonly dataVersion: () => number;

  constructor(dataVersion: () => number) {
    this.dataVersion = dataVersion;
    this.version = dataVersion();
  }

  /** Called inside a write transaction (the write lock held) before reading what is remembered: the ticket for `keep`. */
  open(): number {
    this.sync();
    return this.generation;
  }

  seriesId(publicKey: string, field: string): number | undefined {
    return this.seriesIds.get(publicKey)?.get(field);
  }

  /** The document as last committed by this process; never modified by its users (they copy it). */
  document(publicKey: string): Readonly<Record<string, unknown>> | undefined {
    return this.documents.get(publicKey);
  }

  /** After the commit of the transaction that took `ticket`: what it read or wrote, unless something was forgotten since. */
  keep(
    ticket: number,
    series: ReadonlyArray<readonly [publicKey: string, field: string, id: number]>,
    documents: ReadonlyArray<readonly [publicKey: string, document: Readonly<Record<string, unknown>>]>,
  ): void {
    this.sync();
    if (ticket !== this.generation) return;
    if (this.seriesIds.size + this.documents.size + series.length + documents.length > 2 * MAX_PEERS) this.forget();
    for (const [publicKey, field, id] of series) {
      let fields = this.seriesIds.get(publicKey);
      if (!fields) {
        fields = new Map();
        this.seriesIds.set(publicKey, fields);
      }
      fields.set(field, id);
    }
    for (const [publicKey, document] of documents) this.documents.set(publicKey, document);
  }

  /** A peer removed (its series and status with it): everything. */
  forget(): void {
    this.generation++;
    this.seriesIds.clear();
    this.documents.clear();
  }

  /**
   * A document written by a transaction not yet committed: later units of the same group commit
   * read it from the database (their shared transaction sees it), not the one before it.
   */
  setAside(publicKey: string): void {
    this.documents.delete(publicKey);
  }

  /** A status document written by something else than the telemetry writer. */
  forgetDocument(publicKey: string): void {
    this.generation++;
    this.documents.delete(publicKey);
  }

  private sync(): void {
    const version = this.dataVersion();
    if (version === this.version) return;
    this.version = version;
    this.forget();
  }
}

/** A transaction's view of the memory: its ticket, and what it will keep once committed. */
export class WriteMemoryUnit {
  readonly memory: WriteMemory;
  private ticket: number | undefined;
  private readonly series: Array<readonly [string, string, number]> = [];
  private readonly documents: Array<readonly [string, Readonly<Record<string, unknown>>]> = [];

  constructor(memory: WriteMemory) {
    this.memory = memory;
  }

  /** Before the transaction's first use of the memory. */
  open(): void {
    this.ticket ??= this.memory.open();
  }

  keepSeries(publicKey: string, field: string, id: number): void {
    this.series.push([publicKey, field, id]);
  }

  keepDocument(publicKey: string, document: Readonly<Record<string, unknown>>): void {
    this.documents.push([publicKey, document]);
  }

  /** Once the transaction committed. Never throws: the commit's success stands whatever happens here. */
  committed(): void {
    if (this.ticket === undefined) return;
    try {
      this.memory.keep(this.ticket, this.series, this.documents);
    } catch {
      // The database could not be asked whether another process wrote (closed, gone): remember nothing.
      this.memory.forget();
    }
  }
}
