import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { base58, base64urlnopad } from "@scure/base";
import {
  ASSERTION_ALG,
  AssertionError,
  buildAssertion,
  type ParsedAssertion,
  parseAssertion,
  signAssertion,
  type VerifyExpectations,
  verifyAssertion,
} from "../src/crypto/assertion.ts";
import {
  canonicalKey,
  decodeKey,
  encodeKey,
  generateKeyPair,
  InvalidKeyError,
  keyPairFromPrivate,
  privateKeyObject,
  publicKeyOf,
  sharedSecret,
} from "../src/crypto/keys.ts";
import { hashToken, newId, newToken } from "../src/crypto/tokens.ts";
import vectors from "./support/vectors.json" with { type: "json" };

// The contract's test vectors: "keys" and "login_assertion".
const K = vectors.keys;
const A = vectors.login_assertion;

const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");
const fromHex = (h: string) => new Uint8Array(Buffer.from(h, "hex"));
const b64 = (s: string) => base64urlnopad.encode(new TextEncoder().encode(s));

const clientPrivate = fromHex(K.client_private_hex);
const serverPrivate = fromHex(K.server_private_hex);
const shared = fromHex(K.shared_secret_hex);
const IAT = 1700000000;
const HEADER = A.header_json;

function expectations(over: Partial<VerifyExpectations> = {}): VerifyExpectations {
  return { issuer: K.client_public_base58, audience: K.server_public_base58, now: IAT, sharedSecret: shared, ...over };
}

function claimsJson(over: Record<string, unknown> = {}, drop: string[] = []): string {
  const c: Record<string, unknown> = { ...(JSON.parse(A.claims_json) as Record<string, unknown>), ...over };
  for (const k of drop) delete c[k];
  return JSON.stringify(c);
}

/** Parses and verifies; returns the AssertionError's message, or "ok". */
function outcome(token: string, over: Partial<VerifyExpectations> = {}): string {
  try {
    verifyAssertion(parseAssertion(token), expectations(over));
    return "ok";
  } catch (err) {
    assert.ok(err instanceof AssertionError, `expected an AssertionError, got ${String(err)}`);
    return err.message;
  }
}

/** A token over arbitrary header/claims text, MACed correctly with the vector secret. */
const signed = (claims: string, header = HEADER) => signAssertion(header, claims, shared);

describe("keys (vectors)", () => {
  test("private → public, client and server", () => {
    assert.equal(hex(publicKeyOf(clientPrivate)), K.client_public_hex);
    assert.equal(hex(publicKeyOf(serverPrivate)), K.server_public_hex);
    assert.equal(hex(keyPairFromPrivate(serverPrivate).publicKey), K.server_public_hex);
  });

  test("base58 text forms", () => {
    assert.equal(encodeKey(fromHex(K.client_public_hex)), K.client_public_base58);
    assert.equal(encodeKey(fromHex(K.server_public_hex)), K.server_public_base58);
    assert.equal(hex(decodeKey(K.client_public_base58)), K.client_public_hex);
    assert.equal(hex(decodeKey(K.server_public_base58)), K.server_public_hex);
  });

  test("shared secret is the same from both sides", () => {
    assert.equal(hex(sharedSecret(privateKeyObject(clientPrivate), fromHex(K.server_public_hex))), K.shared_secret_hex);
    assert.equal(hex(sharedSecret(privateKeyObject(serverPrivate), fromHex(K.client_public_hex))), K.shared_secret_hex);
  });
});

