import wrtc from "@roamhq/wrtc";
import { decodeKey, encodeKey, generateKeyPair, type KeyPair, privateKeyObject, sharedSecret } from "../../src/crypto/keys.ts";
import { SealedExchange } from "../../src/crypto/sealed-offer.ts";
import { type ConnectOptions, PerchConnection } from "../../src/sdk/webrtc.ts";
import type { Answerer, PeerLink } from "../../src/transport/answerer.ts";
import { inspectOffer } from "../../src/transport/sdp.ts";
import type { TestServer } from "./server.ts";

/** `pc`'s offer with every candidate gathered (no trickle), set as its local description. */
export async function gatheredOffer(pc: RTCPeerConnection): Promise<string> {
  const gathered = new Promise<void>((resolve) => pc.addEventListener("icegatheringstatechange", () => pc.iceGatheringState === "complete" && resolve()));
  await pc.setLocalDescription(await pc.createOffer());
  await gathered;
  return pc.localDescription!.sdp;
}

/** A real offer SDP from libwebrtc: a sendrecv audio transceiver and a DataChannel. */
export async function realOfferSdp(): Promise<string> {
  const pc = new wrtc.RTCPeerConnection({ iceServers: [] });
  try {
    pc.addTransceiver("audio", { direction: "sendrecv" });
    pc.createDataChannel("giznet/v1/packet");
    return await gatheredOffer(pc);
  } finally {
    pc.close();
  }
}

/**
 * `pc`'s offer answered by a real `Answerer` (checked as the offer route checks it); `setup` sees
 * the link before `pc` takes the answer. `o.from` is the address the offer comes from (a function
 * of the offer to pick one of its own), `o.edit` changes what the server is given (not `pc`'s own
 * description).
 */
export async function answeredBy(
  answerer: Answerer,
  pc: RTCPeerConnection,
  setup: (link: PeerLink) => void = () => {},
  o: { from?: string | ((offer: string) => string); edit?: (offer: string) => string } = {},
): Promise<PeerLink> {
  const offer = await gatheredOffer(pc);
  const sdp = o.edit ? o.edit(offer) : offer;
  const shape = inspectOffer(sdp);
  if ("code" in shape) throw new Error(shape.message);
  const from = typeof o.from === "function" ? o.from(offer) : o.from;
  const link = await answerer.answer({ sdp, ...shape, from });
  setup(link);
  await pc.setRemoteDescription({ type: "answer", sdp: link.answer });
  return link;
}

export interface SealedRequest {
  exchange: SealedExchange;
  headers: Record<string, string>;
  body: Uint8Array<ArrayBuffer>;
}

/** Seals `sdp` for the server as a device with `keyPair` would. */
export function sealOffer(serverKey: string, keyPair: KeyPair, sdp: string, nowSeconds = Math.floor(Date.now() / 1000)): SealedRequest {
  const shared = sharedSecret(privateKeyObject(keyPair.privateKey), decodeKey(serverKey));
  const exchange = SealedExchange.create(shared, encodeKey(keyPair.publicKey), nowSeconds);
  return { exchange, headers: { "content-type": "application/octet-stream", ...exchange.headers() }, body: new Uint8Array(exchange.sealRequest(sdp)) };
}

export function postOffer(url: string, headers: Record<string, string>, body: Uint8Array<ArrayBuffer>): Promise<Response> {
  return fetch(`${url}/webrtc/v1/offer`, { method: "POST", headers, body });
}

/** Connects a device SDK client (node-datachannel, unless `rtc` is given) to a test server. */
export function connect(server: TestServer | { url: string }, o: Partial<ConnectOptions> = {}): Promise<PerchConnection> {
  return PerchConnection.connect({ baseUrl: server.url, keyPair: o.keyPair ?? generateKeyPair(), ...o });
}

/** Polls `fn` until it returns a truthy value (or throws after `ms`). */
export async function eventually<T>(fn: () => Promise<T | undefined | false> | T | undefined | false, ms = 5000, what = "condition"): Promise<T> {
  const until = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** `promise`, or a failure naming `what` after `ms`: a wait that would hang the file fails the test instead. */
export async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}
