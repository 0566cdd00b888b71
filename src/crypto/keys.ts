import { createPrivateKey, createPublicKey, diffieHellman, generateKeyPairSync, type KeyObject } from "node:crypto";
import { base58, base64urlnopad } from "@scure/base";

/** An X25519 key pair; `publicKey` is the 32-byte raw public key. */
export interface KeyPair {
  privateKey: Uint8Array;
  publicKey: Uint8Array;
}

// DER prefixes that wrap a raw 32-byte X25519 key as PKCS#8 / SPKI, so node:crypto can import it.
const PKCS8_PREFIX = Buffer.from("302e020100300506032b656e04220420", "hex");
const SPKI_PREFIX = Buffer.from("302a300506032b656e032100", "hex");

export class InvalidKeyError extends Error {}

export function encodeKey(raw: Uint8Array): string {
  return base58.encode(raw);
}

/**
 * Whether 32 little-endian bytes are a canonical X25519 public key: top bit clear and the value
 * below 2^255 − 19. X25519 ignores the top bit and reduces modulo p, so any other encoding names
 * the same point as a canonical one and would be a second identity for one private key.
 */
export function isCanonicalKey(raw: Uint8Array): boolean {
  if (raw.length !== 32 || (raw[31]! & 0x80) !== 0) return false;
  // p = 2^255 − 19 is ed ff … ff 7f (little-endian): only values from p to 2^255 − 1 remain to refuse.
  if (raw[31] !== 0x7f || raw[0]! < 0xed) return true;
  for (let i = 1; i < 31; i++) if (raw[i] !== 0xff) return true;
  return false;
}

/** Parses the text form of a private key: base58 (Bitcoin alphabet), trimmed, exactly 32 bytes. */
export function decodePrivateKey(text: string): Uint8Array {
  let raw: Uint8Array;
  try {
    raw = base58.decode(text.trim());
  } catch {
    throw new InvalidKeyError("not base58");
  }
  if (raw.length !== 32) throw new InvalidKeyError("not 32 bytes");
  return raw;
}

/** Parses the text form of a public key: as a private key, and canonical. */
export function decodeKey(text: string): Uint8Array {
  const raw = decodePrivateKey(text);
  if (!isCanonicalKey(raw)) throw new InvalidKeyError("not a canonical X25519 public key");
  return raw;
}

/** The canonical text form of a key, or null when `text` is not a valid key. */
export function canonicalKey(text: string | undefined | null): string | null {
  if (!text) return null;
  try {
    return encodeKey(decodeKey(text));
  } catch {
    return null;
  }
}

export function privateKeyObject(raw: Uint8Array): KeyObject {
  return createPrivateKey({ key: Buffer.concat([PKCS8_PREFIX, raw]), format: "der", type: "pkcs8" });
}

export function publicKeyObject(raw: Uint8Array): KeyObject {
  return createPublicKey({ key: Buffer.concat([SPKI_PREFIX, raw]), format: "der", type: "spki" });
}

export function publicKeyOf(privateKey: Uint8Array): Uint8Array {
  const jwk = createPublicKey(privateKeyObject(privateKey)).export({ format: "jwk" });
  return base64urlnopad.decode(jwk.x as string);
}

export function generateKeyPair(): KeyPair {
  const { privateKey } = generateKeyPairSync("x25519");
  const jwk = privateKey.export({ format: "jwk" });
  return { privateKey: base64urlnopad.decode(jwk.d as string), publicKey: base64urlnopad.decode(jwk.x as string) };
}

export function keyPairFromPrivate(privateKey: Uint8Array): KeyPair {
  return { privateKey, publicKey: publicKeyOf(privateKey) };
}

/** X25519(own private, other public). An all-zero result (a low-order public key) is rejected. */
export function sharedSecret(own: KeyObject, otherPublic: Uint8Array): Uint8Array {
  let secret: Buffer;
  try {
    secret = diffieHellman({ privateKey: own, publicKey: publicKeyObject(otherPublic) });
  } catch {
    throw new InvalidKeyError("key agreement failed");
  }
  if (secret.every((b) => b === 0)) throw new InvalidKeyError("all-zero shared secret");
  return secret;
}
