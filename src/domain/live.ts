import { randomUUID } from "node:crypto";
import { topics } from "../bus/index.ts";
import type { ConversationEntry, PeerStatus, Runtime, TelemetryField, UsageView } from "../protocol/public.ts";
import type { DeviceMessage, PeerMessage } from "./changes.ts";
import type { DomainContext } from "./context.ts";
import { DomainError } from "./errors.ts";
import { NodeDeadlines, type NodeWatcher } from "./node-deadlines.ts";
import type { PeerService } from "./peers.ts";
import type { SideControlPrincipal } from "./principal.ts";
import { StreamSlots } from "./stream-slots.ts";

/** Telemetry events of one device go out at most this often (values in between are batched). */
export const TELEMETRY_BATCH_MS = 250;
export const KEEP_ALIVE_MS = 15_000;
/** Conversation entries of one device being put together from their parts at once (a part lost on the bus leaves one behind). */
const MAX_PARTIAL_ENTRIES = 8;
/** How often a device's runtime is read again while streams watch it (a node that died stops refreshing it). */
const RUNTIME_RECHECK_MS = 15_000;

export type TelemetryValue = { field: TelemetryField; value: number; observed_at_unix_ms: number };

/** One event of `GET /side-control/events`. */
export type LiveEvent =
  | { event: "status"; data: PeerStatus }
  | { event: "runtime"; data: Runtime }
  | { event: "telemetry"; data: { values: TelemetryValue[] } }
  | { event: "contacts"; data: { name: string; change: "created" | "updated" | "deleted" } }
  | { event: "session"; data: { state: "revoked" | "expired" } }
  | { event: "conversation"; data: ConversationEntry }
  | { event: "memory"; data: { updated_at_unix_ms: number } }
  | { event: "usage"; data: UsageView };

/** Where a stream's events go (the HTTP response). Events handed out may be shared between streams: never mutate them. */
export interface LiveSink {
  event(e: LiveEvent): void;
  keepAlive(): void;
  /** The stream is over: end the response. Called once. */
  end(): void;
}

export interface LiveOptions {
  keepAliveMs?: number;
}

/**
 * The live half of Side Control: streams of a device's changes for its controllers. Each node
 * keeps one bus subscription per watched device (a `DeviceHub`) shared by the streams of that
 * device on this node, so a status or runtime read happens once per change, not once per stream.
 * Streams also end on their session's revocation (bus) or expiry (clock), on an operator blocking
 * or removing either peer, and when the node shuts down.
 */
export class LiveService {
  private readonly ctx: DomainContext;
  private readonly peers: PeerService;
  private readonly hubs = new Map<string, DeviceHub>();
  private readonly streams = new Set<LiveStream>();
  private readonly slots: StreamSlots;
  private readonly deadlines: NodeDeadlines;
  private closed = false;
  private readonly keepAliveMs: number;
  private ticker: NodeJS.Timeout | undefined;
  private unsubscribePeers: (() => void) | undefined;

  constructor(ctx: DomainContext, peers: PeerService, o: LiveOptions = {}) {
    this.ctx = ctx;
    this.peers = peers;
    this.keepAliveMs = o.keepAliveMs ?? KEEP_ALIVE_MS;
    this.slots = new StreamSlots(ctx);
    this.deadlines = new NodeDeadlines(ctx.clock, peers);
  }

  /** Open streams on this node (for metrics and tests). */
  get size(): number {
    return this.streams.size;
  }

  /**
   * Opens a stream for a Side Control session: the current status and runtime first, then changes.
   * 429 `RATE_LIMITED` when the session already has 4 open streams on the nodes sharing the store.
   */
  async open(principal: SideControlPrincipal, sink: LiveSink): Promise<{ close(): void }> {
    if (this.closed) throw new DomainError("unavailable", "UNAVAILABLE", "this node is shutting down", undefined, 1);
    this.start();
    const hub = this.hub(principal.targetKey);
    const stream = new LiveStream(principal, sink, () => this.forget(stream, hub));
    this.streams.add(stream);
    hub.add(stream);
    stream.unsubscribeSession = this.ctx.events.bus.subscribe(topics.session(principal.sessionId), {
      message: (m) => {
        if (m.kind === "revoked") stream.finish("revoked");
      },
    });
    try {
      // Subscribed first: a revocation committed after the slot's transaction (which sees the
      // session live) ends the stream.
      stream.slot = "taking";
      try {
        await this.slots.take(principal.sessionId, stream.id);
      } catch (err) {
        stream.slot = "none";
        throw err;
      }
      stream.slot = "held";
      // Ended meanwhile (revoked, shutdown): its `forget` ran before the slot was held.
      if (stream.ended) this.release(stream);
      // Subscribed before reading: a change committed meanwhile is queued and follows the snapshot.
      const [status, { runtime, offlineAt }] = await Promise.all([this.peers.status(principal.targetKey), this.peers.runtimeUntil(principal.targetKey)]);
      hub.follow(runtime, offlineAt);
      stream.begin(status, runtime);
    } catch (err) {
      stream.finish(undefined);
      throw err;
    }
    return { close: () => stream.finish(undefined) };
  }

