import { base58, base64urlnopad } from "@scure/base";

/**
 * The controller's X25519 key, made in the browser and kept in local storage: WebCrypto where the
 * browser has X25519, else @noble/curves (loaded only then). Only the raw shared secret with the
 * server's key ever leaves this module, to MAC a login assertion.
 */
export interface ControllerKey {
  publicKey: Uint8Array;
  sharedSecret(serverPublicKey: Uint8Array): Promise<Uint8Array>;
}

const STORAGE = "perch.controller-key";

type Stored = { kind: "webcrypto"; jwk: JsonWebKey } | { kind: "noble"; secret: string };

async function fromStored(s: Stored): Promise<ControllerKey> {
  if (s.kind === "webcrypto") {
    const privateKey = await crypto.subtle.importKey("jwk", s.jwk, { name: "X25519" }, false, ["deriveBits"]);
    return {
      publicKey: base64urlnopad.decode(s.jwk.x ?? ""),
      sharedSecret: async (server) => {
        const publicKey = await crypto.subtle.importKey("raw", server as Uint8Array<ArrayBuffer>, { name: "X25519" }, false, []);
        return new Uint8Array(await crypto.subtle.deriveBits({ name: "X25519", public: publicKey }, privateKey, 256));
      },
    };
  }
  const { x25519 } = await import("@noble/curves/ed25519.js");
  const secret = base64urlnopad.decode(s.secret);
  return { publicKey: x25519.getPublicKey(secret), sharedSecret: async (server) => x25519.getSharedSecret(secret, server) };
}

async function create(): Promise<Stored> {
  try {
    const pair = (await crypto.subtle.generateKey({ name: "X25519" }, true, ["deriveBits"])) as CryptoKeyPair;
    return { kind: "webcrypto", jwk: await crypto.subtle.exportKey("jwk", pair.privateKey) };
  } catch {
    // No X25519 in this browser's WebCrypto.
    const { x25519 } = await import("@noble/curves/ed25519.js");
    return { kind: "noble", secret: base64urlnopad.encode(x25519.utils.randomSecretKey()) };
  }
}

/** The key this browser pairs with; made on first use. */
export async function controllerKey(): Promise<ControllerKey> {
  const text = localStorage.getItem(STORAGE);
  if (text) {
    try {
      return await fromStored(JSON.parse(text) as Stored);
    } catch {
      // Unreadable (another browser's format): replaced below.
    }
  }
  const stored = await create();
  localStorage.setItem(STORAGE, JSON.stringify(stored));
  return fromStored(stored);
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
