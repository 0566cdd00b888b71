/**
 * The device side of the WebRTC transport: seals an offer, opens the mandatory audio transceiver,
 * packet channel and event stream, and then offers HTTP over streams 1 and 2, Peer RPC both
 * ways and telemetry packets. Runs on node-datachannel (`datachannel.ts`), the server's stack;
 * a libwebrtc-like implementation (`rtc`, e.g. `@roamhq/wrtc`) can be given instead.
 */
import { request as httpRequest, type IncomingMessage } from "node:http";
import { create, type MessageInitShape, toBinary } from "@bufbuild/protobuf";
import { decodeKey, encodeKey, type KeyPair, privateKeyObject, sharedSecret } from "../crypto/keys.ts";
import { SealedExchange, SIGNALING_PATH } from "../crypto/sealed-offer.ts";
import {
  type ChannelPort,
  type ChannelSink,
  ChannelStream,
  CLOSE_QUIET_MS,
  LOW_WATER_BYTES,
  PACKET_LABEL,
  SERVICE,
  SERVICE_PREFIX,
  serviceId,
} from "../protocol/channel.ts";
import type { RpcMethod } from "../protocol/gen/rpc_pb.ts";
import { RpcMethod as Methods } from "../protocol/gen/rpc_pb.ts";
import { TelemetryFrameSchema } from "../protocol/gen/telemetry_pb.ts";
import { callRpc, commonHandlers, type RpcHandlers, rpcPayload, serveRpc } from "../protocol/rpc.ts";
import { StreamSocket } from "../protocol/stream-socket.ts";
import { type DeviceMedia, datachannelPeer } from "./datachannel.ts";
import { type DeviceTool, OfferedTools } from "./tools.ts";
import { type AudioSourceLike, EventReader, Loudspeaker, Microphone } from "./voice.ts";

export const TELEMETRY_PACKET = 0x40;

/** A libwebrtc-like WebRTC implementation (`@roamhq/wrtc`, a browser's), used instead of node-datachannel when given. */
export interface RtcImplementation {
  RTCPeerConnection: typeof RTCPeerConnection;
  nonstandard?: {
    RTCAudioSink?: new (track: MediaStreamTrack) => { ondata: ((e: { samples: Int16Array; sampleRate?: number }) => void) | null; stop(): void };
    RTCAudioSource?: new () => AudioSourceLike;
  };
}

export interface ConnectOptions {
  /** `http://host:port` of the server. */
  baseUrl: string;
  keyPair: KeyPair;
  /** The server's public key (base58); fetched from `/server-info` when absent. */
  serverPublicKey?: string;
  registrationToken?: string;
  /** `client.*` methods this device provides; `all.*` are always provided. */
  handlers?: RpcHandlers;
  /** Default: node-datachannel (the server's stack). */
  rtc?: RtcImplementation;
  /** Unix milliseconds. */
  now?: () => number;
  timeoutMs?: number;
  fetch?: typeof fetch;
}

/** A refused offer: the server's `ErrorResponse`. */
export class OfferError extends Error {
  readonly status: number;
  readonly code: string;
  readonly headers: Headers;
  constructor(status: number, code: string, message: string, headers: Headers) {
    super(`${status} ${code}: ${message}`);
    this.status = status;
    this.code = code;
    this.headers = headers;
  }
}

/** Audio received on the downlink: 10 ms blocks decoded by the WebRTC stack. */
export interface AudioStats {
  blocks: number;
  /** Blocks whose RMS level is above silence. */
  audible: number;
  peakRms: number;
}

export interface HttpResponse {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Buffer;
  json<T = unknown>(): T;
}

/** The server's key from `/server-info`; an answer that is not one (a balancer with no node ready: 503) is an `OfferError`. */
async function serverPublicKey(fetchImpl: typeof fetch, baseUrl: string): Promise<string> {
  const res = await fetchImpl(`${baseUrl}/server-info`);
  const text = await res.text();
  let key: unknown;
  try {
    key = (JSON.parse(text) as { public_key?: unknown }).public_key;
  } catch {}
  if (!res.ok || typeof key !== "string")
    throw new OfferError(res.ok ? 502 : res.status, "UNAVAILABLE", `GET /server-info answered ${res.status}`, res.headers);
  return key;
}