  /**
   * Ends every stream (the node is shutting down); clients reconnect to a node that runs. Their
   * slots are not given back one by one: the node's rows all go when it leaves (`presence.leave`).
   */
  close(): void {
    this.closed = true;
    for (const s of [...this.streams]) s.finish(undefined);
    this.stop();
  }

  /** Upkeep of the slots (see `StreamSlots.sweep`); the server calls it with its other cleanups. */
  sweep(): Promise<void> {
    return this.slots.sweep();
  }

  private release(stream: LiveStream): void {
    if (stream.slot !== "held") return;
    stream.slot = "none";
    if (!this.closed) this.slots.release(stream.id);
  }

  private hub(key: string): DeviceHub {
    let hub = this.hubs.get(key);
    if (!hub) {
      hub = new DeviceHub(key, this.ctx, this.peers, this.deadlines);
      this.hubs.set(key, hub);
    }
    return hub;
  }

  private forget(stream: LiveStream, hub: DeviceHub): void {
    this.streams.delete(stream);
    stream.unsubscribeSession?.();
    this.release(stream);
    if (hub.remove(stream)) this.hubs.delete(hub.key);
    if (this.streams.size === 0) this.stop();
  }

  private start(): void {
    if (this.ticker) return;
    this.ticker = setInterval(() => this.tick(), Math.min(1_000, Math.max(50, Math.floor(this.keepAliveMs / 3))));
    this.ticker.unref();
    this.unsubscribePeers = this.ctx.events.bus.subscribe(topics.peers, {
      message: (m) => this.peerChanged(m as PeerMessage),
      // Messages were missed while the bus was down: sessions and peers are checked again.
      gap: () => {
        for (const s of this.streams) this.recheck(s);
      },
    });
  }

  private stop(): void {
    clearInterval(this.ticker);
    this.ticker = undefined;
    this.unsubscribePeers?.();
    this.unsubscribePeers = undefined;
  }

  private tick(): void {
    const now = this.ctx.clock.now();
    const wall = Date.now();
    for (const s of [...this.streams]) {
      if (now >= s.principal.expiresAt) s.finish("expired");
      else if (wall - s.lastWrite >= this.keepAliveMs) s.keepAlive();
    }
    for (const hub of this.hubs.values()) hub.tick(wall);
  }

  private peerChanged(m: PeerMessage): void {
    if (m.kind !== "blocked" && m.kind !== "removed") return;
    for (const s of [...this.streams]) {
      if (s.principal.targetKey !== m.key && s.principal.publicKey !== m.key) continue;
      // Access ended either way (a removed peer's sessions are deleted with it; a blocked one's are
      // refused, 403 `PEER_BLOCKED`, while it stays blocked): the contract's `session` event says
      // `revoked`, the one state that tells the client its pairing no longer works.
      s.finish("revoked");
    }
  }

  private recheck(s: LiveStream): void {
    const { sessionId, targetKey, publicKey } = s.principal;
    const now = this.ctx.clock.now();
    this.ctx.store
      .read(async (r) => {
        const live = await r.sessions.listLive(now, { kind: "side_control", targetKey });
        const [target, controller] = await Promise.all([r.peers.get(targetKey), r.peers.get(publicKey)]);
        return { live: live.some((x) => x.id === sessionId), blocked: target?.status !== "active" || controller?.status === "blocked" };
      })
      .then(
        ({ live, blocked }) => {
          if (!live || blocked) s.finish("revoked");
        },
        () => {},
      );
  }
}

