import type { Logger } from "pino";
import type { Registry } from "prom-client";
import { DomainError, StoreUnavailable } from "../domain/errors.ts";
import type { Domain } from "../domain/index.ts";
import type { AcceptedOffer } from "../domain/signaling.ts";
import { TelemetryWriter } from "../domain/telemetry-writer.ts";
import type { ConnectionContext } from "../http/connection.ts";
import type { Metrics } from "../http/metrics.ts";
import type { DeviceToolSession } from "../mcp/device.ts";
import type { StreamSocket } from "../protocol/stream-socket.ts";
import type { VoiceHost } from "../voice/port.ts";
import { Answerer, InvalidOffer } from "./answerer.ts";
import { toneFrameCount, toneFrames } from "./audio.ts";
import { Connection, type ConnectionHost, type StreamService } from "./connection.ts";
import { type StreamApp, StreamHttpServer } from "./http-streams.ts";
import { Liveness, type LivenessOptions } from "./liveness.ts";
import { type TransportCensus, TransportMetrics } from "./metrics.ts";
import { PeerWatch } from "./peer-watch.ts";
import { PresenceUpkeep } from "./presence-upkeep.ts";
import { inspectOffer } from "./sdp.ts";
import { TelemetryIngest } from "./telemetry-ingest.ts";
import type { TransportTimings } from "./timings.ts";

export type { StreamApp } from "./http-streams.ts";

export interface TransportOptions {
  domain: Domain;
  logger: Logger;
  registry: Registry;
  /** The HTTP metrics requests on streams 1 and 2 are counted in, as over TCP. */
  httpMetrics: Metrics;
  /** Time to receive a whole request on an HTTP stream (408 after it), as over TCP. */
  requestTimeoutMs: number;
  udpPort: number;
  bindAddress: string | undefined;
  publicAddress: string | undefined;
  maxConnections: number;
  /** When a quiet device is asked whether it is there, and how long it has to answer. */
  liveness: LivenessOptions;
  /** The transport's timings (configuration `webrtc.*Ms`), checked by `checkTimings` at start. */
  timings: TransportTimings;
  /** Served on stream 1. */
  publicApi: StreamApp;
  /** Served on stream 2: the Compatible API, mounted at `/v1`. */
  compatibleApi: StreamApp;
  /** Voice conversations on each active connection's audio track. */
  voice?: VoiceHost | undefined;
}

const CAPACITY_RETRY_AFTER_S = 5;
/** How often a drain looks for connections that stopped talking. */
const DRAIN_SWEEP_MS = 50;

/** The WebRTC transport of one node: answers offers, holds connections, serves their streams. */
export class WebRtcTransport implements ConnectionHost {
  readonly domain: Domain;
  readonly logger: Logger;
  readonly metrics: TransportMetrics;
  readonly telemetry: TelemetryWriter;
  readonly ingest: TelemetryIngest;
  readonly voice: VoiceHost | undefined;
  readonly rpcRequestTimeoutMs: number;
  private readonly o: TransportOptions;
  private readonly answerer: Answerer;
  /** Every connection, pending or active. */
  private readonly all = new Set<Connection>();
  /** The active connection of each key. */
  private readonly byKey = new Map<string, Connection>();
  private readonly http: Record<1 | 2, StreamHttpServer>;
  private readonly liveness: Liveness;
  private readonly peerWatch: PeerWatch;
  private readonly presence: PresenceUpkeep;
  private closing: Promise<void> | undefined;
  private draining: Promise<void> | undefined;

