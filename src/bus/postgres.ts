import pg from "pg";
import { type BusMessage, checkSize, type EventBus, newInstanceId, type Subscriber, Subscriptions } from "./bus.ts";

/** The one PostgreSQL channel every Perch node listens on; topics are dispatched in each node. */
export const CHANNEL = "perch_events";
/** Publishes waiting for the connection beyond this many are dropped (oldest first) and counted. */
const MAX_QUEUED = 10_000;
/** Envelopes sent per statement (one `NOTIFY`, or one row and a `NOTIFY` of its id). */
const BATCH = 500;
/** A `NOTIFY` payload stays under PostgreSQL's 8,000 bytes; a larger batch goes through `bus_messages`. */
export const MAX_PAYLOAD_BYTES = 7_900;
/** Telemetry and presence wait at most this long to travel with others (fleet.md §5: batched per node, ≤ 250 ms). */
export const BATCH_WINDOW_MS = 50;
const BACKOFF_MIN_MS = 100;
const BACKOFF_MAX_MS = 5_000;
/** A listening connection that answers no `select 1` within this long is dropped and made again. */
const PING_INTERVAL_MS = 30_000;

export interface PgEventBusOptions {
  url: string;
  /** Whether this process receives other nodes' messages (a command-line process only publishes). */
  listen?: boolean;
  log?: { warn(obj: object, msg: string): void; info?(obj: object, msg: string): void };
  /** The connection's `application_name` (what `pg_stat_activity` shows); default `perch events`. */
  applicationName?: string;
}

/** One message: publisher instance, a sequence, topic, message. */
interface Envelope {
  i: string;
  s: number;
  t: string;
  m: BusMessage;
}

/**
 * What one `NOTIFY` carries (fleet.md §5): a JSON array of envelopes, or `{"r": id}` naming the
 * `bus_messages` row that holds a batch too large for a payload.
 */
type Payload = Envelope[] | { r: number };

/** Whether a message may wait for the batch window: a device's telemetry and presence (`runtime`), the bulk of the bus. */
function batchable(message: BusMessage): boolean {
  return message.kind === "telemetry" || message.kind === "runtime";
}

/**
 * The bus across nodes sharing one PostgreSQL database: one connection per node, which `LISTEN`s
 * on one channel and also sends this node's messages (`pg_notify`, batched per tick). Every node
 * receives every message and hands it to its own subscribers of the topic; its own messages were
 * already delivered locally by `publish` and are skipped when they come back.
 *
 * When the connection drops (a PostgreSQL restart, `pg_terminate_backend`, a network error) the
 * node keeps running: publishes queue (up to 10,000), a new connection is made with back-off
 * (100 ms doubling to 5 s, with jitter), `LISTEN` is issued again, the queue is sent, and
 * subscribers are told through `gap()` that messages from other nodes may have been missed.
 */
export class PgEventBus implements EventBus {
  readonly instance = newInstanceId();
  private readonly subs: Subscriptions;
  private readonly o: PgEventBusOptions;
  private client: pg.Client | undefined;
  private connecting: Promise<void> | undefined;
  private queue: string[] = [];
  /** When the queue holds only batchable messages: the window's timer. */
  private windowTimer: NodeJS.Timeout | undefined;
  /** Received payloads are handed out in order, a row read from the table included. */
  private receiving: Promise<void> = Promise.resolve();
  /** The connection's queries, one at a time (a batch read from the table waits for a flush, and the other way round). */
  private querying: Promise<unknown> = Promise.resolve();
  private sequence = 0;
  private flushing: Promise<void> | undefined;
  private flushScheduled = false;
  private closed = false;
  private backoff = BACKOFF_MIN_MS;
  private retry: NodeJS.Timeout | undefined;
  private ping: NodeJS.Timeout | undefined;
  /** Whether the node has listened before (a later connection means a gap). */
  private listenedOnce = false;
  /** Counters for operators and the benchmark. */
  readonly stats = { dropped: 0, reconnects: 0, received: 0, sent: 0, notifies: 0, payloadBytes: 0, spilled: 0 };

  constructor(o: PgEventBusOptions) {
    this.o = o;
    this.subs = new Subscriptions((err) => this.warn({ err }, "an event subscriber failed"));
  }

