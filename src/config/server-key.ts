import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";
import { decodeKey, encodeKey, generateKeyPair, type KeyPair, keyPairFromPrivate } from "../crypto/keys.ts";

/**
 * Loads the server's static X25519 key pair, creating it on first start (mode 0600). The exclusive
 * create means two nodes starting at once on one shared directory end up with the same key.
 */
export function loadOrCreateServerKey(path: string): KeyPair {
  try {
    return readKey(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
  }
  mkdirSync(dirname(path), { recursive: true });
  const pair = generateKeyPair();
  const text = `${JSON.stringify({ private_key: encodeKey(pair.privateKey), public_key: encodeKey(pair.publicKey) })}\n`;
  try {
    writeFileSync(path, text, { mode: 0o600, flag: "wx" });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    return readKey(path);
  }
  return pair;
}

function readKey(path: string): KeyPair {
  const { private_key } = JSON.parse(readFileSync(path, "utf8")) as { private_key: string };
  return keyPairFromPrivate(decodeKey(private_key));
}
