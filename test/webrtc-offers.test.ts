import assert from "node:assert/strict";
import { createSocket } from "node:dgram";
import { rmSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import pg from "pg";
import { encodeKey, generateKeyPair } from "../src/crypto/keys.ts";
import { OfferError } from "../src/sdk/webrtc.ts";
import { MAX_ANSWER_BYTES, offerToApply } from "../src/transport/sdp.ts";
import { freshPostgresDatabase, STORES, startTestServer, TEST_DATABASE_URL, type TestServer, tempDir } from "./support/server.ts";
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

  test("10: every error in the offer's SDP is 400 INVALID_SDP naming it, never a 500 (the attack's offers among them)", async () => {
    const keyPair = generateKeyPair();
    const long = "m".repeat(250 * 1024 - 2 * sdp.length);
    const variants: Array<[string, string, RegExp]> = [
      ["no ICE credentials", sdp.replace(/a=ice-ufrag:[^\r\n]*\r\n/g, "").replace(/a=ice-pwd:[^\r\n]*\r\n/g, ""), /ice-ufrag/],
      ["no ice-pwd", sdp.replace(/a=ice-pwd:[^\r\n]*\r\n/g, ""), /ice-pwd/],
      ["a short ice-pwd", sdp.replace(/a=ice-pwd:[^\r\n]*/g, "a=ice-pwd:short"), /ice-pwd/],
      ["a broken fingerprint", sdp.replace(/(a=fingerprint:sha-256 )[0-9A-F:]+/g, "$1ZZ:12"), /fingerprint/],
      ["a fingerprint of the wrong length", sdp.replace(/(a=fingerprint:sha-256 [0-9A-F:]+):[0-9A-F]{2}/g, "$1"), /fingerprint/],
      ["an unknown hash", sdp.replace(/a=fingerprint:sha-256/g, "a=fingerprint:md9"), /fingerprint/],
      ["an absurd payload type", sdp.replace(/(m=audio \d+ \S+ )111/, "$14294967295"), /payload type/],
      ["an absurd rtpmap payload type", sdp.replace("a=rtpmap:111 opus", "a=rtpmap:99999 opus"), /payload type/],
      ["a malformed candidate", sdp.replace(/a=candidate:(\S+) 1 udp/, "a=candidate:$1 x udp"), /candidate/],
      ["a candidate with a port out of range", sdp.replace(/(a=candidate:\S+ 1 udp \d+ \S+ )\d+/, "$199999"), /candidate/],
      ["a 250 KB mid", sdp.replace(/a=mid:0/, `a=mid:${long}`), /longer than 8192 characters/],
      ["a 33-character mid", sdp.replace(/a=mid:0/, `a=mid:${"m".repeat(33)}`).replace("a=group:BUNDLE 0 1", `a=group:BUNDLE ${"m".repeat(33)} 1`), /mid/],
      ["a mid used twice", sdp.replace(/a=mid:1/, "a=mid:0"), /twice/],
      ["a BUNDLE group naming no section", sdp.replace("a=group:BUNDLE 0 1", "a=group:BUNDLE 7 1"), /BUNDLE/],
      ["129 media sections", `${sdp}${"m=audio 0 UDP/TLS/RTP/SAVPF 0\r\n".repeat(127)}`, /media sections/],
      ["a line that is no SDP", sdp.replace("s=-\r\n", "s=-\r\nhello\r\n"), /form/],
      ["a bad setup role", sdp.replace(/a=setup:actpass/g, "a=setup:whatever"), /setup/],
      ["no version line", sdp.replace("v=0\r\n", ""), /v=0/],
    ];
    for (const [what, variant, message] of variants) {
      const s = sealOffer(serverKey, keyPair, variant);
      const res = await postOffer(server.url, s.headers, s.body);
      const body = (await res.json()) as { error: { code: string; message: string } };
      assert.equal(`${res.status} ${body.error.code}`, "400 INVALID_SDP", what);
      assert.match(body.error.message, message, what);
    }
    await nothingStored(encodeKey(keyPair.publicKey));
  });

  test("10: the lines of a real offer, each dropped or mangled: an answer or a 400, never a 500", async () => {
    const lines = sdp.split("\r\n").filter(Boolean);
    const statuses = new Map<string, number>();
    for (const [i, line] of lines.entries()) {
      if (line.startsWith("a=candidate") && i % 3 !== 0) continue; // a few candidates are enough
      const head = line.slice(0, line.indexOf(":") + 1 || 2);
      for (const replacement of [undefined, `${head}`, `${head}\u0000\u00ff${"9".repeat(40)}`]) {
        const variant = [...lines.slice(0, i), ...(replacement === undefined ? [] : [replacement]), ...lines.slice(i + 1)].join("\r\n");
        const s = sealOffer(serverKey, generateKeyPair(), `${variant}\r\n`);
        const res = await postOffer(server.url, s.headers, s.body);
        const code = res.status === 200 ? "answered" : ((await res.json()) as { error: { code: string } }).error.code;
        if (res.status === 200) await res.arrayBuffer();
        statuses.set(`${res.status} ${code}`, (statuses.get(`${res.status} ${code}`) ?? 0) + 1);
      }
    }
    assert.deepEqual(
      [...statuses.keys()].filter((k) => !["200 answered", "400 INVALID_SDP", "400 MISSING_OPUS_AUDIO"].includes(k)),
      [],
      JSON.stringify([...statuses]),
    );
    assert.ok(statuses.get("400 INVALID_SDP"), "some variants are refused");
  });

  test("the answer is bounded: 128 sections with 32-character mids are answered within 256 KiB, the size of the largest offer", async () => {
    const audio = /m=audio[\s\S]*?(?=m=application)/
      .exec(sdp)![0]
      .replace(/a=ssrc:[^\r\n]*\r\n/g, "")
      .replace(/a=candidate:[^\r\n]*\r\n/g, "");
    const mid = (i: number) => `${"m".repeat(29)}${String(i).padStart(3, "0")}`;
    const extra = Array.from({ length: 126 }, (_, i) => audio.replace(/a=mid:0/, `a=mid:${mid(i)}`)).join("");
    const crowded = `${sdp}${extra}`.replace("a=group:BUNDLE 0 1", `a=group:BUNDLE 0 1 ${Array.from({ length: 126 }, (_, i) => mid(i)).join(" ")}`);
    const keyPair = generateKeyPair();
    const s = sealOffer(serverKey, keyPair, crowded);
    const res = await postOffer(server.url, s.headers, s.body);
    assert.equal(res.status, 200, await res.clone().text());
    const answer = s.exchange.openResponse(new Uint8Array(await res.arrayBuffer()));
    assert.equal(answer.match(/^m=/gm)?.length, 128);
    assert.ok(Buffer.byteLength(answer) <= MAX_ANSWER_BYTES, `${Buffer.byteLength(answer)} bytes`);
  });

  /**
   * Posts the offer with a UDP socket of the test, bound to `bait.address`, as its first candidate
   * (a server that checks it checks it at once, before it answers), written as libwebrtc writes its
   * candidates (`network-id`) or not; then hands what the socket received and the answer to `use`.
   * The offer comes from 127.0.0.1, the test's HTTP client; `forwarded`: through a proxy, it says.
   */
  async function offerNamingSink(
    bait: { address: string; libwebrtc: boolean; forwarded?: boolean },
    edit: (offer: string) => string,
    use: (heard: Buffer[], answer: string) => Promise<void>,
  ): Promise<void> {
    const sink = createSocket("udp4");
    const heard: Buffer[] = [];
    sink.on("message", (m) => heard.push(m));
    await new Promise<void>((resolve) => sink.bind(0, bait.address, resolve));
    try {
      const line = `a=candidate:9 1 udp 2130706431 ${bait.address} ${sink.address().port} typ host${bait.libwebrtc ? " generation 0 network-id 1" : ""}\r\n`;
      const offer = edit(sdp.replace(/^a=candidate:/m, `${line}a=candidate:`));
      assert.ok(offer.includes(line));
      const s = sealOffer(serverKey, generateKeyPair(), offer);
      const res = await postOffer(server.url, bait.forwarded ? { ...s.headers, "x-forwarded-for": "198.51.100.7" } : s.headers, s.body);
      assert.equal(res.status, 200, await res.clone().text());
      await use(heard, s.exchange.openResponse(new Uint8Array(await res.arrayBuffer())));
    } finally {
      sink.close();
    }
  }

  /** A STUN binding request: message type 0x0001 and the magic cookie 0x2112A442. */
  const stunCheck = (m: Buffer) => m.length >= 8 && m.readUInt16BE(0) === 0x0001 && m.readUInt32BE(4) === 0x2112a442;

  test("a libwebrtc device's candidate on the address its offer came from is checked at once; the server stays the DTLS client", () =>
    offerNamingSink(
      { address: "127.0.0.1", libwebrtc: true },
      (offer) => offer,
      async (heard, answer) => {
        assert.match(answer, /^a=setup:active\r?$/m);
        await eventually(() => heard.find(stunCheck), 5000, "a STUN check");
      },
    ));

  for (const bait of [
    { address: "127.0.0.2", libwebrtc: true, why: "on another address than the offer came from (a device behind a NAT)" },
    { address: "127.0.0.1", libwebrtc: false, why: "of a stack other than libwebrtc (libdatachannel drops a DTLS hello before its answer)" },
    { address: "127.0.0.1", libwebrtc: true, forwarded: true, why: "when a proxy no one trusts forwarded the offer (the address is the proxy's)" },
  ]) {
    test(`no candidate ${bait.why} is checked: the server answers the device's own checks (peer-reflexive), which connect`, () =>
      offerNamingSink(
        bait,
        (offer) => offer,
        async (heard) => {
          // The bait, first of the offer's candidates, would have been checked before the answer was
          // given; a whole connect after it (its answer, ICE, DTLS and SCTP) comes later still.
          const device = await connect(server);
          assert.ok(device.timings.ready > 0);
          device.close();
          assert.deepEqual(heard, [], "no STUN check reached the offered address");
        },
      ));
  }

  test("of a libwebrtc offer's candidates on its address, only host ones are kept for the early check (a server-reflexive one is the NAT's)", () => {
    const candidate = (port: number, typ: string) => `a=candidate:${port} 1 udp 2130706431 203.0.113.7 ${port} typ ${typ} generation 0 network-id 1`;
    const offer = ["v=0", "t=0 0", "m=audio 9 UDP/TLS/RTP/SAVPF 111", candidate(5001, "srflx raddr 0.0.0.0 rport 0"), candidate(5002, "host"), ""].join("\r\n");
    const applied = offerToApply(offer, "203.0.113.7");
    assert.ok(applied.includes(candidate(5002, "host")));
    assert.ok(!applied.includes("5001"), applied);
  });

  test("an ICE-lite device's offer keeps its candidates: the server checks them, since the device never checks", () =>
    offerNamingSink(
      { address: "127.0.0.2", libwebrtc: false },
      (offer) => offer.replace(/^(t=.*\r\n)/m, "$1a=ice-lite\r\n"),
      async (heard) => {
        await eventually(() => heard.find(stunCheck), 5000, "a STUN check");
      },
    ));
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
    const server = await startTestServer({ config: { webrtc: { max_connections: 1 }, rate_limits: { offer_per_key: 2 } } });
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

// Two nodes on one database: PostgreSQL, or one SQLite file that both open (WAL lets them).
for (const store of STORES)
  describe(`two nodes on one database (${store.name})`, () => {
    let a: TestServer;
    let b: TestServer;
    let dataDir: string;
    before(async () => {
      const databaseUrl = await store.url();
      dataDir = tempDir();
      a = await startTestServer({ dataDir, config: { database_url: databaseUrl, node_name: "node-a" } });
      b = await startTestServer({ dataDir, config: { database_url: databaseUrl, node_name: "node-b" } });
    });
    after(async () => {
      await a?.stop();
      await b?.stop();
      rmSync(dataDir, { recursive: true, force: true });
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

    test("a connection on the second node replaces the one on the first", async () => {
      const keyPair = generateKeyPair();
      const onA = await connect(a, { keyPair });
      const onB = await connect(b, { keyPair });
      try {
        await onA.closed();
        const runtime = (await onB.http(1, "GET", "/me/runtime")).json<{ online: boolean; node: string }>();
        assert.deepEqual([runtime.online, runtime.node], [true, "node-b"]);
        await eventually(() => a.transport!.connection(onA.publicKey) === undefined);
      } finally {
        onA.close();
        onB.close();
      }
    });
  });

// The order of answer() (transport.ts): the key is registered before the answer goes out, so that a
// device that holds an answer is a peer an operator can block at once. The registration's write is
// slowed by the database itself: a transaction of the test's holds the peers table against writes
// (reads go on; the offer's nonce is in a table of its own).
describe("offers: the key is registered before the answer is sent (postgres)", { skip: !TEST_DATABASE_URL && "PERCH_TEST_DATABASE_URL is not set" }, () => {
  test("with the registration's write held back, the answer waits for it, and the peer is stored when it arrives", async () => {
    const databaseUrl = await freshPostgresDatabase();
    const server = await startTestServer({ config: { database_url: databaseUrl } });
    const holder = new pg.Client({ connectionString: databaseUrl });
    await holder.connect();
    try {
      const serverKey = (await server.client().serverInfo()).public_key;
      const keyPair = generateKeyPair();
      const s = sealOffer(serverKey, keyPair, await realOfferSdp());
      await holder.query("begin");
      await holder.query("lock table peers in share row exclusive mode");
      let holding = true;
      const answered = postOffer(server.url, s.headers, s.body).then(async (res) => ({
        res,
        holding,
        stored: await server.store.read((r) => r.peers.get(encodeKey(keyPair.publicKey))),
      }));
      // The node's insert waits for the lock...
      const waiting = "select 1 from pg_locks l join pg_class c on c.oid = l.relation where c.relname = 'peers' and not l.granted";
      await eventually(async () => (await holder.query(waiting)).rowCount! > 0, 20_000, "the registration waiting for the lock");
      // ...and is held back a while longer: an answer sent before the key is registered arrives meanwhile.
      await new Promise((r) => setTimeout(r, 500));
      holding = false;
      await holder.query("commit");
      const { res, holding: heldAtAnswer, stored } = await answered;
      assert.equal(res.status, 200);
      assert.equal(heldAtAnswer, false, "the answer arrived while the key's registration was held back");
      assert.equal(stored?.status, "active", "the peer is stored when its answer arrives");
    } finally {
      await holder.end();
      await server.stop();
    }
  });
});
