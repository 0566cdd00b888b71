/**
 * A Perch device for a browser page, written from the transport contract alone: nothing of the
 * server or of the Node SDK is imported but the code generated from the contract's protocol
 * buffers. X25519 and HKDF-SHA256 come from WebCrypto, ChaCha20-Poly1305 from @noble/ciphers
 * (WebCrypto has no such cipher), encodings from @scure/base, and the connection is the
 * page's own RTCPeerConnection. The browser end-to-end test bundles this file with esbuild and
 * drives it through `globalThis.perchDevice` (see `PageApi`).
 */
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { chacha20poly1305 } from "@noble/ciphers/chacha.js";
import { base58, base64urlnopad, hex } from "@scure/base";
// The contract's protocol buffers, as generated from its .proto files (no Node code in them).
import { RpcErrorSchema, RpcRequestSchema, RpcResponseSchema } from "../../src/protocol/gen/rpc_pb.ts";

const SIGNALING_PATH = "/webrtc/v1/offer";
const HKDF_INFO = "giznet/gizwebrtc/http-signaling/v1";
const PACKET_LABEL = "giznet/v1/packet";
const SERVICE_PREFIX = "giznet/v1/service/";
const SERVICE_RPC = 0;
const SERVICE_EVENTS = 32;
/** At most this much per DataChannel message on a service stream. */
const MAX_MESSAGE_BYTES = 16 * 1024;
/** Writes wait while more than this is queued in a channel. */
const HIGH_WATER_BYTES = 1024 * 1024;
const RPC_METHOD_NOT_FOUND = -32601;

const encoder = new TextEncoder();
const strictUtf8 = new TextDecoder("utf-8", { fatal: true });

// ---------------------------------------------------------------------------------------------
// Text forms: base58 (Bitcoin alphabet) for keys, base64url without padding for the nonce.
const base58Encode = (bytes: Uint8Array): string => base58.encode(bytes);
const base58Decode = (text: string): Uint8Array<ArrayBuffer> => new Uint8Array(base58.decode(text.trim()));
const base64url = (bytes: Uint8Array): string => base64urlnopad.encode(bytes);
const fromBase64url = (text: string): Uint8Array<ArrayBuffer> => new Uint8Array(base64urlnopad.decode(text));
export const toHex = (bytes: Uint8Array): string => hex.encode(bytes);
export const fromHex = (text: string): Uint8Array<ArrayBuffer> => new Uint8Array(hex.decode(text));

