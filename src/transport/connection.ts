import { create, toBinary } from "@bufbuild/protobuf";
import type { Logger } from "pino";
import type { Domain } from "../domain/index.ts";
import type { TelemetryWriter } from "../domain/telemetry-writer.ts";
import type { ConnectionContext } from "../http/connection.ts";
import { DeviceToolSession } from "../mcp/device.ts";
import { type ChannelPort, ChannelStream, PACKET_LABEL, SERVICE, SERVICE_PREFIX, serviceId } from "../protocol/channel.ts";
import { encodeFrame, FrameType } from "../protocol/frames.ts";
import { EmptySchema, RpcMethod } from "../protocol/gen/rpc_pb.ts";
import { callRpc, RpcCode, RpcError, type RpcHandlers, serveRpc } from "../protocol/rpc.ts";
import type { StreamSocket } from "../protocol/stream-socket.ts";
import { encodeVoiceEvent, type VoiceEvent } from "../voice/peer-events.ts";
import type { AudioPort, VoiceHost, VoiceSession } from "../voice/port.ts";
import type { PeerLink } from "./answerer.ts";
import { AudioSender } from "./audio.ts";
import { deviceInfoFromHardware, deviceInfoFromIdentifiers, rpcHandlers } from "./device-rpc.ts";
import { detached } from "./guard.ts";
import { StreamHttpServer } from "./http-streams.ts";
import type { TransportMetrics } from "./metrics.ts";
import { TalkState } from "./talk.ts";
import type { TelemetryIngest } from "./telemetry-ingest.ts";

export const EVENT_STREAM_DEADLINE_MS = 10_000;
/** After `node.reconnect`, how long the device has to close the connection itself before the server does. */
export const RECONNECT_GRACE_MS = 1_000;
export const MAX_SERVICE_STREAMS = 256;
const DEVICE_RPC_TIMEOUT_MS = 5_000;
/** What a connection needs from the transport that holds it. */
export interface ConnectionHost {
  domain: Domain;
  logger: Logger;
  metrics: TransportMetrics;
  telemetry: TelemetryWriter;
  /** The packet channel's telemetry: checked, limited per peer, decoded, written. */
  ingest: TelemetryIngest;
  /** Voice conversations over the audio track, when configured. */
  voice?: VoiceHost | undefined;
  /** Time for a whole Peer RPC request (`webrtc.rpc_request_timeout_ms`); its stream is closed after it. */
  readonly rpcRequestTimeoutMs: number;
  /** Serves an HTTP stream (service 1 or 2). */
  serveHttp(service: 1 | 2, stream: StreamSocket, context: ConnectionContext): void;
  /** The connection became active: the host makes it the key's only one and marks it online. */
  activated(c: Connection): Promise<void>;
  closed(c: Connection): Promise<void>;
}

export type StreamService = "rpc" | "public" | "compatible" | "tools";
const SERVICE_NAMES: Record<number, StreamService> = {
  [SERVICE.RPC]: "rpc",
  [SERVICE.PUBLIC_API]: "public",
  [SERVICE.COMPATIBLE_API]: "compatible",
  [SERVICE.TOOLS]: "tools",
};

export type CloseReason =
  | "blocked"
  | "removed"
  | "unresponsive"
  | "internal error"
  | "event stream closed"
  | "event stream deadline"
  | "connection failed"
  | "connection closed"
  | "replaced"
  | "shutdown"
  | "draining"
  | "refused";

/** One device's WebRTC connection, authenticated as the offer's key. */
export class Connection {
  readonly publicKey: string;
  readonly link: PeerLink;
  readonly audio: AudioSender;
  private readonly host: ConnectionHost;
  /** Open service streams, with their service. */
  private readonly streams = new Map<ChannelStream, StreamService>();
  private readonly waiting: ChannelPort[] = [];
  private events: ChannelStream | undefined;
  private deadline: NodeJS.Timeout | undefined;
  private state: "pending" | "activating" | "active" | "closed" = "pending";
  private closing: Promise<void> | undefined;
  private activation: Promise<void> | undefined;
  /** What this connection serves on stream 0 (its state, one speed test at a time, spans the streams). */
  private readonly rpc: RpcHandlers;
  closeReason: CloseReason | undefined;
  /** The connection's voice conversation, while it is active. */
  private voice: VoiceSession | undefined;
  /** The voice conversation's subscribers to the uplink's packets (src/voice/port.ts). */
  private readonly audioIn = new Set<(packet: Buffer) => void>();
  private eventSequence = 0n;
  /** The tools the device offers over service 3, while that stream is open. */
  tools: DeviceToolSession | undefined;
  /** Whether the device is in a turn or a reply (from the voice events sent), for a drain. */
  private readonly talk: TalkState;
  /** Set once `node.reconnect` was sent: the connection is being handed over. */
  private handingOver: Promise<void> | undefined;

