import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { encodeKey, generateKeyPair } from "../src/crypto/keys.ts";
import { OfferError } from "../src/sdk/webrtc.ts";
import { bundledCandidatesOnly } from "../src/transport/sdp.ts";
import { freshPostgresDatabase, startTestServer, TEST_DATABASE_URL, type TestServer, tempDir } from "./support/server.ts";
import { connect, eventually, postOffer, realOfferSdp, sealOffer } from "./support/webrtc.ts";

async function expectError(res: Response, status: number, code: string): Promise<void> {
  const body = (await res.json()) as { error: { code: string } };
  assert.equal(`${res.status} ${body.error.code}`, `${status} ${code}`);
}

describe("POST /webrtc/v1/offer: every check of the contract, in order", () => {
  let server: TestServer;
  let serverKey: string;
  let sdp: string;
  before(async () => {
    server = await startTestServer();
    serverKey = (await server.client().serverInfo()).public_key;
    sdp = await realOfferSdp();
  });
  after(async () => {
    await server.stop();
  });

  const nothingStored = async (publicKey: string) => {
    assert.equal(await server.store.read((r) => r.peers.get(publicKey)), undefined, "no peer registered");
    assert.equal(await server.store.read((r) => r.runtime.get(publicKey)), undefined, "no runtime");
  };

  test("1–6: media type, key, timestamp, freshness, nonce, size", async () => {
    const keyPair = generateKeyPair();
    const s = sealOffer(serverKey, keyPair, sdp);
    const h = s.headers;
    await expectError(await postOffer(server.url, { ...h, "content-type": "application/json" }, s.body), 415, "UNSUPPORTED_MEDIA_TYPE");
    // Checks run in order: a wrong media type wins over every other fault.
    await expectError(await postOffer(server.url, { "content-type": "text/plain" }, new Uint8Array(300_000)), 415, "UNSUPPORTED_MEDIA_TYPE");
    const { "X-Giznet-Public-Key": _k, ...noKey } = h;
    await expectError(await postOffer(server.url, noKey, s.body), 400, "INVALID_PUBLIC_KEY");
    await expectError(await postOffer(server.url, { ...h, "X-Giznet-Public-Key": "not-base58!" }, s.body), 400, "INVALID_PUBLIC_KEY");
    await expectError(
      await postOffer(server.url, { ...h, "X-Giznet-Public-Key": encodeKey(new Uint8Array(32).fill(0xff)) }, s.body),
      400,
      "INVALID_PUBLIC_KEY",
    );
    const { "X-Giznet-Timestamp": _t, ...noTime } = h;
    await expectError(await postOffer(server.url, noTime, s.body), 400, "INVALID_TIMESTAMP");
    await expectError(await postOffer(server.url, { ...h, "X-Giznet-Timestamp": "12.5" }, s.body), 400, "INVALID_TIMESTAMP");
    const old = String(Math.floor(Date.now() / 1000) - 121);
    await expectError(await postOffer(server.url, { ...h, "X-Giznet-Timestamp": old }, s.body), 400, "EXPIRED_REQUEST");
    const { "X-Giznet-Nonce": _n, ...noNonce } = h;
    await expectError(await postOffer(server.url, noNonce, s.body), 400, "INVALID_NONCE");
    await expectError(await postOffer(server.url, { ...h, "X-Giznet-Nonce": "AAECAwQFBgcICQoLDA0ODw==" }, s.body), 400, "INVALID_NONCE");
    await expectError(await postOffer(server.url, h, new Uint8Array(256 * 1024 + 1)), 413, "PAYLOAD_TOO_LARGE");
    await nothingStored(encodeKey(keyPair.publicKey));
  });

  test("7–8: a tampered body is 401 and burns nothing; a captured offer replayed is 409", async () => {
    const keyPair = generateKeyPair();
    const s = sealOffer(serverKey, keyPair, sdp);
    const tampered = new Uint8Array(s.body);
    tampered[10]! ^= 1;
    await expectError(await postOffer(server.url, s.headers, tampered), 401, "UNAUTHORIZED");
    await nothingStored(encodeKey(keyPair.publicKey));
    // Another key's headers over this body: 401 too.
    await expectError(
      await postOffer(server.url, { ...s.headers, "X-Giznet-Public-Key": encodeKey(generateKeyPair().publicKey) }, s.body),
      401,
      "UNAUTHORIZED",
    );

    // The refused attempts did not burn the nonce: the genuine offer is answered.
    const ok = await postOffer(server.url, s.headers, s.body);
    assert.equal(ok.status, 200);
    assert.equal(ok.headers.get("content-type"), "application/octet-stream");
    assert.match(ok.headers.get("server-timing") ?? "", /total;dur=/);
    assert.match(s.exchange.openResponse(new Uint8Array(await ok.arrayBuffer())), /^v=0\r\n[\s\S]*a=candidate:/m);
    await expectError(await postOffer(server.url, s.headers, s.body), 409, "REPLAYED_NONCE");
  });

  test("10–11: SDP without a fingerprint, without Opus audio, without a data channel", async () => {
    const keyPair = generateKeyPair();
    const variants: Array<[string, string]> = [
      [sdp.replace(/a=fingerprint:[^\r\n]*\r\n/g, ""), "INVALID_SDP"],
      [sdp.replace(/a=sendrecv/g, "a=recvonly"), "MISSING_OPUS_AUDIO"],
      [sdp.replace(/opus\/48000/g, "pcmu/8000"), "MISSING_OPUS_AUDIO"],
      [sdp.replace(/webrtc-datachannel/g, "other"), "MISSING_OPUS_AUDIO"],
    ];
    for (const [variant, code] of variants) {
      const s = sealOffer(serverKey, keyPair, variant);
      await expectError(await postOffer(server.url, s.headers, s.body), 400, code);
    }
    await nothingStored(encodeKey(keyPair.publicKey));
  });

  test("13: an offer the WebRTC stack cannot apply is 500 ANSWER_FAILED", async () => {
    const broken = sdp.replace(/a=ice-ufrag:[^\r\n]*\r\n/g, "").replace(/a=ice-pwd:[^\r\n]*\r\n/g, "");
    const keyPair = generateKeyPair();
    const s = sealOffer(serverKey, keyPair, broken);
    await expectError(await postOffer(server.url, s.headers, s.body), 500, "ANSWER_FAILED");
    await nothingStored(encodeKey(keyPair.publicKey));
  });

  test("the server checks only the candidates of the BUNDLE group's tagged m-section", () => {
    const sections = (text: string) => text.split(/(?=^m=)/m).map((s) => s.split("\r\n").filter((l) => l.startsWith("a=candidate:")).length);
    // libwebrtc gathers for the audio and the data section alike until the answer bundles them.
    const [, audio, data] = sections(sdp);
    assert.ok(audio! > 0 && data! > 0, `candidates per section: ${sections(sdp).join(", ")}`);
    const trimmed = bundledCandidatesOnly(sdp);
    assert.deepEqual(sections(trimmed), [0, audio, 0]);
    assert.equal(trimmed.replace(/^a=candidate:.*\r\n/gm, ""), sdp.replace(/^a=candidate:.*\r\n/gm, ""));
    // Nothing changes without a group, or when the tagged section has no candidates to keep.
    const unbundled = sdp.replace(/^a=group:BUNDLE.*\r\n/m, "");
    assert.equal(bundledCandidatesOnly(unbundled), unbundled);
    const [head, first, ...rest] = sdp.split(/(?=^m=)/m);
    const lateOnly = [head, first!.replace(/^a=candidate:.*\r\n/gm, ""), ...rest].join("");
    assert.equal(bundledCandidatesOnly(lateOnly), lateOnly);
  });
});