/** One stream: its session's bounds and what it last sent. */
class LiveStream {
  readonly principal: SideControlPrincipal;
  /** Its slot's id in the store. */
  readonly id = randomUUID();
  /** Whether it holds a slot of its session (see `StreamSlots`). */
  slot: "none" | "taking" | "held" = "none";
  private readonly sink: LiveSink;
  private readonly onEnd: () => void;
  /** Events that came before the snapshot was sent. */
  private queue: LiveEvent[] | undefined = [];
  ended = false;
  /** When something was last written (wall clock, for keep-alives). */
  lastWrite = Date.now();
  private lastStatus: string | undefined;
  private lastRuntime: string | undefined;
  unsubscribeSession: (() => void) | undefined;

  constructor(principal: SideControlPrincipal, sink: LiveSink, onEnd: () => void) {
    this.principal = principal;
    this.sink = sink;
    this.onEnd = onEnd;
  }

  /** The snapshot, then what was queued while it was read. */
  begin(status: PeerStatus, runtime: Runtime): void {
    if (this.ended) return;
    const queued = this.queue ?? [];
    this.queue = undefined;
    this.status({ event: "status", data: status }, JSON.stringify(status));
    this.runtime({ event: "runtime", data: runtime });
    for (const e of queued) {
      if (e.event === "status") this.status(e, JSON.stringify(e.data));
      else if (e.event === "runtime") this.runtime(e);
      else this.send(e);
    }
  }

  /** Sent when the document (`text`, its JSON) differs from what this stream last sent; `e` may be shared by many streams. */
  status(e: Extract<LiveEvent, { event: "status" }>, text: string): void {
    if (this.queue) {
      this.queue.push(e);
      return;
    }
    if (text === this.lastStatus) return;
    this.lastStatus = text;
    this.write(e);
  }

  /** Sent when `online` or the node differ from what this stream last sent (never for byte counters). */
  runtime(e: Extract<LiveEvent, { event: "runtime" }>): void {
    if (this.queue) {
      this.queue.push(e);
      return;
    }
    const identity = `${e.data.online}:${e.data.node ?? ""}`;
    if (identity === this.lastRuntime) return;
    this.lastRuntime = identity;
    this.write(e);
  }

  send(e: LiveEvent): void {
    if (this.queue) this.queue.push(e);
    else this.write(e);
  }

  keepAlive(): void {
    if (this.ended || this.queue) return;
    this.lastWrite = Date.now();
    try {
      this.sink.keepAlive();
    } catch {
      this.finish(undefined);
    }
  }

  private write(e: LiveEvent): void {
    if (this.ended) return;
    this.lastWrite = Date.now();
    try {
      this.sink.event(e);
    } catch {
      this.finish(undefined);
    }
  }

  /** Ends the stream, after a `session` event when `state` is given. */
  finish(state: "revoked" | "expired" | undefined): void {
    if (this.ended) return;
    if (state) this.write({ event: "session", data: { state } });
    this.ended = true;
    this.queue = undefined;
    try {
      this.sink.end();
    } catch {
      // Ending twice or after the client left is harmless.
    }
    this.onEnd();
  }
}

/**
 * This node's subscription to one device's topic, shared by the streams watching the device. While
 * the device is online on a node, that node's heartbeat deadline is watched (`NodeDeadlines`): a
 * node that dies publishes nothing, and its devices' offline event follows the store's view.
 */
class DeviceHub implements NodeWatcher {
  readonly key: string;
  private readonly peers: PeerService;
  private readonly deadlines: NodeDeadlines;
  private readonly streams = new Set<LiveStream>();
  private readonly unsubscribe: () => void;
  private statusVersion = Number.NEGATIVE_INFINITY;
  private values: TelemetryValue[] = [];
  private flushTimer: NodeJS.Timeout | undefined;
  private lastFlush = 0;
  private reading: { status: boolean; runtime: boolean; again: { status: boolean; runtime: boolean } } = {
    status: false,
    runtime: false,
    again: { status: false, runtime: false },
  };
  private runtimeReadAt = 0;
  /** Conversation entries whose text came in parts, by conversation and place, until the last part. */
  private readonly partial = new Map<string, string[]>();

  constructor(key: string, ctx: DomainContext, peers: PeerService, deadlines: NodeDeadlines) {
    this.key = key;
    this.peers = peers;
    this.deadlines = deadlines;
    this.runtimeReadAt = Date.now();
    this.unsubscribe = ctx.events.bus.subscribe(topics.device(key), {
      message: (m) => this.message(m as unknown as DeviceMessage),
      gap: () => {
        this.read("status");
        this.read("runtime");
      },
    });
  }

  add(s: LiveStream): void {
    this.streams.add(s);
  }