  /** Connects (and listens) once; later drops are repaired in the background. Rejects when the first connection fails. */
  async start(): Promise<void> {
    await this.connect();
  }

  publish(topic: string, message: BusMessage): void {
    const text = JSON.stringify(message);
    checkSize(text);
    if (this.closed) return;
    this.subs.deliver(topic, message);
    this.queue.push(`{"i":${JSON.stringify(this.instance)},"s":${this.sequence++},"t":${JSON.stringify(topic)},"m":${text}}`);
    if (this.queue.length > MAX_QUEUED) {
      this.stats.dropped += this.queue.length - MAX_QUEUED;
      this.queue.splice(0, this.queue.length - MAX_QUEUED);
    }
    // Telemetry and presence wait for the window (others arriving meanwhile travel in the same
    // NOTIFY); anything else goes at the next tick, taking what waits with it.
    if (batchable(message) && this.queue.length < BATCH) {
      if (!this.windowTimer && !this.flushScheduled) {
        this.windowTimer = setTimeout(() => {
          this.windowTimer = undefined;
          this.scheduleFlush();
        }, BATCH_WINDOW_MS);
        this.windowTimer.unref();
      }
      return;
    }
    this.scheduleFlush();
  }

  subscribe(topic: string, handler: Subscriber): () => void {
    return this.subs.add(topic, handler);
  }

  /** Any other node of the database may listen. */
  listened(_topic: string): boolean {
    return !this.closed;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    // Send what is queued while the connection is up, then stop.
    if (this.client && (this.queue.length > 0 || this.flushing)) await this.flush().catch(() => {});
    this.closed = true;
    clearTimeout(this.windowTimer);
    clearTimeout(this.retry);
    clearInterval(this.ping);
    const client = this.client;
    this.client = undefined;
    await client?.end().catch(() => {});
  }

  private warn(obj: object, msg: string): void {
    this.o.log?.warn(obj, msg);
  }

  private connect(): Promise<void> {
    this.connecting ??= this.open().finally(() => (this.connecting = undefined));
    return this.connecting;
  }

  private async open(): Promise<void> {
    const client = new pg.Client({
      connectionString: this.o.url,
      keepAlive: true,
      connectionTimeoutMillis: 10_000,
      application_name: this.o.applicationName ?? "perch events",
    });
    // Without a listener an 'error' event (the backend terminated) would crash the process.
    client.on("error", (err) => this.lost(client, err));
    client.on("end", () => this.lost(client, undefined));
    client.on("notification", (n) => this.received(n.channel, n.payload));
    try {
      await client.connect();
      if (this.o.listen !== false) await client.query(`LISTEN ${CHANNEL}`);
    } catch (err) {
      client.removeAllListeners("end");
      await client.end().catch(() => {});
      throw err;
    }
    if (this.closed) {
      await client.end().catch(() => {});
      return;
    }
    this.client = client;
    this.backoff = BACKOFF_MIN_MS;
    clearInterval(this.ping);
    this.ping = setInterval(() => this.checkAlive(client), PING_INTERVAL_MS);
    this.ping.unref();
    if (this.o.listen !== false) {
      if (this.listenedOnce) this.subs.gap();
      this.listenedOnce = true;
    }
    this.scheduleFlush();
  }

  private checkAlive(client: pg.Client): void {
    if (this.client !== client) return;
    const timer = setTimeout(() => client.end().catch(() => {}), 10_000);
    client
      .query("select 1")
      .catch(() => client.end().catch(() => {}))
      .finally(() => clearTimeout(timer));
  }

  /** The connection is gone: forget it and make another after the back-off. */
  private lost(client: pg.Client, err: Error | undefined): void {
    if (this.client !== client) return;
    this.client = undefined;
    clearInterval(this.ping);
    client.end().catch(() => {});
    if (this.closed) return;
    this.warn({ err: err?.message }, "event bus connection lost; reconnecting");
    this.scheduleReconnect();
  }