describe("decodeKey / canonicalKey", () => {
  test("trims white space", () => {
    assert.equal(hex(decodeKey(`  \t${K.client_public_base58}\n `)), K.client_public_hex);
    assert.equal(canonicalKey(`\r\n ${K.server_public_base58} \t`), K.server_public_base58);
  });

  test("leading zero bytes are leading '1's and round-trip", () => {
    const raw = new Uint8Array(32);
    raw[3] = 7;
    raw[31] = 0x7f;
    const text = encodeKey(raw);
    assert.ok(text.startsWith("111"), text);
    assert.ok(!text.startsWith("1111"), text);
    assert.deepEqual(decodeKey(text), raw);
    assert.equal(canonicalKey(text), text);
    const zeros = new Uint8Array(32);
    assert.equal(encodeKey(zeros), "1".repeat(32));
    assert.deepEqual(decodeKey("1".repeat(32)), zeros);
  });

  test("rejects wrong lengths", () => {
    for (const len of [0, 1, 31, 33, 64]) {
      const text = base58.encode(new Uint8Array(len).fill(9));
      assert.throws(() => decodeKey(text), InvalidKeyError, `length ${len}`);
      assert.equal(canonicalKey(text), null);
    }
    // An extra leading '1' is an extra zero byte: 33 bytes.
    assert.throws(() => decodeKey(`1${K.client_public_base58}`), InvalidKeyError);
    assert.equal(canonicalKey(""), null);
    assert.equal(canonicalKey("   "), null);
    assert.equal(canonicalKey(undefined), null);
    assert.equal(canonicalKey(null), null);
  });

  test("rejects characters outside the Bitcoin alphabet", () => {
    const k = K.client_public_base58;
    for (const bad of ["0", "O", "I", "l", "+", "/", "=", "-", "_", "é"]) {
      const text = `${k.slice(0, 10)}${bad}${k.slice(11)}`;
      assert.throws(() => decodeKey(text), InvalidKeyError, `char ${bad}`);
      assert.equal(canonicalKey(text), null);
    }
    // White space inside the key is not trimmed away.
    assert.throws(() => decodeKey(`${k.slice(0, 10)} ${k.slice(10)}`), InvalidKeyError);
  });

  test("sharedSecret rejects low-order points with InvalidKeyError", () => {
    const own = privateKeyObject(serverPrivate);
    const u = (n: bigint) => {
      const b = new Uint8Array(32);
      for (let i = 0; i < 32; i++) b[i] = Number((n >> BigInt(8 * i)) & 0xffn);
      return b;
    };
    const p = 2n ** 255n - 19n;
    const lowOrder = [
      new Uint8Array(32), // u = 0
      u(1n),
      u(p - 1n),
      u(p), // non-canonical 0
      u(p + 1n), // non-canonical 1
      fromHex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"), // order 8
      fromHex("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"), // order 8
    ];
    for (const point of lowOrder) assert.throws(() => sharedSecret(own, point), InvalidKeyError, hex(point));
    // A wrong-length public key is refused the same way.
    assert.throws(() => sharedSecret(own, new Uint8Array(31).fill(5)), InvalidKeyError);
    // A generated key still works.
    const pair = generateKeyPair();
    assert.deepEqual(sharedSecret(own, pair.publicKey), sharedSecret(privateKeyObject(pair.privateKey), fromHex(K.server_public_hex)));
  });
});

