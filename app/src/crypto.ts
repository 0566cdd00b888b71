import { base58, base64urlnopad } from "@scure/base";

/**
 * The controller's X25519 key, made in the browser and kept in IndexedDB: with WebCrypto's X25519 a
 * non-extractable private key (script in this page can use it, never read it out), else a
 * @noble/curves secret (loaded only then). Only the raw shared secret with the server's key ever
 * leaves this module, to MAC a login assertion.
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

type Stored = { kind: "webcrypto"; privateKey: CryptoKey; publicKey: Uint8Array } | { kind: "noble"; secret: Uint8Array };

async function fromStored(s: Stored): Promise<ControllerKey> {
  if (s.kind === "webcrypto") {
    return {
      publicKey: s.publicKey,
      sharedSecret: async (server) => {
        const publicKey = await crypto.subtle.importKey("raw", server as Uint8Array<ArrayBuffer>, { name: "X25519" }, false, []);
        return new Uint8Array(await crypto.subtle.deriveBits({ name: "X25519", public: publicKey }, s.privateKey, 256));
      },
    };
  }
  const { x25519 } = await import("@noble/curves/ed25519.js");
  return { publicKey: x25519.getPublicKey(s.secret), sharedSecret: async (server) => x25519.getSharedSecret(s.secret, server) };
}

async function create(): Promise<Stored> {
  try {
    const pair = (await crypto.subtle.generateKey({ name: "X25519" }, false, ["deriveBits"])) as CryptoKeyPair;
    return { kind: "webcrypto", privateKey: pair.privateKey, publicKey: new Uint8Array(await crypto.subtle.exportKey("raw", pair.publicKey)) };
  } catch {
    // No X25519 in this browser's WebCrypto.
    const { x25519 } = await import("@noble/curves/ed25519.js");
    return { kind: "noble", secret: x25519.utils.randomSecretKey() };
  }
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
  const v = s as Partial<{ kind: string; privateKey: unknown; publicKey: unknown; secret: unknown }> | undefined;
  return (
    (v?.kind === "webcrypto" && v.privateKey instanceof CryptoKey && v.publicKey instanceof Uint8Array) ||
    (v?.kind === "noble" && v.secret instanceof Uint8Array)
  );
}

/** The key this browser pairs with; made on first use. Without IndexedDB (some private modes) it lasts as long as the page. */
export async function controllerKey(): Promise<ControllerKey> {
  localStorage.removeItem(OLD_STORAGE);
  try {
    const found = await keyStore("readonly", (store) => store.get(CONTROLLER));
    if (usable(found)) return fromStored(found);
    const made = await create();
    // Another tab may have made one meanwhile: the first one written is everyone's.
    await keyStore("readwrite", (store) => store.add(made, CONTROLLER)).catch(() => {});
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
  const iat = Math.floor(serverTimeMs / 1000);
  const claims = {
    iss: encodeKey(key.publicKey),
    aud: serverKey,
    iat,
    exp: iat + 60,
    nonce: base64urlnopad.encode(crypto.getRandomValues(new Uint8Array(16))),
  };
  const input = `${base64urlnopad.encode(utf8.encode(JSON.stringify({ alg: "X25519-HS256", typ: "JWT" })))}.${base64urlnopad.encode(utf8.encode(JSON.stringify(claims)))}`;
  const secret = await key.sharedSecret(decodeKey(serverKey));
  const macKey = await crypto.subtle.importKey("raw", secret as Uint8Array<ArrayBuffer>, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const mac = new Uint8Array(await crypto.subtle.sign("HMAC", macKey, utf8.encode(input)));
  return `${input}.${base64urlnopad.encode(mac)}`;
}