function concat(...parts: Uint8Array[]): Uint8Array<ArrayBuffer> {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let offset = 0;
  for (const p of parts) {
    out.set(p, offset);
    offset += p.length;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Keys and the sealed offer (transport contract, section 1).

export interface DeviceKey {
  privateKey: CryptoKey;
  /** The public key's text form. */
  publicKey: string;
}

/** A new X25519 key pair; the private key never leaves WebCrypto. */
export async function generateDeviceKey(): Promise<DeviceKey> {
  const pair = (await crypto.subtle.generateKey({ name: "X25519" }, false, ["deriveBits"])) as CryptoKeyPair;
  return { privateKey: pair.privateKey, publicKey: base58Encode(new Uint8Array(await crypto.subtle.exportKey("raw", pair.publicKey))) };
}

/** PKCS#8 wrapping of a raw 32-byte X25519 private key (WebCrypto imports private keys no other way but JWK). */
const PKCS8_X25519_PREFIX = fromHex("302e020100300506032b656e04220420");

/** A key pair from a raw private key (the contract's test vectors). */
export async function importDeviceKey(rawPrivate: Uint8Array): Promise<DeviceKey> {
  const privateKey = await crypto.subtle.importKey("pkcs8", concat(PKCS8_X25519_PREFIX, rawPrivate), { name: "X25519" }, true, ["deriveBits"]);
  const jwk = await crypto.subtle.exportKey("jwk", privateKey);
  return { privateKey, publicKey: base58Encode(fromBase64url(jwk.x!)) };
}

export async function sharedSecret(key: DeviceKey, serverKey: string): Promise<Uint8Array<ArrayBuffer>> {
  const raw = base58Decode(serverKey);
  if (raw.length !== 32) throw new Error("the server key is not 32 bytes");
  const serverPublic = await crypto.subtle.importKey("raw", raw, { name: "X25519" }, false, []);
  const shared = new Uint8Array(await crypto.subtle.deriveBits({ name: "X25519", public: serverPublic }, key.privateKey, 256));
  if (shared.every((b) => b === 0)) throw new Error("the X25519 result is all zeros");
  return shared;
}

export interface SealedOffer {
  /** The request headers, Content-Type included. */
  headers: Record<string, string>;
  body: Uint8Array<ArrayBuffer>;
  /** Opens a 200 response body: the answer SDP. */
  openAnswer(body: Uint8Array): string;
  /** The four derived values, for the vectors. */
  derived: { requestKey: string; requestNonce: string; responseKey: string; responseNonce: string };
}

/** Seals an offer SDP for the server whose public key is `serverKey`; `timestamp` and `nonce` are fixed only for vectors. */
export async function sealOffer(key: DeviceKey, serverKey: string, sdp: string, o: { timestamp?: string; nonce?: Uint8Array } = {}): Promise<SealedOffer> {
  const shared = await sharedSecret(key, serverKey);
  const nonce = o.nonce ?? crypto.getRandomValues(new Uint8Array(16));
  const timestamp = o.timestamp ?? String(Math.floor(Date.now() / 1000));
  const nonceText = base64url(nonce);
  const salt = concat(nonce, encoder.encode(timestamp));
  const ikm = await crypto.subtle.importKey("raw", shared, "HKDF", false, ["deriveBits"]);
  const derive = async (info: string, length: number) =>
    new Uint8Array(await crypto.subtle.deriveBits({ name: "HKDF", hash: "SHA-256", salt, info: encoder.encode(`${HKDF_INFO} ${info}`) }, ikm, length * 8));
  const requestKey = await derive("c2s", 32);
  const responseKey = await derive("s2c", 32);
  const requestNonce = await derive("c2s nonce", 12);
  const responseNonce = await derive("s2c nonce", 12);
  const aadLines = ["POST", SIGNALING_PATH, key.publicKey, timestamp, nonceText];
  const requestAad = encoder.encode(aadLines.join("\n"));
  const responseAad = encoder.encode([...aadLines, "answer"].join("\n"));
  return {
    headers: {
      "Content-Type": "application/octet-stream",
      "X-Giznet-Public-Key": key.publicKey,
      "X-Giznet-Timestamp": timestamp,
      "X-Giznet-Nonce": nonceText,
    },
    body: new Uint8Array(chacha20poly1305(requestKey, requestNonce, requestAad).encrypt(encoder.encode(sdp))),
    openAnswer: (body) => strictUtf8.decode(chacha20poly1305(responseKey, responseNonce, responseAad).decrypt(body)),
    derived: { requestKey: toHex(requestKey), requestNonce: toHex(requestNonce), responseKey: toHex(responseKey), responseNonce: toHex(responseNonce) },
  };
}

// ---------------------------------------------------------------------------------------------
// DataChannels as byte streams.

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
      reject(new Error(`${dc.label} closed before it opened`));
    });
  });
}

/** Writes bytes in messages of at most 16 KiB, waiting while the channel's buffer is over the high-water mark. */
async function writeBytes(dc: RTCDataChannel, bytes: Uint8Array): Promise<void> {
  dc.bufferedAmountLowThreshold = HIGH_WATER_BYTES / 4;
  for (let offset = 0; offset < bytes.length; offset += MAX_MESSAGE_BYTES) {
    while (dc.bufferedAmount > HIGH_WATER_BYTES) await new Promise((r) => dc.addEventListener("bufferedamountlow", r, { once: true }));
    dc.send(bytes.slice(offset, offset + MAX_MESSAGE_BYTES));
  }
}

