/**
 * A device that stays connected (fleet.md §4): a layer above `PerchConnection.connect` that
 * connects again to the same base URL (the balancer) after the server's `node.reconnect` event (at
 * once, or after its `retry_after_ms`), a refused offer (503, after its `Retry-After`) or a lost
 * connection, with back-off 0.5 s doubling to 10 s and ±20 % jitter, telling each attempt.
 * It knows the connection only through `connect`'s result: its event stream and `closed()`.
 */
import type { PeerEvent } from "../protocol/gen/event_pb.ts";
import { type ConnectOptions, OfferError, PerchConnection } from "./webrtc.ts";

/** What the layer needs of a connection: its event stream, its end, and a way to end it. */
export interface Reconnectable {
  readonly eventStream: { on(cb: (e: PeerEvent) => void): () => unknown };
  closed(): Promise<void>;
  close(): void;
  /** `all.ping` (the liveness probe). */
  ping?(): Promise<unknown>;
}

export const RECONNECT_LABEL = "node.reconnect";
const BACKOFF_MIN_MS = 500;
const BACKOFF_MAX_MS = 10_000;
const JITTER = 0.2;
/**
 * A Retry-After is waited out up to this (seconds): a balancer's 10^9 would overflow the timer,
 * which Node then fires after 1 ms (a reconnect storm).
 */
const MAX_RETRY_AFTER_S = 3_600;

/** What the device tells of its connection's life (each attempt, each outcome). */
export type ReconnectLog =
  | { event: "attempt"; attempt: number; delay_ms: number; after: ReconnectCause }
  | { event: "connected"; attempt: number; after: ReconnectCause; ms: number }
  | { event: "refused"; attempt: number; status: number; code: string; retry_after_s?: number }
  | { event: "failed"; attempt: number; error: string }
  | { event: "reconnect"; reason: string; retry_after_ms: number }
  | { event: "lost" }
  | { event: "gave up"; status: number; code: string };

/** Why the device is connecting: its first connection, the server's hand-over, a refused offer or a lost connection. */
export type ReconnectCause = "start" | "node.reconnect" | "refused" | "lost" | "error";

export interface StayConnectedOptions<C extends Reconnectable = PerchConnection> extends ConnectOptions {
  /** Set up each new connection (its microphone, its tools…); a throw closes it and counts as a lost connection. */
  onConnected?: (conn: C) => void | Promise<void>;
  /** Each attempt and outcome, for the device's log. */
  log?: (entry: ReconnectLog) => void;
  /** The connection itself (default `PerchConnection.connect`). */
  connect?: (o: ConnectOptions) => Promise<C>;
  /** Default `Math.random`: the jitter's source. */
  random?: () => number;
  /**
   * How often the connection is asked `all.ping` (default 10 s; 0: never): one unanswered within
   * half that (at least 3 s) counts as lost. A node killed outright (SIGKILL, a dead machine) sends
   * no close; without this the device would wait for its WebRTC stack to give up (30 s, or never).
   */
  livenessMs?: number;
}

/** A refused offer that trying again cannot fix (bad key, blocked, not registered…): the device stops. */
function fatal(err: unknown): err is OfferError {
  return err instanceof OfferError && err.status >= 400 && err.status < 500 && ![408, 409, 429].includes(err.status);
}

/** `ms` ± 20 %. */
function jittered(ms: number, random: () => number): number {
  return Math.round(ms * (1 - JITTER + 2 * JITTER * random()));
}

/** A wait the server asked for (Retry-After, `retry_after_ms`) is a floor: its jitter only adds, up to 20 %. */
function jitteredAfter(ms: number, random: () => number): number {
  return Math.round(ms * (1 + JITTER * random()));
}

/** Whether the event-stream bytes `e` carry `node.reconnect`, and its body. */
function reconnectEvent(e: PeerEvent): { reason: string; retry_after_ms: number } | undefined {
  if (e.payload.case !== "textDone") return undefined;
  const v = e.payload.value as { label: string; text: string };
  if (v.label !== RECONNECT_LABEL) return undefined;
  try {
    const body = JSON.parse(v.text) as { reason?: unknown; retry_after_ms?: unknown };
    const after = typeof body.retry_after_ms === "number" && body.retry_after_ms >= 0 ? Math.min(body.retry_after_ms, BACKOFF_MAX_MS) : 0;
    return { reason: typeof body.reason === "string" ? body.reason : "unknown", retry_after_ms: after };
  } catch {
    return { reason: "unknown", retry_after_ms: 0 };
  }
}

/**
 * Keeps a device connected until `close()`. `current` is the connection now (undefined between
 * two); `connected()` resolves with the current one or the next.
 */
export class StayConnected<C extends Reconnectable = PerchConnection> {
  current: C | undefined;
  private readonly o: StayConnectedOptions<C>;
  private readonly random: () => number;
  private closed = false;
  private backoff = BACKOFF_MIN_MS;
  private attempt = 0;
  private waiters: Array<{ resolve: (c: C) => void; reject: (err: unknown) => void }> = [];
  /** Set when the device gave up (a refusal that trying again cannot fix). */
  error: OfferError | undefined;
  private timer: NodeJS.Timeout | undefined;
  private wake: (() => void) | undefined;
  private readonly done: Promise<void>;
  /** Connections made so far (the first included). */
  connections = 0;

  constructor(o: StayConnectedOptions<C>) {
    this.o = o;
    this.random = o.random ?? Math.random;
    this.done = this.run();
  }

