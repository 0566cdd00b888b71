import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from "node:crypto";
import { base64urlnopad } from "@scure/base";

/** The sealed offer of `POST /webrtc/v1/offer`: HKDF-SHA256 keys from the X25519 secret, ChaCha20-Poly1305. */
export const SIGNALING_PATH = "/webrtc/v1/offer";
export const NONCE_BYTES = 16;
const TAG_BYTES = 16;
const INFO = "giznet/gizwebrtc/http-signaling/v1";

export interface SealingKeys {
  requestKey: Buffer;
  responseKey: Buffer;
  requestNonce: Buffer;
  responseNonce: Buffer;
}

export class SealError extends Error {}

function hkdf(shared: Uint8Array, salt: Buffer, info: string, length: number): Buffer {
  return Buffer.from(hkdfSync("sha256", shared, salt, info, length));
}

/** The four derivations of the contract; `timestamp` is the decimal text as sent. */
export function deriveSealingKeys(shared: Uint8Array, nonce: Uint8Array, timestamp: string): SealingKeys {
  const salt = Buffer.concat([nonce, Buffer.from(timestamp, "ascii")]);
  return {
    requestKey: hkdf(shared, salt, `${INFO} c2s`, 32),
    responseKey: hkdf(shared, salt, `${INFO} s2c`, 32),
    requestNonce: hkdf(shared, salt, `${INFO} c2s nonce`, 12),
    responseNonce: hkdf(shared, salt, `${INFO} s2c nonce`, 12),
  };
}

/** The AAD lines: method, path, key, timestamp, nonce text (and `answer` for the response). */
export function sealingAad(publicKey: string, timestamp: string, nonceText: string, response: boolean): Buffer {
  const lines = ["POST", SIGNALING_PATH, publicKey, timestamp, nonceText];
  if (response) lines.push("answer");
  return Buffer.from(lines.join("\n"), "utf8");
}

function seal(key: Buffer, nonce: Buffer, aad: Buffer, plaintext: Uint8Array): Buffer {
  const cipher = createCipheriv("chacha20-poly1305", key, nonce, { authTagLength: TAG_BYTES });
  cipher.setAAD(aad, { plaintextLength: plaintext.length });
  return Buffer.concat([cipher.update(plaintext), cipher.final(), cipher.getAuthTag()]);
}

function open(key: Buffer, nonce: Buffer, aad: Buffer, body: Uint8Array): Buffer {
  if (body.length < TAG_BYTES) throw new SealError("body shorter than the tag");
  const data = body.subarray(0, body.length - TAG_BYTES);
  const decipher = createDecipheriv("chacha20-poly1305", key, nonce, { authTagLength: TAG_BYTES });
  decipher.setAAD(aad, { plaintextLength: data.length });
  decipher.setAuthTag(body.subarray(body.length - TAG_BYTES));
  try {
    return Buffer.concat([decipher.update(data), decipher.final()]);
  } catch {
    throw new SealError("authentication failed");
  }
}

/** One sealed exchange, as both sides see it: the request's key, timestamp and nonce bind everything. */
export class SealedExchange {
  readonly keys: SealingKeys;
  readonly publicKey: string;
  readonly timestamp: string;
  readonly nonceText: string;

  constructor(shared: Uint8Array, publicKey: string, timestamp: string, nonceText: string, nonce: Uint8Array) {
    this.keys = deriveSealingKeys(shared, nonce, timestamp);
    this.publicKey = publicKey;
    this.timestamp = timestamp;
    this.nonceText = nonceText;
  }

  /** A fresh exchange for a device: a random nonce and the given time (Unix seconds). */
  static create(shared: Uint8Array, publicKey: string, nowSeconds: number): SealedExchange {
    const nonce = randomBytes(NONCE_BYTES);
    return new SealedExchange(shared, publicKey, String(nowSeconds), base64urlnopad.encode(nonce), nonce);
  }

  sealRequest(offerSdp: string): Buffer {
    return seal(this.keys.requestKey, this.keys.requestNonce, sealingAad(this.publicKey, this.timestamp, this.nonceText, false), Buffer.from(offerSdp, "utf8"));
  }

  openRequest(body: Uint8Array): string {
    return utf8(open(this.keys.requestKey, this.keys.requestNonce, sealingAad(this.publicKey, this.timestamp, this.nonceText, false), body));
  }

  sealResponse(answerSdp: string): Buffer {
    return seal(
      this.keys.responseKey,
      this.keys.responseNonce,
      sealingAad(this.publicKey, this.timestamp, this.nonceText, true),
      Buffer.from(answerSdp, "utf8"),
    );
  }

  openResponse(body: Uint8Array): string {
    return utf8(open(this.keys.responseKey, this.keys.responseNonce, sealingAad(this.publicKey, this.timestamp, this.nonceText, true), body));
  }

  /** The request headers besides Content-Type. */
  headers(): Record<string, string> {
    return { "X-Giznet-Public-Key": this.publicKey, "X-Giznet-Timestamp": this.timestamp, "X-Giznet-Nonce": this.nonceText };
  }
}

const decoder = new TextDecoder("utf-8", { fatal: true });

function utf8(bytes: Buffer): string {
  try {
    return decoder.decode(bytes);
  } catch {
    throw new SealError("plaintext is not UTF-8");
  }
}

/** The 16 nonce bytes of an `X-Giznet-Nonce` header, or null when it is not exactly that in base64url without padding. */
export function parseNonce(text: string | undefined): Uint8Array | null {
  if (!text || !/^[A-Za-z0-9_-]{22}$/.test(text)) return null;
  try {
    const bytes = base64urlnopad.decode(text);
    return bytes.length === NONCE_BYTES ? bytes : null;
  } catch {
    return null;
  }
}
