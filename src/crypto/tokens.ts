import { hash, randomBytes } from "node:crypto";
import { base58, base64urlnopad } from "@scure/base";

/** A bearer secret: 32 random bytes, base64url. Only `hashToken` of it is ever stored. */
export function newToken(): string {
  return base64urlnopad.encode(randomBytes(32));
}

/** SHA-256, base64url. The one-shot `hash` costs about a third of a `createHash` object (it runs on every request). */
export function hashToken(token: string): string {
  return hash("sha256", token, "base64url");
}

/**
 * An opaque identifier for stored rows that clients refer to (sessions, device tokens): 16 random
 * bytes in base58, so it never starts with "-" (a command line would read that as an option).
 */
export function newId(): string {
  return base58.encode(randomBytes(16));
}