/** Everything the channel receives until it closes (message boundaries mean nothing). */
function readUntilClosed(dc: RTCDataChannel, timeoutMs: number): Promise<Uint8Array> {
  dc.binaryType = "arraybuffer";
  const chunks: Uint8Array[] = [];
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${dc.label} was not closed within ${timeoutMs} ms`)), timeoutMs);
    dc.addEventListener("message", (e: MessageEvent) =>
      chunks.push(typeof e.data === "string" ? encoder.encode(e.data) : new Uint8Array(e.data as ArrayBuffer)),
    );
    dc.addEventListener("close", () => {
      clearTimeout(timer);
      resolve(concat(...chunks));
    });
  });
}

// ---------------------------------------------------------------------------------------------
// HTTP/1.1 over a service stream (contract section 4).

export interface HttpResult {
  status: number;
  reason: string;
  /** Header names in lower case; repeated headers joined with ", ". */
  headers: Record<string, string>;
  body: string;
}

function requestBytes(method: string, path: string, body: string | undefined, contentType: string): Uint8Array {
  const payload = body === undefined ? undefined : encoder.encode(body);
  let head = `${method} ${path} HTTP/1.1\r\nHost: perch\r\nConnection: close\r\n`;
  if (payload) head += `Content-Type: ${contentType}\r\nContent-Length: ${payload.length}\r\n`;
  return concat(encoder.encode(`${head}\r\n`), payload ?? new Uint8Array(0));
}

function indexOf(bytes: Uint8Array, pattern: string, from = 0): number {
  const p = encoder.encode(pattern);
  outer: for (let i = from; i <= bytes.length - p.length; i++) {
    for (let j = 0; j < p.length; j++) if (bytes[i + j] !== p[j]) continue outer;
    return i;
  }
  return -1;
}

function dechunk(bytes: Uint8Array): Uint8Array {
  const parts: Uint8Array[] = [];
  let at = 0;
  for (;;) {
    const eol = indexOf(bytes, "\r\n", at);
    if (eol < 0) throw new Error("truncated chunk size line");
    const size = Number.parseInt(new TextDecoder("latin1").decode(bytes.subarray(at, eol)).split(";")[0]!.trim(), 16);
    if (!Number.isFinite(size)) throw new Error("invalid chunk size");
    at = eol + 2;
    if (size === 0) return concat(...parts);
    if (at + size > bytes.length) throw new Error("truncated chunk");
    parts.push(bytes.subarray(at, at + size));
    at += size + 2;
  }
}

/** Parses a whole HTTP/1.1 response: content-length, chunked or close-delimited. */
export function parseResponse(bytes: Uint8Array): HttpResult {
  const end = indexOf(bytes, "\r\n\r\n");
  if (end < 0) throw new Error(`no complete response head in ${bytes.length} bytes`);
  const [statusLine = "", ...lines] = new TextDecoder("latin1").decode(bytes.subarray(0, end)).split("\r\n");
  const m = /^HTTP\/1\.[01] (\d{3})(?: (.*))?$/.exec(statusLine);
  if (!m) throw new Error(`not an HTTP/1.1 status line: ${JSON.stringify(statusLine)}`);
  const headers: Record<string, string> = {};
  for (const line of lines) {
    const colon = line.indexOf(":");
    if (colon <= 0) throw new Error(`malformed header line: ${JSON.stringify(line)}`);
    const name = line.slice(0, colon).trim().toLowerCase();
    const value = line.slice(colon + 1).trim();
    headers[name] = name in headers ? `${headers[name]}, ${value}` : value;
  }
  let body = bytes.subarray(end + 4);
  if (/\bchunked\b/i.test(headers["transfer-encoding"] ?? "")) body = dechunk(body);
  else if (headers["content-length"] !== undefined) {
    const length = Number(headers["content-length"]);
    if (body.length < length) throw new Error(`body truncated: ${body.length} of ${length} bytes`);
    body = body.subarray(0, length);
  }
  return { status: Number(m[1]), reason: m[2] ?? "", headers, body: strictUtf8.decode(body) };
}

// ---------------------------------------------------------------------------------------------
// Peer RPC (contract section 5), only as far as a device that provides no `client.*` method needs:
// every call is answered −32601.

const FRAME_END = 0;
const FRAME_BINARY = 2;
const FRAME_CONTINUATION = 3;

function frame(type: number, payload: Uint8Array = new Uint8Array(0)): Uint8Array {
  const header = new Uint8Array(4);
  new DataView(header.buffer).setUint16(0, payload.length, true);
  new DataView(header.buffer).setUint16(2, type, true);
  return concat(header, payload);
}

/** `RpcResponse` with error −32601 for the request's id. */
function methodNotFound(request: Uint8Array): Uint8Array {
  const { id } = fromBinary(RpcRequestSchema, request);
  return toBinary(
    RpcResponseSchema,
    create(RpcResponseSchema, { id, body: { case: "error", value: create(RpcErrorSchema, { code: RPC_METHOD_NOT_FOUND, message: "method not found" }) } }),
  );
}

/** Serves one incoming RPC stream: reads the request envelope up to end-of-stream, answers −32601, closes. */
function answerRpc(dc: RTCDataChannel): void {
  dc.binaryType = "arraybuffer";
  let buffered: Uint8Array = new Uint8Array(0);
  const envelope: Uint8Array[] = [];
  dc.addEventListener("message", (e: MessageEvent) => {
    buffered = concat(buffered, new Uint8Array(e.data as ArrayBuffer));
    while (buffered.length >= 4) {
      const view = new DataView(buffered.buffer, buffered.byteOffset, buffered.byteLength);
      const length = view.getUint16(0, true);
      const type = view.getUint16(2, true);
      if (buffered.length < 4 + length) return;
      const payload = buffered.subarray(4, 4 + length);
      buffered = buffered.subarray(4 + length);
      if (type === FRAME_BINARY || type === FRAME_CONTINUATION) envelope.push(payload);
      else if (type === FRAME_END) {
        dc.send(concat(frame(FRAME_BINARY, methodNotFound(concat(...envelope))), frame(FRAME_END)) as Uint8Array<ArrayBuffer>);
        const closeWhenSent = () => (dc.bufferedAmount > 0 ? setTimeout(closeWhenSent, 5) : dc.close());
        closeWhenSent();
        return;
      } else {
        dc.close();
        return;
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// The connection (contract sections 1–4).

export interface ConnectOptions {
  /** The server's origin; the page's own by default. */
  baseUrl?: string;
  key?: DeviceKey;
  timeoutMs?: number;
  /** Send the microphone (getUserMedia) as the uplink; otherwise the transceiver sends nothing. */
  microphone?: boolean;
}

interface ServerInfo {
  public_key: string;
  signaling_path: string;
  ice_servers?: Array<{ urls: string[]; username?: string; credential?: string }>;
}

export class BrowserDevice {
  readonly pc: RTCPeerConnection;
  readonly key: DeviceKey;
  readonly events: RTCDataChannel;
  readonly packets: RTCDataChannel;
  readonly serverTiming: string;
  private readonly timeoutMs: number;

  private constructor(
    pc: RTCPeerConnection,
    key: DeviceKey,
    channels: { events: RTCDataChannel; packets: RTCDataChannel },
    serverTiming: string,
    timeoutMs: number,
  ) {
    this.pc = pc;
    this.key = key;
    this.events = channels.events;
    this.packets = channels.packets;
    this.serverTiming = serverTiming;
    this.timeoutMs = timeoutMs;
    // Devices send nothing on the event stream; what arrives is read and dropped.
    this.events.addEventListener("message", () => {});
  }

  /** `/server-info`, the mandatory transceiver and channels, the sealed offer, the answer; resolves once the event stream is open. */
  static async connect(o: ConnectOptions = {}): Promise<BrowserDevice> {
    const baseUrl = (o.baseUrl ?? location.origin).replace(/\/+$/, "");
    const timeoutMs = o.timeoutMs ?? 15_000;
    const key = o.key ?? (await generateDeviceKey());
    const info = (await (await fetch(`${baseUrl}/server-info`)).json()) as ServerInfo;
    const microphone = o.microphone ? (await navigator.mediaDevices.getUserMedia({ audio: true })).getAudioTracks()[0] : undefined;
    const pc = new RTCPeerConnection({ iceServers: info.ice_servers ?? [] });
    try {
      // The server calls `client.*` on stream 0 as soon as the event stream is open (it opens no
      // other stream to a device), so this listens from the start.
      pc.addEventListener("datachannel", (e) => {
        if (e.channel.label === `${SERVICE_PREFIX}${SERVICE_RPC}`) answerRpc(e.channel);
        else e.channel.close();
      });
      pc.addTransceiver(microphone ?? "audio", { direction: "sendrecv" });
      const packets = pc.createDataChannel(PACKET_LABEL, { ordered: false, maxRetransmits: 0 });
      const events = pc.createDataChannel(`${SERVICE_PREFIX}${SERVICE_EVENTS}`);
      packets.binaryType = "arraybuffer";
      events.binaryType = "arraybuffer";
      // ICE is not trickled: the offer carries every candidate, so gathering must be complete.
      const gathered = new Promise<void>((resolve, reject) => {
        // Chromium never completes gathering on a machine whose only interface is loopback.
        const timer = setTimeout(
          () => reject(new Error(`ICE gathering did not complete within ${timeoutMs} ms (no network interface besides loopback?)`)),
          timeoutMs,
        );
        const check = () => {
          if (pc.iceGatheringState !== "complete") return;
          clearTimeout(timer);
          resolve();
        };
        pc.addEventListener("icegatheringstatechange", check);
        check();
      });
      await pc.setLocalDescription(await pc.createOffer());
      await gathered;
      const sealed = await sealOffer(key, info.public_key, pc.localDescription!.sdp);
      const res = await fetch(`${baseUrl}${info.signaling_path ?? SIGNALING_PATH}`, { method: "POST", headers: sealed.headers, body: sealed.body });
      const body = new Uint8Array(await res.arrayBuffer());
      if (res.status !== 200) throw new Error(`offer refused: ${res.status} ${new TextDecoder().decode(body)}`);
      await pc.setRemoteDescription({ type: "answer", sdp: sealed.openAnswer(body) });
      await Promise.all([opened(events, timeoutMs), opened(packets, timeoutMs)]);
      return new BrowserDevice(pc, key, { events, packets }, res.headers.get("server-timing") ?? "", timeoutMs);
    } catch (err) {
      pc.close();
      microphone?.stop();
      throw err;
    }
  }

  /** One HTTP/1.1 exchange on a new service stream (1: Public API, 2: Compatible API), read until the server closes it. */
  async http(service: 1 | 2, method: string, path: string, o: { body?: string; contentType?: string } = {}): Promise<HttpResult> {
    const dc = this.pc.createDataChannel(`${SERVICE_PREFIX}${service}`);
    const response = readUntilClosed(dc, this.timeoutMs);
    response.catch(() => {});
    await opened(dc, this.timeoutMs);
    await writeBytes(dc, requestBytes(method, path, o.body, o.contentType ?? "application/json"));
    return parseResponse(await response);
  }

  /** The `inbound-rtp` report of the downlink audio, once a packet has arrived. */
  async inboundAudio(): Promise<{ packetsReceived: number; bytesReceived: number; packetsLost: number; codec?: string } | undefined> {
    const stats = await this.pc.getStats();
    for (const report of stats.values()) {
      if (report.type !== "inbound-rtp" || report.kind !== "audio") continue;
      const codec = report.codecId ? stats.get(report.codecId)?.mimeType : undefined;
      return { packetsReceived: report.packetsReceived ?? 0, bytesReceived: report.bytesReceived ?? 0, packetsLost: report.packetsLost ?? 0, codec };
    }
    return undefined;
  }

  /** The selected candidate pair, for diagnostics. */
  async selectedPair(): Promise<{ local: string; remote: string } | undefined> {
    const stats = await this.pc.getStats();
    for (const report of stats.values()) {
      if (report.type !== "transport" || !report.selectedCandidatePairId) continue;
      const pair = stats.get(report.selectedCandidatePairId);
      const describe = (id: string) => {
        const c = stats.get(id);
        return c ? `${c.candidateType} ${c.address ?? "?"}:${c.port} ${c.protocol}` : "?";
      };
      return pair ? { local: describe(pair.localCandidateId), remote: describe(pair.remoteCandidateId) } : undefined;
    }
    return undefined;
  }

  close(): void {
    for (const sender of this.pc.getSenders()) sender.track?.stop();
    this.pc.close();
  }
}

// ---------------------------------------------------------------------------------------------
// What the page exposes to the test: plain data in, plain data out (page.evaluate serialises).

let device: BrowserDevice | undefined;

function connected(): BrowserDevice {
  if (!device) throw new Error("not connected");
  return device;
}

export const pageApi = {
  /** Seals with fixed inputs (the contract's vectors) and opens a given answer body. */
  async vector(v: { privateHex: string; serverKey: string; timestamp: string; nonceHex: string; offer: string; answerBodyHex: string }) {
    const key = await importDeviceKey(fromHex(v.privateHex));
    const sealed = await sealOffer(key, v.serverKey, v.offer, { timestamp: v.timestamp, nonce: fromHex(v.nonceHex) });
    return {
      publicKey: key.publicKey,
      sharedHex: toHex(await sharedSecret(key, v.serverKey)),
      headers: sealed.headers,
      derived: sealed.derived,
      bodyHex: toHex(sealed.body),
      answer: sealed.openAnswer(fromHex(v.answerBodyHex)),
    };
  },
  async connect(o: { timeoutMs?: number; microphone?: boolean; baseUrl?: string } = {}) {
    device = await BrowserDevice.connect(o);
    return {
      publicKey: device.key.publicKey,
      serverTiming: device.serverTiming,
      events: device.events.readyState,
      packets: device.packets.readyState,
      offer: device.pc.localDescription!.sdp,
    };
  },
  http: (service: 1 | 2, method: string, path: string, o: { body?: string; contentType?: string } = {}) => connected().http(service, method, path, o),
  inboundAudio: () => connected().inboundAudio(),
  selectedPair: () => connected().selectedPair(),
  state: () => ({ connection: connected().pc.connectionState, events: connected().events.readyState }),
  close() {
    device?.close();
    device = undefined;
  },
};

export type PageApi = typeof pageApi;

if (typeof window !== "undefined") (globalThis as { perchDevice?: PageApi }).perchDevice = pageApi;
