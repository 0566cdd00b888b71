import assert from "node:assert/strict";
import { test } from "node:test";
import { base64urlnopad } from "@scure/base";
import { keyPairFromPrivate, privateKeyObject, sharedSecret } from "../src/crypto/keys.ts";
import { deriveSealingKeys, parseNonce, SealError, SealedExchange } from "../src/crypto/sealed-offer.ts";

// The contract's vectors (vectors.json "keys" and "sealed_offer"), copied verbatim.
const V = {
  client_private_hex: "0101010101010101010101010101010101010101010101010101010101010101",
  client_public_base58: "C6cUahgsea11j7dTmSFiNydnaPG9kg7yPFagXqerHGnC",
  server_private_hex: "0202020202020202020202020202020202020202020202020202020202020202",
  shared_secret_hex: "2ed76ab549b1e73c031eb49c9448f0798aea81b698279a0c3dc3e49fbfc4b953",
  timestamp: "1700000000",
  nonce_hex: "000102030405060708090a0b0c0d0e0f",
  nonce_header: "AAECAwQFBgcICQoLDA0ODw",
  request_key_hex: "8a33c01a866fdd1535792664d20380c6712ab55ef455f089bf84f653b3e2d1fb",
  request_nonce_hex: "32207c940c9d45dfada23d6b",
  response_key_hex: "f5d6c83275d1b9eae8f678191f67aaf15a29c207af9cbe8f0ebd28d67f9f4d73",
  response_nonce_hex: "006bca3e8ed50f0b05531c8d",
  offer_plaintext: "v=0\r\n",
  offer_body_hex: "ba4e4ff97f831d90852bfb8d88c5303a837becb66c",
  answer_plaintext: "v=0 answer\r\n",
  answer_body_hex: "80d966d3cf3948f48087e5b0c95667ff4136ff356081fa1b8e04214b",
};
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
