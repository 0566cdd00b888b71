import pg from "pg";
import { type BusMessage, checkSize, type EventBus, newInstanceId, type Subscriber, Subscriptions } from "./bus.ts";

/** The one PostgreSQL channel every Perch node listens on; topics are dispatched in each node. */
export const CHANNEL = "perch_events";
/** Publishes waiting for the connection beyond this many are dropped (oldest first) and counted. */
const MAX_QUEUED = 10_000;
/** Publishes sent per statement. */
const BATCH = 500;
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

/** What goes through `NOTIFY`: publisher instance, a sequence (identical payloads in one statement are not merged), topic, message. */
interface Envelope {
  i: string;
  s: number;
  t: string;
  m: BusMessage;
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
  readonly stats = { dropped: 0, reconnects: 0, received: 0, sent: 0 };

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
    let e: Envelope;
    try {
      e = JSON.parse(payload) as Envelope;
    } catch {
      return;
    }
    if (typeof e !== "object" || e === null || e.i === this.instance || typeof e.t !== "string" || typeof e.m !== "object" || e.m === null) return;
    this.stats.received++;
    if (this.subs.has(e.t)) this.subs.deliver(e.t, e.m);
  }

  private scheduleFlush(): void {
    if (this.flushScheduled || this.flushing || !this.client) return;
    this.flushScheduled = true;
    setImmediate(() => {
      this.flushScheduled = false;
      this.flush().catch((err: unknown) => this.warn({ err: (err as Error)?.message }, "event bus publish failed"));
    });
  }

  /** Sends the queue in statements of up to 500 notifications; a failed batch goes back to the queue for the next connection. */
  private flush(): Promise<void> {
    if (this.flushing) return this.flushing;
    const run = async () => {
      while (this.queue.length > 0 && this.client) {
        const client = this.client;
        const batch = this.queue.splice(0, BATCH);
        try {
          await client.query("select pg_notify($1, p) from unnest($2::text[]) with ordinality as u(p, n) order by n", [CHANNEL, batch]);
          this.stats.sent += batch.length;
        } catch (err) {
          this.queue.unshift(...batch);
          throw err;
        }
      }
    };
    const flushing = run().finally(() => {
      if (this.flushing === flushing) this.flushing = undefined;
    });
    this.flushing = flushing;
    return flushing;
  }
}
