import { base58, base64urlnopad } from "@scure/base";

/**
 * The controller's X25519 key, made in the browser and kept in IndexedDB, and the login assertion it
 * signs. Everything here is @noble/curves and @noble/hashes (audited, no dependencies), never
 * WebCrypto: a phone opens the app at the server's LAN address over plain HTTP, which is not a
 * secure context, and there `crypto.subtle` does not exist (`crypto.getRandomValues`, which noble
 * uses for randomness, does). The libraries are a chunk of their own, loaded when pairing.
 */
export interface ControllerKey {
  publicKey: Uint8Array;
  sharedSecret(serverPublicKey: Uint8Array): Promise<Uint8Array>;
}

const DATABASE = "perch";
const KEYS = "keys";
const CONTROLLER = "controller";
/** Where earlier versions kept an exportable key: removed. */
const OLD_STORAGE = "perch.controller-key";

type Stored = { kind: "noble"; secret: Uint8Array };

const noble = () =>
  Promise.all([import("@noble/curves/ed25519.js"), import("@noble/hashes/hmac.js"), import("@noble/hashes/sha2.js"), import("@noble/hashes/utils.js")]).then(
    ([{ x25519 }, { hmac }, { sha256 }, { randomBytes }]) => ({ x25519, hmac, sha256, randomBytes }),
  );

async function fromStored(s: Stored): Promise<ControllerKey> {
  const { x25519 } = await noble();
  return { publicKey: x25519.getPublicKey(s.secret), sharedSecret: async (server) => x25519.getSharedSecret(s.secret, server) };
}

async function create(): Promise<Stored> {
  const { x25519 } = await noble();
  return { kind: "noble", secret: x25519.utils.randomSecretKey() };
}

/** One request on the key store; resolves once its transaction is over. */
function keyStore<T>(mode: IDBTransactionMode, fn: (store: IDBObjectStore) => IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    const open = indexedDB.open(DATABASE, 1);
    open.onupgradeneeded = () => open.result.createObjectStore(KEYS);
    open.onerror = () => reject(open.error);
    open.onsuccess = () => {
      const db = open.result;
      const tx = db.transaction(KEYS, mode);
      const req = fn(tx.objectStore(KEYS));
      tx.oncomplete = () => {
        db.close();
        resolve(req.result);
      };
      tx.onerror = tx.onabort = () => {
        db.close();
        reject(tx.error ?? req.error);
      };
    };
  });
}

function usable(s: unknown): s is Stored {
  const v = s as Partial<{ kind: string; secret: unknown }> | undefined;
  return v?.kind === "noble" && v.secret instanceof Uint8Array && v.secret.length === 32;
}

/**
 * The key this browser pairs with; made on first use. A key an earlier version made with WebCrypto
 * (usable only in a secure context) is replaced: a pairing made with it keeps working, its bearer
 * does not depend on the key. Without IndexedDB (some private modes) the key lasts as long as the page.
 */
export async function controllerKey(): Promise<ControllerKey> {
  localStorage.removeItem(OLD_STORAGE);
  try {
    const found = await keyStore("readonly", (store) => store.get(CONTROLLER));
    if (usable(found)) return fromStored(found);
    const made = await create();
    if (found === undefined) {
      // Another tab may have made one meanwhile: the first one written is everyone's.
      await keyStore("readwrite", (store) => store.add(made, CONTROLLER)).catch(() => {});
    } else {
      await keyStore("readwrite", (store) => store.put(made, CONTROLLER));
    }
    const kept = await keyStore("readonly", (store) => store.get(CONTROLLER));
    return fromStored(usable(kept) ? kept : made);
  } catch {
    return fromStored(await create());
  }
}

export const encodeKey = (raw: Uint8Array): string => base58.encode(raw);
export const decodeKey = (text: string): Uint8Array => base58.decode(text);

const utf8 = new TextEncoder();

/** The `X25519-HS256` login assertion (a JWT MACed with the X25519 shared secret), valid for 60 s from the server's time. */
export async function assertion(key: ControllerKey, serverKey: string, serverTimeMs: number): Promise<string> {
  const { hmac, sha256, randomBytes } = await noble();
  const iat = Math.floor(serverTimeMs / 1000);
  const claims = {
    iss: encodeKey(key.publicKey),
    aud: serverKey,
    iat,
    exp: iat + 60,
    nonce: base64urlnopad.encode(randomBytes(16)),
  };
  const input = `${base64urlnopad.encode(utf8.encode(JSON.stringify({ alg: "X25519-HS256", typ: "JWT" })))}.${base64urlnopad.encode(utf8.encode(JSON.stringify(claims)))}`;
  const mac = hmac(sha256, await key.sharedSecret(decodeKey(serverKey)), utf8.encode(input));
  return `${input}.${base64urlnopad.encode(mac)}`;
}