describe("offers: policy, blocked peers, capacity and the rate limit", () => {
  test("9: a blocked peer, and an unknown key under the closed policy, are refused", async () => {
    const server = await startTestServer({ config: { registration: { policy: "closed", tokens: [] } } });
    try {
      const serverKey = (await server.client().serverInfo()).public_key;
      const sdp = await realOfferSdp();
      const stranger = generateKeyPair();
      const s = sealOffer(serverKey, stranger, sdp);
      await expectError(await postOffer(server.url, s.headers, s.body), 403, "PEER_NOT_REGISTERED");
      assert.equal(await server.store.read((r) => r.peers.get(encodeKey(stranger.publicKey))), undefined);
      const known = generateKeyPair();
      await server.domain.peers.add(encodeKey(known.publicKey));
      await server.domain.peers.setBlocked(encodeKey(known.publicKey), true);
      const b = sealOffer(serverKey, known, sdp);
      await expectError(await postOffer(server.url, b.headers, b.body), 403, "PEER_BLOCKED");
      await server.domain.peers.setBlocked(encodeKey(known.publicKey), false);
      const conn = await connect(server, { keyPair: known });
      conn.close();
    } finally {
      await server.stop();
    }
  });

  test("12 and the rate limit: 503 CAPACITY_EXCEEDED with Retry-After; 429 after 2 verified offers a minute", async () => {
    const server = await startTestServer({ config: { webrtc: { maxConnections: 1 }, rateLimits: { offerPerKey: 2 } } });
    try {
      const first = await connect(server);
      await assert.rejects(
        connect(server),
        (e: unknown) => e instanceof OfferError && e.status === 503 && e.code === "CAPACITY_EXCEEDED" && e.headers.get("retry-after") === "5",
      );
      first.close();
      await eventually(() => server.transport!.size === 0);
      const keyPair = generateKeyPair();
      const serverKey = (await server.client().serverInfo()).public_key;
      const sdp = await realOfferSdp();
      // Garbage does not count against the key.
      for (let i = 0; i < 3; i++) {
        const g = sealOffer(serverKey, keyPair, sdp);
        await expectError(await postOffer(server.url, g.headers, new Uint8Array(64)), 401, "UNAUTHORIZED");
      }
      const statuses: number[] = [];
      for (let i = 0; i < 3; i++) {
        const s = sealOffer(serverKey, keyPair, sdp.replace(/webrtc-datachannel/g, "other"));
        statuses.push((await postOffer(server.url, s.headers, s.body)).status);
      }
      assert.deepEqual(statuses, [400, 400, 429]);
    } finally {
      await server.stop();
    }
  });
});