/** The audio of a libwebrtc-like stack: its transceiver, a PCM source and sink of its own (`nonstandard`, as wrtc has). */
function rtcMedia(rtc: RtcImplementation, pc: RTCPeerConnection, transceiver: RTCRtpTransceiver): DeviceMedia {
  let sink: { stop(): void } | undefined;
  return {
    async source() {
      const Source = rtc.nonstandard?.RTCAudioSource;
      if (!Source) throw new Error("this WebRTC implementation cannot send PCM (it has no RTCAudioSource)");
      const source = new Source();
      await transceiver.sender.replaceTrack(source.createTrack!());
      return source;
    },
    listen(block) {
      const Sink = rtc.nonstandard?.RTCAudioSink;
      if (!Sink) return;
      const s = new Sink(transceiver.receiver.track);
      s.ondata = (e) => block(e.samples, e.sampleRate ?? 48_000);
      sink = s;
    },
    async packetsReceived() {
      let n = 0;
      (await pc.getStats()).forEach((r: { type?: string; kind?: string; packetsReceived?: number }) => {
        if (r.type === "inbound-rtp" && r.kind === "audio") n += r.packetsReceived ?? 0;
      });
      return n;
    },
    close() {
      sink?.stop();
      sink = undefined;
    },
  };
}

/** A peer connection with the device's sendrecv audio, on `rtc` when given, else on node-datachannel. */
function peerWithAudio(rtc: RtcImplementation | undefined): { pc: RTCPeerConnection; media: DeviceMedia } {
  if (!rtc) return datachannelPeer();
  const pc = new rtc.RTCPeerConnection({ iceServers: [] });
  const transceiver = pc.addTransceiver("audio", { direction: "sendrecv" });
  return { pc, media: rtcMedia(rtc, pc, transceiver) };
}

/** How often a channel whose buffer is over the low-water mark is checked for having drained. */
const DRAIN_POLL_MS = 5;
/**
 * The offer goes once no UDP candidate came for this long after one did (or once gathering is
 * complete). Perch's ICE is UDP only, and libwebrtc gathers its TCP candidates 100 ms after its
 * UDP ones, all of which come in one burst.
 */
const UDP_CANDIDATES_QUIET_MS = 20;

function portOf(dc: RTCDataChannel): ChannelPort {
  dc.binaryType = "arraybuffer";
  let sink: ChannelSink | undefined;
  // `@roamhq/wrtc` has no `bufferedAmountLowThreshold` and never fires `bufferedamountlow`, and
  // its `bufferedAmount` catches up with sends only later: a writer that saw the buffer over the
  // high-water mark would wait for ever. So whenever the buffer is read above the low-water mark,
  // it is watched until it is back under it (the event, where the stack has it, wakes earlier).
  let watch: NodeJS.Timeout | undefined;
  const drained = () => {
    clearInterval(watch);
    watch = undefined;
    sink?.drained();
  };
  const watchDrain = () => {
    watch ??= setInterval(() => {
      if (dc.readyState !== "open" || dc.bufferedAmount <= LOW_WATER_BYTES) drained();
    }, DRAIN_POLL_MS);
  };
  return {
    label: dc.label,
    send: (data) => dc.send(new Uint8Array(data) as Uint8Array<ArrayBuffer>),
    bufferedAmount: () => {
      const amount = dc.bufferedAmount;
      if (amount > LOW_WATER_BYTES) watchDrain();
      return amount;
    },
    // libwebrtc reports bufferedAmount late: a close right after the last send can overtake it.
    close: () =>
      void setTimeout(() => {
        try {
          dc.close();
        } catch {}
      }, 50),
    attach(s) {
      sink = s;
      dc.bufferedAmountLowThreshold = LOW_WATER_BYTES;
      let lastMessage = 0;
      dc.onmessage = (e) => {
        lastMessage = performance.now();
        s.message(typeof e.data === "string" ? Buffer.from(e.data) : new Uint8Array(e.data as ArrayBuffer));
      };
      // The close may overtake the last messages (node-datachannel): told once none has come for a moment and a turn of the loop brought none.
      const closeWhenQuiet = (): void => {
        if (performance.now() - lastMessage < CLOSE_QUIET_MS) return void setTimeout(closeWhenQuiet, CLOSE_QUIET_MS);
        const seen = lastMessage;
        setImmediate(() => (lastMessage === seen ? s.closed() : closeWhenQuiet()));
      };
      dc.onclose = () => {
        clearInterval(watch);
        watch = undefined;
        setTimeout(closeWhenQuiet, CLOSE_QUIET_MS);
      };
      dc.onbufferedamountlow = drained;
    },
  };
}

