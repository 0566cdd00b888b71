import { randomBytes } from "node:crypto";
import { linkSync, mkdirSync, readFileSync, unlinkSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";
import { decodePrivateKey, encodeKey, generateKeyPair, type KeyPair, keyPairFromPrivate } from "../crypto/keys.ts";

/**
 * Loads the server's static X25519 key pair, creating it on first start (mode 0600). The key is
 * written to a private temporary file and then hard-linked into place, which fails when the file
 * exists: two nodes starting at once on one shared directory end up with the same key, and
 * neither ever reads a half-written file.
 */
export function loadOrCreateServerKey(path: string): KeyPair {
  try {
    return readKey(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
  }
  mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
  const pair = generateKeyPair();
  const text = `${JSON.stringify({ private_key: encodeKey(pair.privateKey), public_key: encodeKey(pair.publicKey) })}\n`;
  const temp = `${path}.${process.pid}.${randomBytes(6).toString("hex")}.tmp`;
  writeFileSync(temp, text, { mode: 0o600, flag: "wx" });
  try {
    linkSync(temp, path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    return readKey(path);
  } finally {
    unlinkSync(temp);
  }
  return pair;
}

function readKey(path: string): KeyPair {
  const { private_key } = JSON.parse(readFileSync(path, "utf8")) as { private_key: string };
  return keyPairFromPrivate(decodePrivateKey(private_key));
}