  private scheduleReconnect(): void {
    if (this.closed || this.retry) return;
    const delay = this.backoff * (0.5 + Math.random() / 2);
    this.backoff = Math.min(BACKOFF_MAX_MS, this.backoff * 2);
    this.retry = setTimeout(() => {
      this.retry = undefined;
      this.connect().then(
        () => {
          this.stats.reconnects++;
          this.o.log?.info?.({}, "event bus listening again");
        },
        (err: unknown) => {
          this.warn({ err: (err as Error)?.message }, "event bus reconnect failed");
          this.scheduleReconnect();
        },
      );
    }, delay);
    this.retry.unref();
  }

  private received(channel: string, payload: string | undefined): void {
    if (channel !== CHANNEL || payload === undefined) return;
    let p: Payload;
    try {
      p = JSON.parse(payload) as Payload;
    } catch {
      return;
    }
    if (Array.isArray(p)) {
      // In order after a batch still being read from the table.
      this.receiving = this.receiving.then(() => this.deliver(p as Envelope[]));
      return;
    }
    if (typeof p !== "object" || p === null || typeof p.r !== "number") return;
    const id = p.r;
    const client = this.client;
    const read = client
      ? this.query<{ message: string }>(client, "select message from bus_messages where id = $1", [id])
          .then((r) => r.rows[0]?.message)
          .catch((err: unknown) => {
            this.warn({ err: (err as Error)?.message }, "a bus batch could not be read from its table");
            return undefined;
          })
      : undefined;
    this.receiving = this.receiving.then(async () => {
      const text = await read;
      if (text === undefined) return;
      try {
        const batch = JSON.parse(text) as unknown;
        if (Array.isArray(batch)) this.deliver(batch as Envelope[]);
      } catch {}
    });
  }

  /** One query on `client`, after those already asked of it. */
  private query<R extends pg.QueryResultRow = pg.QueryResultRow>(client: pg.Client, text: string, values: unknown[]): Promise<pg.QueryResult<R>> {
    const run = this.querying.then(() => client.query<R>(text, values));
    this.querying = run.catch(() => {});
    return run;
  }

  private deliver(batch: Envelope[]): void {
    for (const e of batch) {
      if (typeof e !== "object" || e === null || e.i === this.instance || typeof e.t !== "string" || typeof e.m !== "object" || e.m === null) continue;
      this.stats.received++;
      if (this.subs.has(e.t)) this.subs.deliver(e.t, e.m);
    }
  }

  private scheduleFlush(): void {
    if (this.flushScheduled || this.flushing || !this.client) return;
    clearTimeout(this.windowTimer);
    this.windowTimer = undefined;
    this.flushScheduled = true;
    setImmediate(() => {
      this.flushScheduled = false;
      this.flush().catch((err: unknown) => this.warn({ err: (err as Error)?.message }, "event bus publish failed"));
    });
  }

  /**
   * Sends the queue, up to 500 envelopes a statement, each statement (its own transaction) with one
   * `NOTIFY` (fleet.md §5): the batch as a JSON array when it fits in a payload, else written to
   * `bus_messages` and its id notified, in the same statement. A failed batch goes back to the
   * queue for the next connection.
   */
  private flush(): Promise<void> {
    if (this.flushing) return this.flushing;
    const run = async () => {
      while (this.queue.length > 0 && this.client) {
        const client = this.client;
        const batch = this.queue.splice(0, BATCH);
        const text = `[${batch.join(",")}]`;
        const bytes = Buffer.byteLength(text);
        try {
          if (bytes <= MAX_PAYLOAD_BYTES) {
            await this.query(client, "select pg_notify($1, $2)", [CHANNEL, text]);
          } else {
            await this.query(
              client,
              `with m as (insert into bus_messages (origin, topic, message, created_at) values ($2, '*', $3, $4) returning id)
               select pg_notify($1, '{"r":' || id || '}') from m`,
              [CHANNEL, this.instance, text, Date.now()],
            );
            this.stats.spilled++;
          }
          this.stats.sent += batch.length;
          this.stats.notifies++;
          this.stats.payloadBytes += bytes;
        } catch (err) {
          this.queue.unshift(...batch);
          throw err;
        }
      }
    };
    const flushing = run().finally(() => {
      if (this.flushing === flushing) this.flushing = undefined;
    });
    // What was published while the last statement ran goes next.
    void flushing.then(
      () => this.queue.length > 0 && this.scheduleFlush(),
      () => {},
    );
    this.flushing = flushing;
    return flushing;
  }
}