describe("login assertion (vectors)", () => {
  test("signAssertion(header_json, claims_json, shared) is the vector token", () => {
    assert.equal(signAssertion(A.header_json, A.claims_json, shared), A.token);
  });

  test("the vector token verifies for now in [iat, exp)", () => {
    for (const now of [IAT, IAT + 1, IAT + 30, IAT + 59]) assert.equal(outcome(A.token, { now }), "ok", `now ${now}`);
    const claims = verifyAssertion(parseAssertion(A.token), expectations());
    assert.deepEqual(claims, JSON.parse(A.claims_json));
  });

  test("expired at exp", () => {
    assert.equal(outcome(A.token, { now: IAT + 60 }), "expired");
    assert.equal(outcome(A.token, { now: IAT + 3600 }), "expired");
  });

  test("iat at most 60 s in the future", () => {
    assert.equal(outcome(A.token, { now: IAT - 60 }), "ok");
    assert.equal(outcome(A.token, { now: IAT - 61 }), "issued in the future");
    const future = signed(claimsJson({ iat: IAT + 61, exp: IAT + 120 }));
    assert.equal(outcome(future), "issued in the future");
    assert.equal(outcome(signed(claimsJson({ iat: IAT + 60, exp: IAT + 120 }))), "ok");
  });

  test("lifetime exp - iat at most 300 s", () => {
    assert.equal(outcome(signed(claimsJson({ exp: IAT + 300 }))), "ok");
    assert.equal(outcome(signed(claimsJson({ exp: IAT + 301 }))), "lifetime too long");
    assert.equal(outcome(signed(claimsJson({ iat: IAT - 250, exp: IAT + 51 }))), "lifetime too long");
  });

  test("wrong aud", () => {
    const other = encodeKey(generateKeyPair().publicKey);
    assert.equal(outcome(A.token, { audience: other }), "aud is not this server");
    assert.equal(outcome(signed(claimsJson({ aud: other }))), "aud is not this server");
    // Not canonical text (padded with spaces) is not the server key either.
    assert.equal(outcome(signed(claimsJson({ aud: ` ${K.server_public_base58}` }))), "aud is not this server");
  });

  test("iss must equal the caller key", () => {
    assert.equal(outcome(A.token, { issuer: K.server_public_base58 }), "iss does not match X-Public-Key");
    assert.equal(outcome(signed(claimsJson({ iss: `${K.client_public_base58} ` }))), "iss does not match X-Public-Key");
    assert.equal(outcome(signed(claimsJson({ iss: 42 }))), "iss and aud must be strings");
    assert.equal(outcome(signed(claimsJson({}, ["aud"]))), "iss and aud must be strings");
  });

  test("tampered MAC", () => {
    const [h, c, m] = A.token.split(".") as [string, string, string];
    const mac = base64urlnopad.decode(m);
    mac[0] = (mac[0] ?? 0) ^ 1;
    assert.equal(outcome(`${h}.${c}.${base64urlnopad.encode(mac)}`), "bad mac");
    assert.equal(outcome(`${h}.${c}.${base64urlnopad.encode(mac.slice(0, 31))}`), "bad mac");
    assert.equal(outcome(`${h}.${c}.`), "bad mac");
    // The right claims MACed with another secret.
    assert.equal(outcome(signAssertion(HEADER, A.claims_json, new Uint8Array(32).fill(1))), "bad mac");
    // The vector token checked against another secret.
    assert.equal(outcome(A.token, { sharedSecret: new Uint8Array(32).fill(1) }), "bad mac");
  });

  test("tampered claims or header keep the old MAC and fail", () => {
    const [h, , m] = A.token.split(".") as [string, string, string];
    assert.equal(outcome(`${h}.${b64(claimsJson({ nonce: "YWFhYWFhYWFhYWFhYWFhYg" }))}.${m}`), "bad mac");
    assert.equal(outcome(`${h}.${b64(claimsJson({ exp: IAT + 59 }))}.${m}`), "bad mac");
    // Same claims, other spacing: the MAC is over the received text, so it no longer matches.
    assert.equal(outcome(`${h}.${b64(JSON.stringify(JSON.parse(A.claims_json), null, 1))}.${m}`), "bad mac");
    const [, c] = A.token.split(".") as [string, string];
    assert.equal(outcome(`${b64('{"typ":"JWT","alg":"X25519-HS256"}')}.${c}.${m}`), "bad mac");
  });

  test("parts must be strict base64url without padding", () => {
    const [h, c, m] = A.token.split(".") as [string, string, string];
    const notParsed = (token: string) => assert.throws(() => parseAssertion(token), AssertionError, token);
    notParsed(`${h}=.${c}.${m}`);
    notParsed(`${h}.${c}=.${m}`);
    notParsed(`${h}.${c}.${m}=`);
    notParsed(`${h}.${c}.${m.slice(0, -1)}=`);
    const std = (s: string) => s.replaceAll("-", "+").replaceAll("_", "/");
    assert.ok(m !== std(m), "the vector MAC holds a '-' or '_'");
    notParsed(`${h}.${c}.${std(m)}`);
    notParsed(`${h}.${c}.${m}!`);
    notParsed(`${h}.${c}.${m.slice(0, 10)} ${m.slice(10)}`);
    // A length that no base64 text has (4n + 1).
    const oneMore = (s: string) => s + "A".repeat((((1 - s.length) % 4) + 4) % 4);
    notParsed(`${oneMore(h)}.${c}.${m}`);
    notParsed(`${h}.${oneMore(c)}.${m}`);
    notParsed(`${h}.${c}.${oneMore(m)}`);
    // Non-zero unused trailing bits (a second spelling of the same bytes).
    const last = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".indexOf(m.at(-1)!);
    assert.equal(last % 4, 0, "43 characters leave 2 unused bits");
    notParsed(`${h}.${c}.${m.slice(0, -1)}${"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[last + 1]}`);
    notParsed(`${h}.${c.slice(0, 10)}*${c.slice(11)}.${m}`);
    notParsed(`.${c}.${m}`);
    notParsed(`${h}..${m}`);
    // Not UTF-8.
    notParsed(`${h}.${base64urlnopad.encode(new Uint8Array([0x7b, 0xff, 0x7d]))}.${m}`);
    // Not JSON.
    notParsed(`${h}.${b64("{iss:1}")}.${m}`);
  });

  test("header alg and typ must be exact", () => {
    const bad = (header: string) => assert.equal(outcome(signed(A.claims_json, header)), "wrong alg or typ", header);
    bad('{"alg":"HS256","typ":"JWT"}');
    bad('{"alg":"x25519-hs256","typ":"JWT"}');
    bad('{"alg":"X25519-HS256","typ":"jwt"}');
    bad('{"alg":"X25519-HS256"}');
    bad('{"typ":"JWT"}');
    bad('{"alg":"none","typ":"JWT"}');
    bad('{"alg":["X25519-HS256"],"typ":"JWT"}');
    assert.equal(outcome(signed(A.claims_json, "[]")), "part is not a JSON object");
    // Extra header members, other order and spacing are fine.
    assert.equal(outcome(signed(A.claims_json, '{ "typ" : "JWT", "kid": "x", "alg" : "X25519-HS256" }')), "ok");
    assert.equal(ASSERTION_ALG, "X25519-HS256");
  });

  test("exactly three parts", () => {
    const [h, c, m] = A.token.split(".") as [string, string, string];
    for (const token of ["", h, `${h}.${c}`, `${h}.${c}.${m}.`, `${h}.${c}.${m}.${m}`, `${h}.${h}.${c}.${m}`]) {
      assert.throws(
        () => parseAssertion(token),
        (e: unknown) => e instanceof AssertionError && e.message === "not three parts",
        token,
      );
    }
  });

  test("claims must be a JSON object", () => {
    for (const claims of ["[]", `[${A.claims_json}]`, '"claims"', "42", "null", "true"]) {
      assert.equal(outcome(signed(claims)), "part is not a JSON object", claims);
    }
  });

  test("nonce present and non-empty", () => {
    const msg = "nonce must be a non-empty string";
    assert.equal(outcome(signed(claimsJson({ nonce: "" }))), msg);
    assert.equal(outcome(signed(claimsJson({}, ["nonce"]))), msg);
    assert.equal(outcome(signed(claimsJson({ nonce: null }))), msg);
    assert.equal(outcome(signed(claimsJson({ nonce: 12345 }))), msg);
    assert.equal(outcome(signed(claimsJson({ nonce: "x" }))), "ok");
  });

  test("iat and exp must be integers", () => {
    const msg = "iat and exp must be integers";
    for (const over of [{ iat: IAT + 0.5 }, { exp: IAT + 59.5 }, { iat: `${IAT}` }, { exp: `${IAT + 60}` }, { iat: null }, { exp: true }]) {
      assert.equal(outcome(signed(claimsJson(over))), msg, JSON.stringify(over));
    }
    assert.equal(outcome(signed(claimsJson({}, ["iat"]))), msg);
    assert.equal(outcome(signed(claimsJson({}, ["exp"]))), msg);
    // 1700000060.0 is an integer in JSON terms.
    assert.equal(outcome(signed(A.claims_json.replace("1700000060", "1700000060.0"))), "ok");
  });

  test("key order and spacing of the JSON do not matter", () => {
    const reordered = `{ "nonce" : "YWFhYWFhYWFhYWFhYWFhYQ",\n  "exp":1700000060, "iat" :1700000000,\t"aud": "${K.server_public_base58}", "iss":"${K.client_public_base58}" }`;
    const token = signed(reordered, '{ "typ": "JWT" , "alg": "X25519-HS256" }');
    assert.notEqual(token, A.token);
    assert.equal(outcome(token), "ok");
    assert.deepEqual(verifyAssertion(parseAssertion(token), expectations()), JSON.parse(A.claims_json));
  });

  test("parseAssertion exposes signing input and MAC", () => {
    const parsed: ParsedAssertion = parseAssertion(A.token);
    const [h, c, m] = A.token.split(".") as [string, string, string];
    assert.equal(parsed.signingInput, `${h}.${c}`);
    assert.deepEqual(parsed.mac, base64urlnopad.decode(m));
    assert.equal(parsed.mac.length, 32);
  });
});