  /** True when no stream is left (the hub is then closed). */
  remove(s: LiveStream): boolean {
    this.streams.delete(s);
    if (this.streams.size > 0) return false;
    this.unsubscribe();
    this.deadlines.unwatch(this);
    clearTimeout(this.flushTimer);
    return true;
  }

  nodeStale(): void {
    this.read("runtime");
  }

  /** What was read of the device's runtime: while online, its node's deadline is watched. */
  follow(runtime: Runtime, offlineAt: number | undefined): void {
    if (this.streams.size > 0) this.deadlines.watch(this, runtime.online ? runtime.node : undefined, offlineAt);
  }

  tick(now: number): void {
    if (now - this.runtimeReadAt >= RUNTIME_RECHECK_MS) this.read("runtime");
  }

  private message(m: DeviceMessage): void {
    switch (m.kind) {
      case "status":
        if (m.v < this.statusVersion) return;
        this.statusVersion = m.v;
        if (m.status) this.offerStatus(m.status);
        else this.read("status");
        return;
      case "runtime":
        this.read("runtime");
        return;
      case "telemetry":
        for (const [field, value, observedAt] of m.values) this.values.push({ field, value, observed_at_unix_ms: observedAt });
        this.scheduleFlush();
        return;
      case "contacts": {
        const e: LiveEvent = { event: "contacts", data: { name: m.name, change: m.change } };
        this.each((s) => s.send(e));
        return;
      }
      case "conversation":
        this.conversationPart(m);
        return;
      case "memory": {
        const e: LiveEvent = { event: "memory", data: { updated_at_unix_ms: m.at } };
        this.each((s) => s.send(e));
        return;
      }
      case "usage": {
        const e: LiveEvent = { event: "usage", data: m.usage };
        this.each((s) => s.send(e));
        return;
      }
    }
  }

  /** An entry goes out once all of its text came (one message usually; a publisher's messages arrive in order). */
  private conversationPart(m: Extract<DeviceMessage, { kind: "conversation" }>): void {
    let text = m.t;
    if (m.parts > 1) {
      const id = `${m.e.conversation_id}:${m.s}`;
      let parts = this.partial.get(id);
      if (!parts) {
        if (m.p !== 0) return;
        if (this.partial.size >= MAX_PARTIAL_ENTRIES) this.partial.delete(this.partial.keys().next().value!);
        parts = [];
        this.partial.set(id, parts);
      }
      if (m.p !== parts.length) {
        this.partial.delete(id);
        return;
      }
      parts.push(m.t);
      if (parts.length < m.parts) return;
      this.partial.delete(id);
      text = parts.join("");
    }
    const e: LiveEvent = { event: "conversation", data: { ...m.e, text } };
    this.each((s) => s.send(e));
  }

  /** One event object and one JSON text for every stream of the device. */
  private offerStatus(status: PeerStatus): void {
    const e = { event: "status" as const, data: status };
    const text = JSON.stringify(status);
    this.each((s) => s.status(e, text));
  }

  private each(fn: (s: LiveStream) => void): void {
    for (const s of [...this.streams]) fn(s);
  }

  /** Telemetry goes out at once when none went out in the last 250 ms, else when 250 ms have passed. */
  private scheduleFlush(): void {
    if (this.flushTimer) return;
    const wait = Math.max(0, this.lastFlush + TELEMETRY_BATCH_MS - Date.now());
    this.flushTimer = setTimeout(() => this.flush(), wait);
  }

  private flush(): void {
    this.flushTimer = undefined;
    this.lastFlush = Date.now();
    const values = this.values;
    this.values = [];
    if (values.length === 0) return;
    const e: LiveEvent = { event: "telemetry", data: { values } };
    this.each((s) => s.send(e));
  }

  /** Reads status or runtime from the store and offers it to every stream; one read at a time per kind. */
  private read(kind: "status" | "runtime"): void {
    if (this.reading[kind]) {
      this.reading.again[kind] = true;
      return;
    }
    this.reading[kind] = true;
    if (kind === "runtime") this.runtimeReadAt = Date.now();
    const done = () => {
      this.reading[kind] = false;
      if (this.reading.again[kind] && this.streams.size > 0) {
        this.reading.again[kind] = false;
        this.read(kind);
      }
    };
    const work =
      kind === "status"
        ? this.peers.status(this.key).then((status) => this.offerStatus(status))
        : this.peers.runtimeUntil(this.key).then(({ runtime, offlineAt }) => {
            this.follow(runtime, offlineAt);
            const e = { event: "runtime" as const, data: runtime };
            this.each((s) => s.runtime(e));
          });
    work.then(done, done);
  }
}