  constructor(o: TransportOptions) {
    this.o = o;
    this.domain = o.domain;
    this.logger = o.logger;
    this.voice = o.voice;
    this.rpcRequestTimeoutMs = o.timings.rpcRequestTimeoutMs;
    this.metrics = new TransportMetrics(o.registry, () => this.census());
    this.telemetry = new TelemetryWriter({
      sink: o.domain.telemetry,
      bufferSamples: o.domain.ctx.config.telemetry.buffer_samples,
      intervalMs: o.domain.ctx.config.telemetry.write_interval_ms,
      onStored: (frames) => this.metrics.frame(frames),
      onDropped: (reason, frames) => this.metrics.dropped(reason, frames),
      onError: (err) =>
        err instanceof StoreUnavailable
          ? o.logger.warn({ err: err.message }, "telemetry waits for the store")
          : o.logger.error({ err }, "telemetry write failed"),
    });
    this.ingest = new TelemetryIngest({ writer: this.telemetry, metrics: this.metrics, clock: o.domain.ctx.clock, maxPeers: Math.max(1, o.maxConnections) });
    this.answerer = new Answerer({
      udpPort: o.udpPort,
      bindAddress: o.bindAddress,
      publicAddress: o.publicAddress,
      gatherTimeoutMs: o.timings.gatherTimeoutMs,
    });
    const streams = { requestTimeoutMs: o.requestTimeoutMs, logger: o.logger, metrics: o.httpMetrics };
    this.http = { 1: new StreamHttpServer(o.publicApi, streams), 2: new StreamHttpServer(o.compatibleApi, streams) };
    this.presence = new PresenceUpkeep({
      domain: o.domain,
      logger: o.logger,
      ownershipCheckMs: o.timings.ownershipCheckMs,
      runtimeRefreshMs: o.timings.runtimeRefreshMs,
      held: () => this.byKey.values(),
      replaced: (key) => {
        const c = this.byKey.get(key);
        if (c?.active) void c.close("replaced");
      },
    });
    this.liveness = new Liveness(
      o.liveness,
      () => this.byKey.values(),
      (err) => this.logger.error({ err }, "liveness check failed"),
    );
    this.peerWatch = new PeerWatch({
      domain: o.domain,
      connected: () => [...this.byKey.keys()],
      cut: (key, why) => {
        const c = this.byKey.get(key);
        if (!c) return;
        this.logger.info({ peer: key, why }, "closing the connection of a peer blocked or removed");
        // Not inside the bus's delivery (the publisher's call stack): on a turn of its own.
        setImmediate(() => void c.close(why));
      },
      onError: (err) => this.logger.warn({ err }, "watching for blocked and removed peers failed"),
    });
  }

  /** Binds the shared UDP port (an error naming it when it cannot be used); `close()` lets it go. */
  holdPort(): Promise<void> {
    return this.answerer.hold();
  }

  /** Connections held now. */
  get size(): number {
    return this.all.size;
  }

  /** Connections by state and streams by service and state, for the gauges. */
  private census(): TransportCensus {
    const connections = { pending: 0, activating: 0, active: 0 };
    const streams = new Map<string, { service: StreamService; state: "open" | "waiting"; count: number }>();
    for (const c of this.all) {
      const { state, open, waiting } = c.census();
      if (state !== "closed") connections[state]++;
      for (const [kind, counts] of [
        ["open", open],
        ["waiting", waiting],
      ] as const) {
        for (const [service, count] of Object.entries(counts) as Array<[StreamService, number]>) {
          const key = `${service}/${kind}`;
          const entry = streams.get(key) ?? { service, state: kind, count: 0 };
          entry.count += count;
          streams.set(key, entry);
        }
      }
    }
    return { connections, streams: [...streams.values()] };
  }

  /**
   * Checks 10–13 of the contract for an offer that passed 1–9, and answers it. `timing` receives
   * the phases for `Server-Timing`; `from` is the address the offer came from.
   */
  async answer(offer: AcceptedOffer, timing: (phase: string, ms: number) => void, from?: string): Promise<string> {
    const shape = inspectOffer(offer.sdp);
    if ("code" in shape) throw new DomainError("invalid", shape.code, shape.message);
    if (this.closing) throw new DomainError("unavailable", "UNAVAILABLE", "this node is shutting down", undefined, CAPACITY_RETRY_AFTER_S);
    if (this.draining) throw new DomainError("unavailable", "NODE_DRAINING", "this node is draining: connect again through the balancer", undefined, 1);
    if (this.all.size >= this.o.maxConnections) {
      throw new DomainError("unavailable", "CAPACITY_EXCEEDED", "this node holds as many connections as it may", undefined, CAPACITY_RETRY_AFTER_S);
    }
    const started = performance.now();
    let link: Awaited<ReturnType<Answerer["answer"]>>;
    try {
      link = await this.answerer.answer({ sdp: offer.sdp, ...shape, from });
    } catch (err) {
      // The WebRTC stack refusing the offer's SDP is the device's error; anything else is this node's.
      if (err instanceof InvalidOffer) throw new DomainError("invalid", "INVALID_SDP", err.message);
      this.logger.warn({ err, peer: offer.publicKey }, "answer failed");
      throw new DomainError("internal", "ANSWER_FAILED", "the server could not create an answer");
    }
    timing("answer", performance.now() - started);
    try {
      await this.domain.presence.answered(offer.publicKey);
    } catch (err) {
      link.close();
      throw err;
    }
    const connection = new Connection(this, offer.publicKey, link);
    this.all.add(connection);
    if (this.closing) void connection.close("shutdown");
    return link.answer;
  }