  constructor(host: ConnectionHost, publicKey: string, link: PeerLink) {
    this.host = host;
    this.publicKey = publicKey;
    this.link = link;
    this.audio = new AudioSender(link.audio);
    this.rpc = rpcHandlers(publicKey, host.domain.peers);
    const { turn } = host.domain.ctx.config.voice;
    this.talk = new TalkState(turn.silence_ms, turn.max_ms + 15_000);
    this.deadline = setTimeout(() => void this.close("event stream deadline"), EVENT_STREAM_DEADLINE_MS);
    link.onState((state) => {
      if (state === "failed") void this.close("connection failed");
      else if (state === "closed") void this.close("connection closed");
    });
    link.onFault((err, scope) => {
      host.logger.error(
        { err, peer: publicKey, scope },
        scope === "link" ? "connection failed in a callback; closing it" : "a channel failed in a callback; closing it",
      );
      if (scope === "link") void this.close("internal error");
    });
    link.onChannel((port) => this.channel(port));
    link.onRtp((packet) => {
      host.metrics.rtp(packet.length);
      this.hearAudio(packet);
    });
  }

  /** Hands an uplink packet to the voice conversation; its failure ends the conversation, not the connection. */
  private hearAudio(packet: Buffer): void {
    try {
      for (const listener of this.audioIn) listener(packet);
    } catch (err) {
      this.host.logger.error({ err, peer: this.publicKey }, "voice conversation failed on an audio packet; it is closed");
      this.stopVoice();
    }
  }

  get active(): boolean {
    return this.state === "active";
  }

  /** `performance.now()` of the last thing the device sent. */
  lastHeard(): number {
    return this.link.lastHeard();
  }

  /** Service streams open now (HTTP and Peer RPC, either side's). */
  get openStreams(): number {
    return this.streams.size;
  }

  /** The connection's state and its streams by service, open and waiting (for the metrics). */
  census(): { state: "pending" | "activating" | "active" | "closed"; open: Record<StreamService, number>; waiting: Record<StreamService, number> } {
    const open = { rpc: 0, public: 0, compatible: 0, tools: 0 };
    const waiting = { rpc: 0, public: 0, compatible: 0, tools: 0 };
    for (const service of this.streams.values()) open[service]++;
    for (const port of this.waiting) {
      const name = SERVICE_NAMES[serviceId(port.label) ?? -1];
      if (name) waiting[name]++;
    }
    return { state: this.state, open, waiting };
  }

  private channel(port: ChannelPort): void {
    if (this.state === "closed") {
      port.close();
      return;
    }
    if (port.label === PACKET_LABEL) {
      this.packets(port);
      return;
    }
    const id = serviceId(port.label);
    if (id === SERVICE.EVENTS) {
      this.eventStream(port);
      return;
    }
    if (id === null || SERVICE_NAMES[id] === undefined) {
      this.host.logger.debug({ label: port.label }, "channel refused: unknown label or service");
      port.close();
      return;
    }
    // Service streams wait for the event stream: until then the caller is not yet registered.
    if (this.state === "active") {
      this.service(id, port);
      return;
    }
    if (this.waiting.length >= MAX_SERVICE_STREAMS) {
      this.host.metrics.streamRefused();
      port.close();
      return;
    }
    this.waiting.push(port);
  }

  private service(id: number, port: ChannelPort): void {
    if (this.streams.size >= MAX_SERVICE_STREAMS) {
      this.host.metrics.streamRefused();
      port.close();
      return;
    }
    if (id === SERVICE.RPC) {
      const stream = this.track(new ChannelStream(port), "rpc");
      detached(
        serveRpc(stream, this.rpc, (err, method) => this.host.logger.warn({ err, method }, "rpc handler failed"), this.host.rpcRequestTimeoutMs),
        (err) => {
          this.host.logger.error({ err, peer: this.publicKey }, "rpc stream failed");
          stream.destroy();
        },
      );
    } else if (id === SERVICE.TOOLS) {
      this.openTools(port);
    } else {
      this.serveHttp(id as 1 | 2, port);
    }
  }