  /** The current connection, or the next one made. */
  connected(): Promise<C> {
    if (this.current) return Promise.resolve(this.current);
    if (this.error) return Promise.reject(this.error);
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  /** Whether the device stopped (`close()`, or gave up). */
  get stopped(): boolean {
    return this.closed;
  }

  /** Resolves once the device stopped: `close()`, or a refusal that trying again cannot fix (`error`). */
  finished(): Promise<void> {
    return this.done;
  }

  /** Stops: the current connection is closed and no other is made. */
  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.timer);
    this.wake?.();
    this.current?.close();
    await this.done;
  }

  private log(entry: ReconnectLog): void {
    try {
      this.o.log?.(entry);
    } catch {
      // A failing logger must not stop the device.
    }
  }

  private sleep(ms: number): Promise<void> {
    if (ms <= 0 || this.closed) return Promise.resolve();
    return new Promise((resolve) => {
      this.wake = resolve;
      this.timer = setTimeout(resolve, ms);
    });
  }

  /** The next back-off delay (jittered), doubling up to the bound. */
  private nextBackoff(): number {
    const ms = jittered(this.backoff, this.random);
    this.backoff = Math.min(BACKOFF_MAX_MS, this.backoff * 2);
    return ms;
  }

  /** Asks the connection `all.ping` every `livenessMs`; no answer in time closes it (a lost connection). */
  private watch(conn: C): () => void {
    const every = this.o.livenessMs ?? 10_000;
    if (every <= 0 || !conn.ping) return () => {};
    const within = Math.max(3_000, every / 2);
    let probing = false;
    const timer = setInterval(() => {
      if (probing) return;
      probing = true;
      let late: NodeJS.Timeout | undefined;
      const timeout = new Promise<never>((_, reject) => {
        late = setTimeout(() => reject(new Error(`no answer to all.ping within ${within} ms`)), within);
      });
      Promise.race([conn.ping!(), timeout])
        .catch((err: unknown) => {
          this.log({ event: "failed", attempt: 0, error: (err as Error)?.message ?? String(err) });
          conn.close();
        })
        .finally(() => {
          clearTimeout(late);
          probing = false;
        });
    }, every);
    timer.unref();
    return () => clearInterval(timer);
  }

  private async run(): Promise<void> {
    let cause: ReconnectCause = "start";
    let delay = 0;
    let since = performance.now();
    while (!this.closed) {
      await this.sleep(delay);
      if (this.closed) return;
      this.attempt++;
      this.log({ event: "attempt", attempt: this.attempt, delay_ms: delay, after: cause });
      let conn: C;
      try {
        conn = await (this.o.connect ?? (PerchConnection.connect as unknown as (o: ConnectOptions) => Promise<C>))(this.o);
      } catch (err) {
        if (this.closed) return;
        if (fatal(err)) {
          this.log({ event: "gave up", status: err.status, code: err.code });
          this.closed = true;
          this.error = err;
          for (const w of this.waiters.splice(0)) w.reject(err);
          return;
        }
        if (err instanceof OfferError) {
          const retryAfter = Number(err.headers.get("retry-after"));
          const after = Number.isFinite(retryAfter) && retryAfter > 0 ? Math.min(retryAfter, MAX_RETRY_AFTER_S) : undefined;
          this.log({ event: "refused", attempt: this.attempt, status: err.status, code: err.code, ...(after ? { retry_after_s: after } : {}) });
          // After Retry-After, never sooner; the back-off still grows for a balancer with no room anywhere.
          delay = Math.max(after ? jitteredAfter(after * 1000, this.random) : 0, this.nextBackoff());
          cause = "refused";
        } else {
          this.log({ event: "failed", attempt: this.attempt, error: (err as Error)?.message ?? String(err) });
          delay = this.nextBackoff();
          cause = "error";
        }
        continue;
      }
      if (this.closed) {
        conn.close();
        return;
      }
      // Told to go elsewhere: closed here, and the next connection made after what the server asked.
      let handedOver: { reason: string; retry_after_ms: number } | undefined;
      const off = conn.eventStream.on((e) => {
        const r = reconnectEvent(e);
        if (!r || handedOver) return;
        handedOver = r;
        this.log({ event: "reconnect", reason: r.reason, retry_after_ms: r.retry_after_ms });
        conn.close();
      });
      try {
        await this.o.onConnected?.(conn);
      } catch (err) {
        this.log({ event: "failed", attempt: this.attempt, error: `setting the connection up failed: ${(err as Error)?.message ?? err}` });
        conn.close();
      }
      this.connections++;
      this.log({ event: "connected", attempt: this.attempt, after: cause, ms: Math.round(performance.now() - since) });
      this.backoff = BACKOFF_MIN_MS;
      this.attempt = 0;
      this.current = conn;
      for (const w of this.waiters.splice(0)) w.resolve(conn);
      const stopLiveness = this.watch(conn);
      await conn.closed();
      stopLiveness();
      off();
      this.current = undefined;
      if (this.closed) return;
      since = performance.now();
      if (handedOver) {
        cause = "node.reconnect";
        delay = handedOver.retry_after_ms > 0 ? jitteredAfter(handedOver.retry_after_ms, this.random) : 0;
      } else {
        this.log({ event: "lost" });
        cause = "lost";
        delay = this.nextBackoff();
      }
    }
  }
}
