import assert from "node:assert/strict";
import { test } from "node:test";
import { base64urlnopad } from "@scure/base";
import { keyPairFromPrivate, privateKeyObject, sharedSecret } from "../src/crypto/keys.ts";
import { deriveSealingKeys, parseNonce, SealError, SealedExchange } from "../src/crypto/sealed-offer.ts";
import vectors from "./support/vectors.json" with { type: "json" };

// The contract's vectors: "keys" and "sealed_offer".
const V = { ...vectors.keys, ...vectors.sealed_offer };
const hex = (h: string) => Buffer.from(h, "hex");

test("sealed offer: key schedule and both bodies match the contract's vectors", () => {
  const client = keyPairFromPrivate(hex(V.client_private_hex));
  const server = keyPairFromPrivate(hex(V.server_private_hex));
  const shared = sharedSecret(privateKeyObject(server.privateKey), client.publicKey);
  assert.equal(Buffer.from(shared).toString("hex"), V.shared_secret_hex);
  const keys = deriveSealingKeys(shared, hex(V.nonce_hex), V.timestamp);
  assert.equal(keys.requestKey.toString("hex"), V.request_key_hex);
  assert.equal(keys.requestNonce.toString("hex"), V.request_nonce_hex);
  assert.equal(keys.responseKey.toString("hex"), V.response_key_hex);
  assert.equal(keys.responseNonce.toString("hex"), V.response_nonce_hex);
  assert.equal(base64urlnopad.encode(hex(V.nonce_hex)), V.nonce_header);

  const exchange = new SealedExchange(shared, V.client_public_base58, V.timestamp, V.nonce_header, hex(V.nonce_hex));
  assert.equal(exchange.sealRequest(V.offer_plaintext).toString("hex"), V.offer_body_hex);
  assert.equal(exchange.openRequest(hex(V.offer_body_hex)), V.offer_plaintext);
  assert.equal(exchange.sealResponse(V.answer_plaintext).toString("hex"), V.answer_body_hex);
  assert.equal(exchange.openResponse(hex(V.answer_body_hex)), V.answer_plaintext);
});

test("sealed offer: any changed byte, header or direction fails to open", () => {
  const shared = hex(V.shared_secret_hex);
  const exchange = new SealedExchange(shared, V.client_public_base58, V.timestamp, V.nonce_header, hex(V.nonce_hex));
  const body = hex(V.offer_body_hex);
  for (let i = 0; i < body.length; i++) {
    const tampered = Buffer.from(body);
    tampered[i]! ^= 1;
    assert.throws(() => exchange.openRequest(tampered), SealError);
  }
  assert.throws(() => exchange.openRequest(body.subarray(0, 10)), SealError);
  assert.throws(() => exchange.openResponse(body), SealError);
  const otherTime = new SealedExchange(shared, V.client_public_base58, "1700000001", V.nonce_header, hex(V.nonce_hex));
  assert.throws(() => otherTime.openRequest(body), SealError);
});

test("sealed offer: nonce header parsing", () => {
  assert.deepEqual(parseNonce(V.nonce_header), new Uint8Array(hex(V.nonce_hex)));
  for (const bad of [undefined, "", "AAECAwQFBgcICQoLDA0ODw==", "AAECAwQFBgcICQoLDA0OD", "AAECAwQFBgcICQoLDA0ODwA", "AAECAwQFBgcICQoLDA0OD+"]) {
    assert.equal(parseNonce(bad), null, String(bad));
  }
});