  /** The device's tools (service 3): an MCP client session; a second stream replaces the first. */
  private openTools(port: ChannelPort): void {
    const previous = this.tools;
    if (previous) void previous.close();
    const session = new DeviceToolSession(this.track(new ChannelStream(port), "tools"), { publicKey: this.publicKey, logger: this.host.logger });
    this.tools = session;
    void session.start();
  }

  /** An HTTP stream: a socket with the device's address, served as this connection's peer. */
  private serveHttp(id: 1 | 2, port: ChannelPort): void {
    const socket = this.track(StreamHttpServer.socket(port, this.link.remoteAddress()), SERVICE_NAMES[id]!);
    this.host.serveHttp(id, socket, { peerKey: this.publicKey, remoteAddress: socket.remoteAddress ?? "unknown" });
  }

  /** Counts a stream among the open ones (closed with the connection). */
  private track<S extends ChannelStream>(stream: S, service: StreamService): S {
    this.streams.set(stream, service);
    stream.once("close", () => this.streams.delete(stream));
    return stream;
  }

  private eventStream(port: ChannelPort): void {
    if (this.events) {
      port.close(); // exactly one per connection
      return;
    }
    this.events = new ChannelStream(port);
    // Devices send nothing here; whatever arrives is read and dropped.
    this.events.resume();
    this.events.once("close", () => void this.close("event stream closed"));
    if (this.deadline) clearTimeout(this.deadline);
    this.deadline = undefined;
    this.state = "activating";
    this.activation = this.host.activated(this).then(
      () => {
        if (this.state !== "activating") return;
        this.state = "active";
        try {
          for (const port of this.waiting.splice(0)) {
            const id = serviceId(port.label) as number;
            this.service(id, port);
          }
          detached(this.pullDeviceInfo(), (err) => this.host.logger.warn({ err, peer: this.publicKey }, "device info pull failed"));
          this.startVoice();
        } catch (err) {
          this.host.logger.error({ err, peer: this.publicKey }, "connection failed while becoming active");
          void this.close("internal error");
        }
      },
      (err) => {
        this.host.logger.warn({ err, peer: this.publicKey }, "connection could not become active");
        void this.close("refused");
      },
    );
  }

  private packets(port: ChannelPort): void {
    port.attach({
      message: (data) => {
        if (this.state !== "active" && this.state !== "activating") return;
        try {
          this.host.ingest.packet(this.publicKey, data);
        } catch (err) {
          this.host.logger.error({ err, peer: this.publicKey }, "a telemetry frame could not be taken");
        }
      },
      closed: () => {},
      drained: () => {},
      failed: (err) => this.host.logger.error({ err, peer: this.publicKey }, "the packet channel failed"),
    });
  }

  /** The audio track and the event stream, as the voice feature uses them. */
  private startVoice(): void {
    if (!this.host.voice) return;
    const port: AudioPort = {
      publicKey: this.publicKey,
      payloadType: this.link.audio.payloadType,
      audioLevelId: this.link.audio.audioLevelId,
      onPacket: (cb) => {
        // Each subscription is its own entry: the same function subscribed twice is unsubscribed once each.
        const listener = (packet: Buffer) => cb(packet);
        this.audioIn.add(listener);
        return () => {
          this.audioIn.delete(listener);
        };
      },
      sendFrame: (opus, first) => this.state === "active" && this.audio.sendFrame(opus, first),
      sendEvent: (event) => this.sendEvent(event),
    };
    try {
      this.voice = this.host.voice.open(port);
    } catch (err) {
      this.host.logger.error({ err, peer: this.publicKey }, "voice conversation could not start");
    }
  }

  /** One voice event on the event stream, encoded here: one binary frame (transport contract §7), sequence numbers from 1. */
  sendEvent(event: VoiceEvent): boolean {
    const events = this.events;
    if (this.state !== "active" || !events || events.destroyed || !events.writable) return false;
    let frame: Buffer;
    try {
      frame = encodeFrame(FrameType.BINARY, encodeVoiceEvent(event, this.eventSequence + 1n, BigInt(Date.now())));
    } catch (err) {
      // An event that cannot be one frame is dropped; the caller's work (a reply) goes on.
      this.host.logger.warn({ err, peer: this.publicKey }, "an event too large for one frame was not sent");
      return false;
    }
    this.eventSequence++;
    events.write(frame);
    this.talk.sent(event, performance.now());
    return true;
  }

  /** Whether the device is in a turn or a reply now (see `TalkState`). */
  get talking(): boolean {
    return this.talk.talking(performance.now()) || this.voice?.hearing?.() === true;
  }

  /** Whether `node.reconnect` was sent to this connection already. */
  get handedOver(): boolean {
    return this.handingOver !== undefined;
  }

