import { randomBytes } from "node:crypto";

/**
 * The event bus: small JSON messages on named topics, delivered to every subscriber of the topic
 * on every node that shares the bus.
 *
 * - `publish(topic, message)` never throws for a delivery problem and never waits: this process's
 *   subscribers get the message at once (synchronously, in publish order); other nodes get it
 *   through PostgreSQL `NOTIFY` when the bus is `PgEventBus`, usually within milliseconds.
 * - Messages carry ids and versions, not documents: a message's JSON must stay within
 *   `MAX_MESSAGE_BYTES` (publish throws a RangeError beyond it, on every implementation alike);
 *   a subscriber reads anything larger from the store.
 * - Delivery is at most once. While a node's listening connection is down (PostgreSQL restarting,
 *   the backend terminated) it receives nothing from other nodes; once it is listening again every
 *   subscriber's `gap()` is called, so that it re-reads from the store whatever state it mirrors.
 *   Messages published meanwhile are not replayed (telemetry samples of that time arrive on no
 *   stream; status and runtime are re-read). Its own publishes are queued (bounded) and sent then.
 *
 * Topics in use (see `topics` below): a device's changes, a session's end, a peer blocked, removed
 * or given a voice agent, and commands addressed to one node (`commands.ts`).
 */
export interface EventBus {
  publish(topic: string, message: BusMessage): void;
  /** Calls `handler.message` for every message on `topic` (from any node) until the returned function is called. */
  subscribe(topic: string, handler: Subscriber): () => void;
  /**
   * Whether a message on `topic` published now could reach a subscriber (here or on another node):
   * when false, a publisher may skip building one that nobody would receive.
   */
  listened(topic: string): boolean;
  /** Sends what is queued (PostgreSQL), then stops listening. Publishing after close is ignored. */
  close(): Promise<void>;
  /** A random id of this bus instance (this process's node), distinct from every other's. */
  readonly instance: string;
}

export type BusMessage = Record<string, unknown>;

export interface Subscriber {
  message(message: BusMessage): void;
  /** Messages may have been missed (the node stopped listening for a while and listens again). */
  gap?(): void;
}

/** Within PostgreSQL's 8,000-byte `NOTIFY` payload, with room for the envelope. */
export const MAX_MESSAGE_BYTES = 7_000;

/** The topics of the messages Perch publishes. */
export const topics = {
  /** `status`, `runtime`, `telemetry`, `contacts` of one device (its public key). */
  device: (publicKey: string) => `device:${publicKey}`,
  /** A session revoked or deleted (`{kind: "revoked"}`). */
  session: (sessionId: string) => `session:${sessionId}`,
  /** A peer blocked, unblocked or removed, or its voice agent set (`PeerMessage` in src/domain/changes.ts), for every node. */
  peers: "peers",
  /** Commands for the node named so (`commands.ts`). */
  node: (nodeName: string) => `node:${nodeName}`,
  /** Replies to the commands one bus instance sent. */
  replies: (instance: string) => `replies:${instance}`,
} as const;

export function newInstanceId(): string {
  return randomBytes(9).toString("base64url");
}

export function checkSize(text: string): void {
  if (Buffer.byteLength(text) > MAX_MESSAGE_BYTES) throw new RangeError(`a bus message is at most ${MAX_MESSAGE_BYTES} bytes of JSON`);
}

/** Subscribers by topic, with guarded delivery: a throwing handler never reaches the publisher. */
export class Subscriptions {
  private readonly byTopic = new Map<string, Set<Subscriber>>();
  private readonly onError: (err: unknown) => void;

  constructor(onError: (err: unknown) => void) {
    this.onError = onError;
  }

  add(topic: string, handler: Subscriber): () => void {
    const set = this.byTopic.get(topic) ?? new Set<Subscriber>();
    this.byTopic.set(topic, set);
    set.add(handler);
    return () => {
      const current = this.byTopic.get(topic);
      if (!current?.delete(handler)) return;
      if (current.size === 0) this.byTopic.delete(topic);
    };
  }

  has(topic: string): boolean {
    return this.byTopic.has(topic);
  }

  deliver(topic: string, message: BusMessage): void {
    const set = this.byTopic.get(topic);
    if (!set) return;
    for (const s of [...set]) {
      try {
        s.message(message);
      } catch (err) {
        this.onError(err);
      }
    }
  }

  gap(): void {
    for (const set of [...this.byTopic.values()]) {
      for (const s of [...set]) {
        try {
          s.gap?.();
        } catch (err) {
          this.onError(err);
        }
      }
    }
  }
}

/** One node (SQLite, or tests): subscribers of this process only. */
export class InProcessBus implements EventBus {
  readonly instance = newInstanceId();
  protected readonly subs: Subscriptions;
  private closed = false;

  constructor(onError: (err: unknown) => void = () => {}) {
    this.subs = new Subscriptions(onError);
  }

  publish(topic: string, message: BusMessage): void {
    checkSize(JSON.stringify(message));
    if (!this.closed) this.subs.deliver(topic, message);
  }

  subscribe(topic: string, handler: Subscriber): () => void {
    return this.subs.add(topic, handler);
  }

  listened(topic: string): boolean {
    return !this.closed && this.subs.has(topic);
  }

  async close(): Promise<void> {
    this.closed = true;
  }
}
