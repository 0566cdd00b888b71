import { createHmac, type KeyObject, randomBytes, timingSafeEqual } from "node:crypto";
import { base64urlnopad } from "@scure/base";
import { isStorableText, STORABLE_TEXT_MESSAGE } from "../protocol/text.ts";
import { encodeKey } from "./keys.ts";

/** The `X25519-HS256` login assertion: a JWT-shaped token MACed with the X25519 shared secret. */
export const ASSERTION_ALG = "X25519-HS256";
export const MAX_CLOCK_SKEW_S = 60;
export const MAX_LIFETIME_S = 300;

export interface AssertionClaims {
  iss: string;
  aud: string;
  iat: number;
  exp: number;
  nonce: string;
}

const textEncoder = new TextEncoder();
const textDecoder = new TextDecoder("utf-8", { fatal: true });

/** The MAC key: the raw shared secret, or a secret KeyObject made from it (much cheaper to reuse). */
export type MacKey = Uint8Array | KeyObject;

function mac(secret: MacKey, signingInput: string): Buffer {
  return createHmac("sha256", secret).update(signingInput).digest();
}

export interface BuildAssertionOptions {
  clientPublicKey: Uint8Array;
  serverPublicKey: Uint8Array;
  /** X25519(client private, server public). */
  sharedSecret: Uint8Array;
  /** Unix seconds. */
  now: number;
  lifetimeSeconds?: number;
  nonce?: string;
}

export function buildAssertion(o: BuildAssertionOptions): string {
  const claims: AssertionClaims = {
    iss: encodeKey(o.clientPublicKey),
    aud: encodeKey(o.serverPublicKey),
    iat: o.now,
    exp: o.now + (o.lifetimeSeconds ?? 60),
    nonce: o.nonce ?? base64urlnopad.encode(randomBytes(16)),
  };
  return signAssertion(JSON.stringify({ alg: ASSERTION_ALG, typ: "JWT" }), JSON.stringify(claims), o.sharedSecret);
}

/** Signs already-serialised header and claims JSON (the vectors fix their exact text). */
export function signAssertion(headerJson: string, claimsJson: string, sharedSecret: Uint8Array): string {
  const signingInput = `${base64urlnopad.encode(textEncoder.encode(headerJson))}.${base64urlnopad.encode(textEncoder.encode(claimsJson))}`;
  return `${signingInput}.${base64urlnopad.encode(mac(sharedSecret, signingInput))}`;
}

export class AssertionError extends Error {}

function decodeJsonObject(part: string): Record<string, unknown> {
  let value: unknown;
  try {
    value = JSON.parse(textDecoder.decode(base64urlnopad.decode(part)));
  } catch {
    throw new AssertionError("part is not base64url JSON");
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw new AssertionError("part is not a JSON object");
  return value as Record<string, unknown>;
}

/** The claims as sent, before any check: the server needs `iss`'s shared secret to verify the MAC. */
export interface ParsedAssertion {
  signingInput: string;
  mac: Uint8Array;
  claims: AssertionClaims;
}

export function parseAssertion(token: string): ParsedAssertion {
  const parts = token.split(".");
  if (parts.length !== 3) throw new AssertionError("not three parts");
  const [h, c, m] = parts as [string, string, string];
  const header = decodeJsonObject(h);
  if (header.alg !== ASSERTION_ALG || header.typ !== "JWT") throw new AssertionError("wrong alg or typ");
  const claims = decodeJsonObject(c);
  const { iss, aud, iat, exp, nonce } = claims;
  if (typeof iss !== "string" || typeof aud !== "string") throw new AssertionError("iss and aud must be strings");
  if (!Number.isInteger(iat) || !Number.isInteger(exp)) throw new AssertionError("iat and exp must be integers");
  if (typeof nonce !== "string" || nonce.length === 0) throw new AssertionError("nonce must be a non-empty string");
  // The nonce is stored (replay protection): bounded, and text both databases keep as sent.
  if (nonce.length > MAX_NONCE_LENGTH) throw new AssertionError(`nonce is longer than ${MAX_NONCE_LENGTH} characters`);
  if (!isStorableText(nonce)) throw new AssertionError(`nonce ${STORABLE_TEXT_MESSAGE}`);
  let macBytes: Uint8Array;
  try {
    macBytes = base64urlnopad.decode(m);
  } catch {
    throw new AssertionError("mac is not base64url");
  }
  return { signingInput: `${h}.${c}`, mac: macBytes, claims: { iss, aud, iat: iat as number, exp: exp as number, nonce } };
}

/** Normally 22 characters (base64url of 16 bytes). */
export const MAX_NONCE_LENGTH = 256;

export interface VerifyExpectations {
  /** Canonical base58 of the caller's key (from `X-Public-Key`). */
  issuer: string;
  /** Canonical base58 of the server key. */
  audience: string;
  /** Unix seconds. */
  now: number;
  sharedSecret: MacKey;
}

/** Checks everything but replay (the store decides that). Returns the verified claims. */
export function verifyAssertion(parsed: ParsedAssertion, e: VerifyExpectations): AssertionClaims {
  const { claims } = parsed;
  if (claims.iss !== e.issuer) throw new AssertionError("iss does not match X-Public-Key");
  if (claims.aud !== e.audience) throw new AssertionError("aud is not this server");
  if (claims.iat > e.now + MAX_CLOCK_SKEW_S) throw new AssertionError("issued in the future");
  if (claims.exp <= e.now) throw new AssertionError("expired");
  if (claims.exp - claims.iat > MAX_LIFETIME_S) throw new AssertionError("lifetime too long");
  const expected = mac(e.sharedSecret, parsed.signingInput);
  if (parsed.mac.length !== expected.length || !timingSafeEqual(parsed.mac, expected)) throw new AssertionError("bad mac");
  return claims;
}