function opened(dc: RTCDataChannel, timeoutMs: number): Promise<void> {
  if (dc.readyState === "open") return Promise.resolve();
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${dc.label} did not open within ${timeoutMs} ms`)), timeoutMs);
    dc.addEventListener("open", () => {
      clearTimeout(timer);
      resolve();
    });
    dc.addEventListener("close", () => {
      clearTimeout(timer);
      reject(new Error(`${dc.label} closed`));
    });
  });
}

/** A device's live connection to a Perch server. */
export class PerchConnection {
  readonly pc: RTCPeerConnection;
  readonly publicKey: string;
  keyPair!: KeyPair;
  /** Client-measured phases of `connect`, in milliseconds. */
  readonly timings: { offer: number; ready: number; serverTiming: string };
  readonly audio: AudioStats = { blocks: 0, audible: 0, peakRms: 0 };
  private readonly packets: RTCDataChannel;
  private readonly events: RTCDataChannel;
  private readonly handlers: RpcHandlers;
  private readonly timeoutMs: number;
  private sequence = 0;
  private closedPromise: Promise<void>;
  private media!: DeviceMedia;
  /** The downlink's audio as heard (see `Loudspeaker`). */
  readonly speaker = new Loudspeaker();
  /** Events the server sends on service 32. */
  readonly eventStream = new EventReader();
  private mic: Microphone | undefined;

  private constructor(
    pc: RTCPeerConnection,
    publicKey: string,
    channels: { packets: RTCDataChannel; events: RTCDataChannel },
    handlers: RpcHandlers,
    timeoutMs: number,
    timings: PerchConnection["timings"],
  ) {
    this.pc = pc;
    this.publicKey = publicKey;
    this.packets = channels.packets;
    this.events = channels.events;
    this.handlers = handlers;
    this.timeoutMs = timeoutMs;
    this.timings = timings;
    this.closedPromise = new Promise((resolve) => {
      // The server closing the event stream ends the connection: release the peer connection too.
      const done = () => {
        this.close();
        resolve();
      };
      this.events.addEventListener("close", done);
      pc.addEventListener("connectionstatechange", () => {
        if (pc.connectionState === "failed" || pc.connectionState === "closed") done();
      });
    });
    pc.ondatachannel = (e) => this.incoming(e.channel);
    this.events.binaryType = "arraybuffer";
    this.events.onmessage = (e) => {
      if (typeof e.data !== "string") this.eventStream.push(new Uint8Array(e.data as ArrayBuffer));
    };
  }

  /** Connects: builds and seals the offer, posts it, applies the answer, waits for the event stream. */
  static async connect(o: ConnectOptions): Promise<PerchConnection> {
    const started = performance.now();
    const fetchImpl = o.fetch ?? fetch;
    const baseUrl = o.baseUrl.replace(/\/+$/, "");
    const timeoutMs = o.timeoutMs ?? 15_000;
    const serverKey = o.serverPublicKey ?? (await serverPublicKey(fetchImpl, baseUrl));
    const publicKey = encodeKey(o.keyPair.publicKey);
    const shared = sharedSecret(privateKeyObject(o.keyPair.privateKey), decodeKey(serverKey));

    const { pc, media } = peerWithAudio(o.rtc);
    try {
      // The server may open streams (its RPC calls) as soon as the event stream is open.
      const early: RTCDataChannel[] = [];
      pc.ondatachannel = (e) => early.push(e.channel);
      const packets = pc.createDataChannel(PACKET_LABEL, { ordered: false, maxRetransmits: 0 });
      const events = pc.createDataChannel(`${SERVICE_PREFIX}${SERVICE.EVENTS}`);
      // Offers are not trickled: the offer is sent once every candidate Perch can use (UDP) is in it.
      const gathered = new Promise<void>((resolve, reject) => {
        let quiet: ReturnType<typeof setTimeout> | undefined;
        const timer = setTimeout(() => reject(new Error(`ICE gathering did not complete within ${timeoutMs} ms`)), timeoutMs);
        const done = () => {
          clearTimeout(timer);
          clearTimeout(quiet);
          resolve();
        };
        if (pc.iceGatheringState === "complete") done();
        pc.addEventListener("icegatheringstatechange", () => pc.iceGatheringState === "complete" && done());
        pc.addEventListener("icecandidate", (e) => {
          if (!/^candidate:\S+ \d+ udp /i.test(e.candidate?.candidate ?? "")) return;
          clearTimeout(quiet);
          quiet = setTimeout(done, UDP_CANDIDATES_QUIET_MS);
        });
      });
      // node-datachannel makes its offer by itself once the track and channels are added.
      if (o.rtc) await pc.setLocalDescription(await pc.createOffer());
      await gathered;
      const exchange = SealedExchange.create(shared, publicKey, Math.floor((o.now ?? Date.now)() / 1000));
      const headers: Record<string, string> = { "content-type": "application/octet-stream", ...exchange.headers() };
      if (o.registrationToken) headers["x-registration-token"] = o.registrationToken;
      const res = await fetchImpl(`${baseUrl}${SIGNALING_PATH}`, {
        method: "POST",
        headers,
        body: new Uint8Array(exchange.sealRequest(pc.localDescription!.sdp)),
      });
      const body = new Uint8Array(await res.arrayBuffer());
      if (res.status !== 200) {
        let error = { code: "UNKNOWN", message: Buffer.from(body).toString() };
        try {
          error = (JSON.parse(Buffer.from(body).toString()) as { error: typeof error }).error;
        } catch {}
        throw new OfferError(res.status, error.code, error.message, res.headers);
      }
      const offerMs = performance.now() - started;
      await pc.setRemoteDescription({ type: "answer", sdp: exchange.openResponse(body) });
      await Promise.all([opened(events, timeoutMs), opened(packets, timeoutMs)]);
      const conn = new PerchConnection(pc, publicKey, { packets, events }, { ...commonHandlers(), ...o.handlers }, timeoutMs, {
        offer: offerMs,
        ready: performance.now() - started,
        serverTiming: res.headers.get("server-timing") ?? "",
      });
      conn.keyPair = o.keyPair;
      conn.media = media;
      for (const dc of early) conn.incoming(dc);
      media.listen((samples, rate) => conn.heard(samples, rate));
      return conn;
    } catch (err) {
      media.close();
      pc.close();
      throw err;
    }
  }

  /** One block of the downlink's decoded audio: its levels, and the loudspeaker. */
  private heard(samples: Int16Array, sampleRate: number): void {
    let sum = 0;
    for (const s of samples) sum += s * s;
    const rms = Math.sqrt(sum / Math.max(1, samples.length));
    this.audio.blocks++;
    if (rms > 100) this.audio.audible++;
    this.audio.peakRms = Math.max(this.audio.peakRms, rms);
    this.speaker.block(samples, sampleRate);
  }

  /** The peer connection's state (`connected`, `closed`, …). */
  get connectionState(): string {
    return this.pc.connectionState;
  }

  /** RTP packets of the downlink (the server's audio) received so far. */
  audioPacketsReceived(): Promise<number> {
    return this.media.packetsReceived();
  }

  /** The microphone: a steady uplink (silence until something is said), started on first use. */
  async microphone(): Promise<Microphone> {
    if (this.mic) return this.mic;
    const source = await this.media.source();
    this.mic = new Microphone(source);
    this.mic.start();
    return this.mic;
  }

  /** Streams the server opens: RPC calls to this device. */
  incoming(dc: RTCDataChannel): void {
    if (serviceId(dc.label) !== SERVICE.RPC) {
      dc.close();
      return;
    }
    void opened(dc, this.timeoutMs).then(
      () => serveRpc(new ChannelStream(portOf(dc)), this.handlers),
      () => {},
    );
  }

  /** Opens a service stream and resolves once it is open (a socket, for Node's HTTP client on streams 1 and 2). */
  async openStream(service: number): Promise<StreamSocket> {
    const dc = this.pc.createDataChannel(`${SERVICE_PREFIX}${service}`);
    const stream = new StreamSocket(portOf(dc));
    await opened(dc, this.timeoutMs);
    return stream;
  }

  /** One HTTP/1.1 exchange over a new stream (1: Public API, 2: Compatible API), parsed by Node's own HTTP client. */
  async http(service: 1 | 2, method: string, path: string, o: { body?: string | Uint8Array; headers?: Record<string, string> } = {}): Promise<HttpResponse> {
    const stream = await this.openStream(service);
    const body = o.body === undefined ? undefined : typeof o.body === "string" ? Buffer.from(o.body) : Buffer.from(o.body);
    const headers: Record<string, string> = { host: "perch", connection: "close", ...o.headers };
    if (body) headers["content-length"] = String(body.length);
    return new Promise((resolve, reject) => {
      const req = httpRequest({ method, path, headers, createConnection: () => stream as never, setHost: false }, (res: IncomingMessage) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          const data = Buffer.concat(chunks);
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: data, json: <T>() => JSON.parse(data.toString()) as T });
        });
        res.on("error", reject);
      });
      req.on("error", reject);
      req.end(body);
    });
  }

  /** Calls a method the server provides (or `all.*`); throws `RpcError` for an error answer. */
  async call(method: RpcMethod, payload: Uint8Array, o: { timeoutMs?: number; upBytes?: number } = {}) {
    return callRpc(await this.openStream(SERVICE.RPC), method, payload, { timeoutMs: this.timeoutMs, ...o });
  }

  /** Offers `tools` to the server's agents over a new service stream 3 (see `OfferedTools`). */
  async offerTools(tools: readonly DeviceTool[]): Promise<OfferedTools> {
    const offered = new OfferedTools(tools);
    await offered.serve(await this.openStream(SERVICE.TOOLS));
    return offered;
  }

  /** `all.ping`: the round trip in milliseconds and the server's clock. */
  async ping(): Promise<{ rttMs: number; serverTime: number }> {
    const started = performance.now();
    const { payload } = await this.call(Methods.ALL_PING, rpcPayload.ping());
    return { rttMs: performance.now() - started, serverTime: Number(rpcPayload.pingResponse(payload).serverTime) };
  }

  /** `all.speed_test.run`: moves `down` bytes to this device and `up` bytes to the server. */
  async speedTest(down: number, up: number): Promise<{ down: number; up: number; ms: number }> {
    const started = performance.now();
    const { payload, dataBytes } = await this.call(Methods.ALL_SPEED_TEST_RUN, rpcPayload.speedTest(down, up), { upBytes: up, timeoutMs: 60_000 });
    const res = rpcPayload.speedTestResponse(payload);
    if (dataBytes !== Number(res.downContentLength)) throw new Error(`received ${dataBytes} bytes of ${res.downContentLength}`);
    return { down: dataBytes, up: Number(res.upContentLength), ms: performance.now() - started };
  }

  /** Sends one telemetry packet (0x40 + TelemetryFrame) on the unreliable packet channel. */
  sendTelemetry(frame: { observedAtUnixMs: bigint; observations: MessageInitShape<typeof TelemetryFrameSchema>["observations"]; sequence?: number }): void {
    const bytes = toBinary(
      TelemetryFrameSchema,
      create(TelemetryFrameSchema, {
        sequence: frame.sequence ?? this.sequence++,
        observedAtUnixMs: frame.observedAtUnixMs,
        observations: frame.observations ?? [],
      }),
    );
    const packet = new Uint8Array(bytes.length + 1);
    packet[0] = TELEMETRY_PACKET;
    packet.set(bytes, 1);
    this.packets.send(packet);
  }

  /** Resolves when the connection ends (from either side). */
  closed(): Promise<void> {
    return this.closedPromise;
  }

  close(): void {
    this.mic?.stop();
    this.mic = undefined;
    this.media?.close();
    if (this.pc.connectionState !== "closed") this.pc.close();
  }
}