  serveHttp(service: 1 | 2, stream: StreamSocket, context: ConnectionContext): void {
    this.http[service].serve(stream, context);
  }

  /** Makes `c` its key's only connection (closing an older one first) and marks the peer online here. */
  async activated(c: Connection): Promise<void> {
    const older = this.byKey.get(c.publicKey);
    this.byKey.set(c.publicKey, c);
    if (older && older !== c) await older.close("replaced");
    // The selected pair can lag the event stream by a moment; the address is worth a short wait.
    for (let i = 0; i < 20 && !c.link.remoteAddress(); i++) await new Promise((r) => setTimeout(r, 25));
    await this.domain.presence.connected(c.publicKey, c.link.remoteAddress() ?? null);
    this.logger.info({ peer: c.publicKey, addr: c.link.remoteAddress() }, "peer connected");
  }

  async closed(c: Connection): Promise<void> {
    this.all.delete(c);
    const current = this.byKey.get(c.publicKey) === c;
    if (current) this.byKey.delete(c.publicKey);
    // A connection replaced here must not mark its successor offline; one replaced elsewhere no longer
    // owns the record; at shutdown the node's leave (presence.leave) marks all its peers offline at once.
    if (c.closeReason !== "replaced" && c.closeReason !== "shutdown" && (current || c.closeReason === "refused")) {
      try {
        await this.domain.presence.disconnected(c.publicKey);
      } catch (err) {
        this.logger.error({ err, peer: c.publicKey }, "could not mark the peer offline");
      }
    }
    this.logger.info({ peer: c.publicKey, reason: c.closeReason }, "peer disconnected");
  }

  /** Plays a tone to the key's connection on this node; false when it has none. */
  playTone(publicKey: string, frequencyHz: number, durationMs: number): { frames: number } | undefined {
    const c = this.byKey.get(publicKey);
    if (!c?.active) return undefined;
    void c.audio.play(toneFrames(frequencyHz, durationMs));
    return { frames: toneFrameCount(durationMs) };
  }

  /** The tools the key's device offers over its connection on this node (service 3); undefined when it has none here. */
  deviceTools(publicKey: string): DeviceToolSession | undefined {
    const c = this.byKey.get(publicKey);
    return c?.active ? c.tools : undefined;
  }

  /** The key's active connection on this node (tests and the benchmark call its RPCs). */
  connection(publicKey: string): Connection | undefined {
    return this.byKey.get(publicKey);
  }

  /**
   * Drains (fleet.md §3): every connection not talking now gets `node.reconnect` and is closed; one
   * in a turn or a reply gets it once that ended and the user stayed quiet for
   * `voice.turn.silence_ms`; at `deadline` (performance.now() ms) whatever is left is handed over
   * the same way. A connection answered meanwhile (an offer in flight when the drain began) is
   * handed over once active. Resolves once no connection is left.
   */
  drain(deadline: number): Promise<void> {
    this.draining ??= new Promise<void>((resolve) => {
      const sweep = () => {
        try {
          const late = performance.now() >= deadline;
          for (const c of this.all) if (c.active && !c.handedOver && (late || !c.talking)) void c.handOver("draining");
          // A connection that never became active within the deadline is closed as it is.
          if (late) for (const c of this.all) if (!c.active && !c.handedOver) void c.close("draining");
        } catch (err) {
          this.logger.error({ err }, "drain sweep failed");
        }
        if (this.all.size === 0 || this.closing) {
          clearInterval(timer);
          resolve();
        }
      };
      const timer = setInterval(sweep, DRAIN_SWEEP_MS);
      sweep();
    });
    return this.draining;
  }

  /** Connections held now, and how many of them are in a turn or a reply. */
  load(): { connections: number; talking: number } {
    let talking = 0;
    for (const c of this.all) if (c.active && c.talking) talking++;
    return { connections: this.all.size, talking };
  }

  /** Closes every connection, then flushes telemetry; the node's leave then marks the peers offline. */
  close(): Promise<void> {
    this.closing ??= (async () => {
      this.presence.stop();
      this.liveness.stop();
      this.peerWatch.stop();
      await Promise.all([...this.all].map((c) => c.close("shutdown")));
      await this.telemetry.close();
      for (const s of Object.values(this.http)) s.close();
      this.answerer.release();
    })();
    return this.closing;
  }
}