describe("buildAssertion", () => {
  test("build → parse → verify round trip", () => {
    const client = generateKeyPair();
    const server = generateKeyPair();
    const secretClient = sharedSecret(privateKeyObject(client.privateKey), server.publicKey);
    const secretServer = sharedSecret(privateKeyObject(server.privateKey), client.publicKey);
    assert.deepEqual(secretClient, secretServer);
    const now = 1_800_000_000;
    const token = buildAssertion({ clientPublicKey: client.publicKey, serverPublicKey: server.publicKey, sharedSecret: secretClient, now });
    const e = { issuer: encodeKey(client.publicKey), audience: encodeKey(server.publicKey), now, sharedSecret: secretServer };
    const claims = verifyAssertion(parseAssertion(token), e);
    assert.equal(claims.iss, encodeKey(client.publicKey));
    assert.equal(claims.aud, encodeKey(server.publicKey));
    assert.equal(claims.iat, now);
    assert.equal(claims.exp, now + 60);
    assert.match(claims.nonce, /^[A-Za-z0-9_-]{22}$/);
    assert.throws(() => verifyAssertion(parseAssertion(token), { ...e, now: now + 60 }), /expired/);

    // Nonces differ between builds; an explicit nonce and lifetime are used as given.
    const again = parseAssertion(buildAssertion({ clientPublicKey: client.publicKey, serverPublicKey: server.publicKey, sharedSecret: secretClient, now }));
    assert.notEqual(again.claims.nonce, claims.nonce);
    const fixed = buildAssertion({
      clientPublicKey: client.publicKey,
      serverPublicKey: server.publicKey,
      sharedSecret: secretClient,
      now,
      nonce: "n-1",
      lifetimeSeconds: 300,
    });
    assert.deepEqual(verifyAssertion(parseAssertion(fixed), { ...e, now: now + 299 }), { ...claims, exp: now + 300, nonce: "n-1" });
  });

  test("buildAssertion with the vector keys and nonce is the vector token", () => {
    const token = buildAssertion({
      clientPublicKey: fromHex(K.client_public_hex),
      serverPublicKey: fromHex(K.server_public_hex),
      sharedSecret: shared,
      now: IAT,
      nonce: "YWFhYWFhYWFhYWFhYWFhYQ",
    });
    assert.equal(token, A.token);
  });
});

describe("issued ids and tokens", () => {
  test("ids are base58 (never a leading '-', which a command line takes for an option); tokens are 32 bytes base64url", () => {
    const ids = new Set<string>();
    for (let i = 0; i < 5000; i++) {
      const id = newId();
      assert.match(id, /^[1-9A-HJ-NP-Za-km-z]{20,22}$/);
      ids.add(id);
    }
    assert.equal(ids.size, 5000);
    const token = newToken();
    assert.match(token, /^[A-Za-z0-9_-]{43}$/);
    assert.match(hashToken(token), /^[A-Za-z0-9_-]{43}$/);
    assert.notEqual(hashToken(token), token);
  });
});