  /**
   * Hands the device to another node (fleet.md §3): `node.reconnect` on its event stream, then the
   * connection closes, by the device (which reconnects through the balancer at once) or after
   * `RECONNECT_GRACE_MS` here (a device that does not know the event reconnects as on any close).
   */
  handOver(reason: "draining"): Promise<void> {
    this.handingOver ??= (async () => {
      const text = JSON.stringify({ reason, retry_after_ms: 0 });
      this.sendEvent({ type: "done", streamId: "node", label: "node.reconnect", text });
      if (this.state !== "closed") {
        let timer: NodeJS.Timeout | undefined;
        const grace = new Promise<void>((resolve) => {
          timer = setTimeout(resolve, RECONNECT_GRACE_MS);
        });
        await Promise.race([grace, this.closedByDevice()]);
        clearTimeout(timer);
      }
      await this.close(reason);
    })();
    return this.handingOver;
  }

  /** Resolves once the connection closed (by either side). */
  private closedByDevice(): Promise<void> {
    return new Promise((resolve) => {
      const check = setInterval(() => {
        if (this.state === "closed") {
          clearInterval(check);
          resolve();
        }
      }, 20);
      check.unref();
    });
  }

  /** Calls a `client.*` or `all.*` method on the device over a new stream 0. */
  async call(method: RpcMethod, payload: Uint8Array, o: { timeoutMs?: number; upBytes?: number } = {}) {
    if (this.state !== "active") throw new Error("the connection is not active");
    if (this.streams.size >= MAX_SERVICE_STREAMS) throw new Error("too many open streams");
    const timeoutMs = o.timeoutMs ?? DEVICE_RPC_TIMEOUT_MS;
    const port = await this.link.openChannel(`${SERVICE_PREFIX}${SERVICE.RPC}`, timeoutMs);
    return callRpc(this.track(new ChannelStream(port), "rpc"), method, payload, { ...o, timeoutMs });
  }

  /** `client.info.get` and `client.identifiers.get`, once; a device without them answers −32601 and nothing changes. */
  private async pullDeviceInfo(): Promise<void> {
    const empty = toBinary(EmptySchema, create(EmptySchema));
    for (const [method, convert] of [
      [RpcMethod.CLIENT_INFO_GET, deviceInfoFromHardware],
      [RpcMethod.CLIENT_IDENTIFIERS_GET, deviceInfoFromIdentifiers],
    ] as const) {
      if (this.state !== "active") return;
      try {
        const { payload } = await this.call(method, empty);
        const patch = convert(payload);
        if (patch && this.state === "active") await this.host.domain.peers.mergeDeviceInfo(this.publicKey, patch);
      } catch (err) {
        const level = err instanceof RpcError && err.code === RpcCode.METHOD_NOT_FOUND ? "debug" : this.state === "active" ? "info" : "debug";
        this.host.logger[level]({ peer: this.publicKey, method, err: (err as Error).message }, "device info not available");
      }
    }
  }

  /** Closes everything: streams, channels, the peer connection; the host marks the peer offline. */
  close(reason: CloseReason): Promise<void> {
    this.closing ??= (async () => {
      this.closeReason = reason;
      const wasActivating = this.state === "activating";
      this.state = "closed";
      if (this.deadline) clearTimeout(this.deadline);
      this.deadline = undefined;
      // Each step on its own: one failing must not keep the others (or the host's bookkeeping) from running.
      const step = (what: string, fn: () => void) => {
        try {
          fn();
        } catch (err) {
          this.host.logger.error({ err, peer: this.publicKey }, `closing a connection: ${what} failed`);
        }
      };
      this.stopVoice();
      step("the tool session", () => void this.tools?.close());
      step("audio", () => this.audio.stop());
      for (const port of this.waiting.splice(0)) step("a waiting channel", () => port.close());
      for (const s of this.streams.keys()) step("a stream", () => s.destroy());
      step("the event stream", () => this.events?.destroy());
      step("the peer connection", () => this.link.close());
      if (wasActivating) await this.activation?.catch(() => {});
      try {
        await this.host.closed(this);
      } catch (err) {
        this.host.logger.error({ err, peer: this.publicKey }, "closing a connection: the host's bookkeeping failed");
      }
    })();
    return this.closing;
  }

  private stopVoice(): void {
    this.audioIn.clear();
    try {
      this.voice?.close();
    } catch (err) {
      this.host.logger.error({ err, peer: this.publicKey }, "voice conversation did not close cleanly");
    }
    this.voice = undefined;
  }
}