describe("two nodes on one PostgreSQL database", { skip: TEST_DATABASE_URL ? false : "PERCH_TEST_DATABASE_URL is not set" }, () => {
  let a: TestServer;
  let b: TestServer;
  before(async () => {
    const databaseUrl = await freshPostgresDatabase();
    const dataDir = tempDir();
    a = await startTestServer({ dataDir, config: { databaseUrl, nodeName: "node-a" } });
    b = await startTestServer({ dataDir, config: { databaseUrl, nodeName: "node-b" } });
  });
  after(async () => {
    await a?.stop();
    await b?.stop();
  });

  test("the same sealed offer raced to both nodes is answered exactly once", async () => {
    const serverKey = (await a.client().serverInfo()).public_key;
    const sdp = await realOfferSdp();
    for (let i = 0; i < 3; i++) {
      const s = sealOffer(serverKey, generateKeyPair(), sdp);
      const [ra, rb] = await Promise.all([postOffer(a.url, s.headers, s.body), postOffer(b.url, s.headers, s.body)]);
      assert.deepEqual([ra.status, rb.status].sort(), [200, 409]);
    }
  });

  test("a connection on the second node replaces the one on the first within a few seconds", async () => {
    const keyPair = generateKeyPair();
    const onA = await connect(a, { keyPair });
    const onB = await connect(b, { keyPair });
    try {
      const started = Date.now();
      await onA.closed();
      assert.ok(Date.now() - started < 5000);
      const runtime = (await onB.http(1, "GET", "/me/runtime")).json<{ online: boolean; node: string }>();
      assert.deepEqual([runtime.online, runtime.node], [true, "node-b"]);
      await eventually(() => a.transport!.connection(onA.publicKey) === undefined);
    } finally {
      onA.close();
      onB.close();
    }
  });
});
