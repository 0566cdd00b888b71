import { createHash, randomBytes } from "node:crypto";
import { base58, base64urlnopad } from "@scure/base";

/** A bearer secret: 32 random bytes, base64url. Only `hashToken` of it is ever stored. */
export function newToken(): string {
  return base64urlnopad.encode(randomBytes(32));
}

export function hashToken(token: string): string {
  return createHash("sha256").update(token).digest("base64url");
}

/**
 * An opaque identifier for stored rows that clients refer to (sessions, device tokens): 16 random
 * bytes in base58, so it never starts with "-" (a command line would read that as an option).
 */
export function newId(): string {
  return base58.encode(randomBytes(16));
}
