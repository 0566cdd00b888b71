import assert from "node:assert/strict";
import { after, before, describe, mock, test } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import wrtc from "@roamhq/wrtc";
import { LibOpus } from "../src/audio/opus.ts";
import { encodeKey, generateKeyPair } from "../src/crypto/keys.ts";
import type { ChannelStream } from "../src/protocol/channel.ts";
import { encodeFrame, type Frame, FrameDecoder, FrameType } from "../src/protocol/frames.ts";
import { RpcMethod, RpcRequestSchema, RpcResponseSchema } from "../src/protocol/gen/rpc_pb.ts";
import { RpcCode, RpcError, rpcPayload } from "../src/protocol/rpc.ts";
import { PerchClient } from "../src/sdk/client.ts";
import type { PerchConnection } from "../src/sdk/webrtc.ts";
import { toneFrames } from "../src/transport/audio.ts";
import { parseRawResponse } from "./support/raw-http.ts";
import { freshPostgresDatabase, startTestServer, TEST_DATABASE_URL, type TestServer } from "./support/server.ts";
import { connect, eventually, postOffer, realOfferSdp, sealOffer } from "./support/webrtc.ts";

/**
 * Sends `pieces` on `stream`, each as its own DataChannel message, and gives what comes back to
 * `take` until the stream closes (or `timeoutMs`): whether it was the server that closed it.
 */
function exchangeOn(stream: ChannelStream, pieces: Array<string | Buffer>, take: (chunk: Buffer) => void, timeoutMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    let done = false;
    const finish = (closed: boolean) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      stream.destroy();
      resolve(closed);
    };
    const timer = setTimeout(() => finish(false), timeoutMs);
    stream.on("data", take);
    stream.once("end", () => finish(true));
    stream.once("close", () => finish(true));
    for (const piece of pieces) stream.port.send(typeof piece === "string" ? Buffer.from(piece) : piece);
  });
}

/** `pieces` on `stream` (an HTTP service stream), and the answer's text until the stream closes (or `timeoutMs`). */
async function rawExchange(stream: ChannelStream, pieces: Array<string | Buffer>, timeoutMs = 5_000): Promise<{ raw: string; closed: boolean }> {
  let raw = "";
  const closed = await exchangeOn(stream, pieces, (chunk) => (raw += chunk.toString("utf8")), timeoutMs);
  return { raw, closed };
}

describe("a hostile device over HTTP streams 1 and 2", () => {
  let server: TestServer;
  let conn: PerchConnection;
  before(async () => {
    server = await startTestServer({ config: { http: { request_timeout_ms: 1_000, max_connections: 10_000 } } });
    conn = await connect(server);
  });
  after(async () => {
    conn?.close();
    await server.stop();
  });

  test("garbage bytes get a 400 in the ErrorResponse envelope with a request id, as over TCP", async () => {
    const { raw, closed } = await rawExchange(await conn.openStream(1), ["\x00\x01garbage\r\n\r\n"]);
    assert.ok(closed);
    const res = parseRawResponse(raw);
    assert.equal(res?.status, 400, raw);
    assert.equal((JSON.parse(res!.body) as { error: { code: string } }).error.code, "INVALID_REQUEST");
    assert.ok(res!.headers["x-request-id"]);
  });

  const get = (path: string, extra = "") => `GET ${path} HTTP/1.1\r\nHost: perch\r\n${extra}Connection: close\r\n\r\n`;

  test("a request that never completes is answered 408 and its stream closed, so it does not hold a stream slot", async () => {
    const { raw, closed } = await rawExchange(await conn.openStream(1), ["GET /me HTTP/1.1\r\nHost: perch\r\n"], 6_000);
    assert.ok(closed, "the stream is closed by the server");
    assert.equal(parseRawResponse(raw)?.status, 408, raw);
  });

  test("a request without Connection: close still gets one exchange: the stream closes after the response", async () => {
    const { raw, closed } = await rawExchange(await conn.openStream(1), ["GET /me HTTP/1.1\r\nHost: perch\r\n\r\n"], 4_000);
    assert.ok(closed, "the stream is closed after the response");
    assert.equal(parseRawResponse(raw)?.status, 200, raw);
  });

  test("a pipelined second request on the same stream is neither answered nor run", async () => {
    const put = (volume: number) => {
      const body = JSON.stringify({ volume });
      return `PUT /me/status HTTP/1.1\r\nHost: perch\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
    };
    assert.equal(
      (await conn.http(1, "PUT", "/me/status", { body: JSON.stringify({ volume: 5 }), headers: { "content-type": "application/json" } })).status,
      200,
    );
    // Bytes after a request that said Connection: close are a framing error (400, as over TCP).
    for (const [first, status] of [
      [get("/me").replace("Connection: close\r\n", ""), 200],
      [get("/me"), 400],
    ] as const) {
      const { raw, closed } = await rawExchange(await conn.openStream(1), [`${first}${put(66)}`], 4_000);
      assert.ok(closed);
      assert.equal(raw.match(/^HTTP\/1\.1 /gm)?.length, 1, raw);
      assert.equal(parseRawResponse(raw)?.status, status, `${first}: ${raw}`);
    }
    // No pause needed: the server handles a stream's bytes in order, so whatever it did with the
    // extra request came before it closed that stream.
    assert.equal((await conn.http(1, "GET", "/me/status")).json<{ volume: number }>().volume, 5);
  });

  test("a request split into 1-byte messages, a chunked body, a body without Content-Length, a 20 KiB message", async () => {
    const split = await rawExchange(await conn.openStream(1), [...get("/me")]);
    assert.equal(parseRawResponse(split.raw)?.status, 200, split.raw);
    const chunkedBody = JSON.stringify({ volume: 12 });
    const chunked = await rawExchange(await conn.openStream(1), [
      "PUT /me/status HTTP/1.1\r\nHost: perch\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
      `${chunkedBody.length.toString(16)}\r\n${chunkedBody}\r\n`,
      "0\r\n\r\n",
    ]);
    assert.equal(parseRawResponse(chunked.raw)?.status, 200, chunked.raw);
    assert.equal((await conn.http(1, "GET", "/me/status")).json<{ volume: number }>().volume, 12);
    // No Content-Length and no chunking: the request has no body (RFC 9112), the rest is not a request.
    const noLength = await rawExchange(await conn.openStream(1), [
      `PUT /me/status HTTP/1.1\r\nHost: perch\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n${JSON.stringify({ volume: 99 })}`,
    ]);
    assert.ok(noLength.closed);
    assert.equal(parseRawResponse(noLength.raw)?.status, 400, noLength.raw);
    assert.equal((await conn.http(1, "GET", "/me/status")).json<{ volume: number }>().volume, 12);
    // One 20 KiB DataChannel message (over the 16 KiB a sender should use): a valid body padded with JSON whitespace.
    const big = `{"volume":13${" ".repeat(20 * 1024)}}`;
    const large = await rawExchange(await conn.openStream(1), [
      `PUT /me/status HTTP/1.1\r\nHost: perch\r\nContent-Type: application/json\r\nContent-Length: ${big.length}\r\nConnection: close\r\n\r\n${big}`,
    ]);
    assert.equal(parseRawResponse(large.raw)?.status, 200, large.raw.slice(0, 300));
    assert.equal((await conn.http(1, "GET", "/me/status")).json<{ volume: number }>().volume, 13);
  });

  test("oversized bodies are 413 as over TCP, with or without Content-Length", async () => {
    const body = JSON.stringify({ pad: "x".repeat(70 * 1024) });
    const sized = await conn.http(1, "PUT", "/me/status", { body, headers: { "content-type": "application/json" } });
    assert.equal(sized.status, 413);
    const chunks: string[] = [];
    for (let i = 0; i < body.length; i += 8 * 1024) {
      const part = body.slice(i, i + 8 * 1024);
      chunks.push(`${part.length.toString(16)}\r\n${part}\r\n`);
    }
    const chunked = await rawExchange(await conn.openStream(1), [
      "PUT /me/status HTTP/1.1\r\nHost: perch\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
      ...chunks,
      "0\r\n\r\n",
    ]);
    assert.equal(parseRawResponse(chunked.raw)?.status, 413, chunked.raw.slice(0, 600));
    // The Compatible API's limit is 32 MiB: a declared length over it is refused unread.
    const overCompat = await rawExchange(await conn.openStream(2), [
      "POST /v1/chat/completions HTTP/1.1\r\nHost: perch\r\nContent-Type: application/json\r\nContent-Length: 40000000\r\nConnection: close\r\n\r\n",
    ]);
    assert.equal(parseRawResponse(overCompat.raw)?.status, 413, overCompat.raw);
  });

  test("HEAD, Side Control routes (403) and a bearer header (ignored) on stream 1", async () => {
    const head = await rawExchange(await conn.openStream(1), ["HEAD /me HTTP/1.1\r\nHost: perch\r\nConnection: close\r\n\r\n"]);
    const res = parseRawResponse(head.raw);
    assert.equal(res?.status, 200, head.raw);
    assert.equal(res?.body, "");
    for (const path of ["/side-control/info", "/side-control/status", "/side-control/telemetry/latest", "/side-control/runtime"]) {
      assert.equal((await conn.http(1, "GET", path)).status, 403, path);
    }
    const other = await server.client().login();
    const me = await conn.http(1, "GET", "/me", { headers: { authorization: `Bearer ${other.access_token}` } });
    assert.equal(me.status, 200);
    assert.equal(me.json<{ public_key: string }>().public_key, conn.publicKey);
  });
});

/** Resolves with "open" or "closed", whichever the channel reaches first (and stays in for `settleMs`). */
function settled(dc: RTCDataChannel, settleMs = 300): Promise<"open" | "closed"> {
  return new Promise((resolve) => {
    const check = () => {
      if (dc.readyState === "closed" || dc.readyState === "closing") return resolve("closed");
      if (dc.readyState === "open") {
        setTimeout(() => resolve(dc.readyState === "open" ? "open" : "closed"), settleMs);
        return;
      }
      setTimeout(check, 20);
    };
    check();
  });
}

describe("a hostile device opening streams", () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer();
  });
  after(async () => {
    await server.stop();
  });

  test("unknown labels, service ids other than 0, 1, 2, 3 and a second event stream are closed; the connection lives on", async () => {
    const conn = await connect(server);
    try {
      const labels = [
        "giznet/v1/service/4",
        "giznet/v1/service/32",
        "giznet/v1/service/01",
        "giznet/v1/service/-1",
        "giznet/v1/service/4294967296",
        "giznet/v1/service/1 ",
        "giznet/v1/service/",
        "giznet/v1/packet/",
        "giznet/v1/service/１",
        "💥\u0000\n",
        "x".repeat(1000),
        "",
      ];
      const held = await eventually(() => server.transport!.connection(conn.publicKey));
      const before = held.link.heldChannels();
      const states = await Promise.all(labels.map((l) => settled(conn.pc.createDataChannel(l))));
      assert.deepEqual(
        states,
        labels.map(() => "closed"),
      );
      assert.equal((await conn.http(1, "GET", "/me")).status, 200);
      assert.equal(server.transport!.size, 1);
      // Refused channels are let go: the link holds what it held before them.
      await eventually(() => held.link.heldChannels() <= before, 5_000, `the refused channels released (${held.link.heldChannels()} held, ${before} before)`);
    } finally {
      conn.close();
    }
  });

  test("300 streams at once: 256 stay open and work, the rest are closed; the slots come back", async () => {
    // libwebrtc's channels, read raw below: a close there never overtakes the last messages.
    const conn = await connect(server, { rtc: wrtc as never });
    try {
      const channels = Array.from({ length: 300 }, () => conn.pc.createDataChannel("giznet/v1/service/1"));
      const states = await Promise.all(channels.map((dc) => settled(dc, 500)));
      assert.equal(states.filter((s) => s === "open").length, 256);
      const metrics = await (await fetch(`${server.url}/metrics`)).text();
      assert.match(metrics, /perch_webrtc_streams_refused_total 44/);
      // The open ones serve HTTP: one request on each.
      const { ChannelStream } = await import("../src/protocol/channel.ts");
      const open = channels.filter((dc) => dc.readyState === "open");
      const statuses = await Promise.all(
        open.map(async (dc) => {
          const port = {
            label: dc.label,
            send: (d: Uint8Array) => dc.send(new Uint8Array(d) as Uint8Array<ArrayBuffer>),
            bufferedAmount: () => dc.bufferedAmount,
            close: () => dc.close(),
            attach(sink: { message(d: Uint8Array): void; closed(): void; drained(): void }) {
              dc.binaryType = "arraybuffer";
              dc.onmessage = (e) => sink.message(new Uint8Array(e.data as ArrayBuffer));
              dc.onclose = () => sink.closed();
            },
          };
          const { raw } = await rawExchange(new ChannelStream(port), ["GET /me HTTP/1.1\r\nHost: perch\r\n\r\n"], 10_000);
          return parseRawResponse(raw)?.status;
        }),
      );
      assert.deepEqual(new Set(statuses), new Set([200]));
      // Every slot is given back (once the closes have gone round): new streams work.
      await eventually(async () => (await conn.http(1, "GET", "/me").catch(() => undefined))?.status === 200, 3_000, "a free slot");
      assert.equal((await conn.ping()).serverTime > 0, true);
    } finally {
      conn.close();
    }
  });

  test("closing the event stream closes the connection and marks the peer offline (a close seen, not liveness)", async () => {
    const conn = await connect(server);
    const held = await eventually(() => server.transport!.connection(conn.publicKey)?.active && server.transport!.connection(conn.publicKey));
    const open = await conn.openStream(1);
    const events = (conn as unknown as { events: RTCDataChannel }).events;
    events.close();
    await conn.closed();
    await eventually(() => server.transport!.size === 0, 5_000, "the connection to be dropped");
    // The node sees the event stream close, or the device (the SDK closes its peer connection then) leave first.
    assert.ok(held.closeReason === "event stream closed" || held.closeReason === "connection closed", held.closeReason);
    await eventually(async () => !(await server.domain.peers.runtime(conn.publicKey)).online, 5_000, "offline");
    // The device's side learns of it from its own channel's close, which wrtc reports in its own time.
    await eventually(() => open.destroyed || open.readableEnded, 5_000, "the device's stream on the closed connection ended");
  });
});

/** Writes `bytes` on a raw stream 0 and collects the frames that come back until the server closes it (or `timeoutMs`). */
async function rawRpc(conn: PerchConnection, bytes: Buffer[], timeoutMs = 5_000): Promise<{ frames: Frame[]; closed: boolean }> {
  const decoder = new FrameDecoder();
  const frames: Frame[] = [];
  const closed = await exchangeOn(await conn.openStream(0), bytes, (chunk) => frames.push(...decoder.push(chunk)), timeoutMs);
  return { frames, closed };
}

const request = (o: { id?: string; method: number; payload?: Uint8Array }) =>
  encodeFrame(FrameType.BINARY, toBinary(RpcRequestSchema, create(RpcRequestSchema, { id: o.id ?? "", method: o.method as RpcMethod, payload: o.payload })));
const END = encodeFrame(FrameType.END);

function response(frames: Frame[]) {
  assert.equal(frames[0]?.type, FrameType.BINARY, "a response envelope");
  assert.equal(frames.at(-1)?.type, FrameType.END, "end-of-stream last");
  return fromBinary(RpcResponseSchema, frames[0]!.payload);
}

describe("a hostile device on Peer RPC (stream 0)", () => {
  let server: TestServer;
  let conn: PerchConnection;
  before(async () => {
    // A short request deadline (default 10 s): the requests that never finish are closed sooner.
    server = await startTestServer({ config: { webrtc: { rpc_request_timeout_ms: 2_000 } } });
    conn = await connect(server);
  });
  after(async () => {
    conn?.close();
    await server.stop();
  });

  test("no id, a reused id, an unknown method, an undecodable envelope: answers, never a crash", async () => {
    const noId = response((await rawRpc(conn, [request({ method: RpcMethod.ALL_PING, payload: rpcPayload.ping() }), END])).frames);
    assert.equal(noId.id, "");
    assert.equal(noId.body.case, "payload");
    for (let i = 0; i < 2; i++) {
      const again = response((await rawRpc(conn, [request({ id: "same", method: RpcMethod.ALL_PING }), END])).frames);
      assert.deepEqual([again.id, again.body.case], ["same", "payload"]);
    }
    const unknown = response((await rawRpc(conn, [request({ id: "u", method: 4242 }), END])).frames);
    assert.deepEqual([unknown.body.case, unknown.body.value && "code" in unknown.body.value && unknown.body.value.code], ["error", RpcCode.METHOD_NOT_FOUND]);
    // A method the device should provide, not the server.
    const wrongSide = response((await rawRpc(conn, [request({ id: "c", method: RpcMethod.CLIENT_INFO_GET }), END])).frames);
    assert.equal(wrongSide.body.case === "error" && wrongSide.body.value.code, RpcCode.METHOD_NOT_FOUND);
    const garbage = response((await rawRpc(conn, [encodeFrame(FrameType.BINARY, Buffer.from([0xff, 0xff, 0xff, 0x0f])), END])).frames);
    assert.equal(garbage.body.case === "error" && garbage.body.value.code, RpcCode.PARSE);
    const badParams = response((await rawRpc(conn, [request({ id: "p", method: RpcMethod.SERVER_INFO_PUT, payload: Buffer.from([0xff]) }), END])).frames);
    assert.equal(badParams.body.case === "error" && badParams.body.value.code, RpcCode.INVALID_PARAMS);
  });

  test("malformed framing closes only its stream: an unknown type, a JSON frame, an end-of-stream with a payload, end before an envelope", async () => {
    const cases: Buffer[][] = [
      [Buffer.from([0, 0, 9, 0])],
      [encodeFrame(FrameType.JSON, Buffer.from("{}")), END],
      [Buffer.from([1, 0, 0, 0, 0x41])],
      [END],
      [request({ method: RpcMethod.ALL_PING }), encodeFrame(FrameType.CONTINUATION, Buffer.from([1])), END],
    ];
    for (const bytes of cases) {
      const r = await rawRpc(conn, bytes);
      assert.ok(r.closed, bytes.map((b) => b.toString("hex")).join(" "));
      assert.equal(r.frames.length, 0);
    }
    assert.ok((await conn.ping()).serverTime > 0);
  });

  test("a speed test asking for 10 GB is refused; one within the cap runs", async () => {
    await assert.rejects(
      conn.call(RpcMethod.ALL_SPEED_TEST_RUN, rpcPayload.speedTest(10 * 1024 ** 3, 0)),
      (e: unknown) => e instanceof RpcError && e.code === RpcCode.INVALID_PARAMS,
    );
    await assert.rejects(
      conn.call(RpcMethod.ALL_SPEED_TEST_RUN, rpcPayload.speedTest(0, 10 * 1024 ** 3)),
      (e: unknown) => e instanceof RpcError && e.code === RpcCode.INVALID_PARAMS,
    );
    await assert.rejects(
      conn.call(RpcMethod.ALL_SPEED_TEST_RUN, rpcPayload.speedTest(-1, 0)),
      (e: unknown) => e instanceof RpcError && e.code === RpcCode.INVALID_PARAMS,
    );
    const ok = await conn.speedTest(64 * 1024, 0);
    assert.equal(ok.down, 64 * 1024);
  });

  test("speed tests run one at a time per connection: 256 streams cannot multiply the 64 MiB cap", async () => {
    const results = await Promise.allSettled(Array.from({ length: 4 }, () => conn.speedTest(16 * 1024 * 1024, 0)));
    const ok = results.filter((r) => r.status === "fulfilled");
    const refused = results.flatMap((r) => (r.status === "rejected" ? [r.reason] : []));
    assert.equal(ok.length, 1, JSON.stringify(refused.map(String)));
    for (const e of refused) assert.ok(e instanceof RpcError && e.code === 409, String(e));
    // Once it is over, the next one runs.
    assert.equal((await conn.speedTest(1024, 1024)).down, 1024);
  });

  test("requests that never finish (a frame cut short, a huge declared length, no end-of-stream) are held open, then closed by the server at its deadline", {
    timeout: 20_000,
  }, async () => {
    const held = await eventually(() => server.transport!.connection(conn.publicKey));
    const rpcStreams = () => held.census().open.rpc;
    const settled: boolean[] = [false, false, false, false];
    const pending = [
      rawRpc(conn, [Buffer.from([10, 0, 2, 0, 1, 2, 3])], 15_000),
      rawRpc(conn, [Buffer.from([0xff, 0xff, 2, 0]), Buffer.alloc(1000)], 15_000),
      rawRpc(conn, [request({ method: RpcMethod.ALL_PING })], 15_000),
      rawRpc(conn, [], 15_000),
    ].map((p, i) => p.finally(() => (settled[i] = true)));
    // The server holds the four while it answers another call in full: it waits for a request to
    // complete rather than closing a stream whose request has not (yet) arrived whole.
    await eventually(() => rpcStreams() === 4, 5_000, "the four streams open on the server");
    assert.ok((await conn.ping()).serverTime > 0);
    // The call's own stream closes on its turn: the four are what is left.
    await eventually(() => rpcStreams() === 4, 5_000, "the four streams still open on the server after a whole call on another stream");
    assert.deepEqual(settled, [false, false, false, false], "none closed yet");
    // Then its deadline (webrtc.rpc_request_timeout_ms) closes them, with no answer.
    const results = await Promise.all(pending);
    for (const r of results) {
      assert.ok(r.closed, "closed by the server (the 15 s wait here would report closed: false)");
      assert.equal(r.frames.length, 0);
    }
    await eventually(() => rpcStreams() === 0, 5_000, "no stream left open on the server");
    assert.ok((await conn.ping()).serverTime > 0);
  });

  test("calls after the connection closed fail at once, on both sides", async () => {
    const other = await connect(server);
    const held = await eventually(() => server.transport!.connection(other.publicKey)?.active && server.transport!.connection(other.publicKey));
    other.close();
    await other.closed();
    await assert.rejects(other.ping());
    await eventually(() => !held.active);
    await assert.rejects(held.call(RpcMethod.ALL_PING, rpcPayload.ping()), /not active/);
  });
});

/** A Side Control client for the device behind `conn` (over TCP, as a companion app would be). */
async function sideControl(server: TestServer, conn: PerchConnection): Promise<PerchClient> {
  const device = new PerchClient({ baseUrl: server.url, keyPair: conn.keyPair });
  await device.login();
  const token = await device.createDeviceToken();
  const phone = server.client();
  await phone.login({ deviceToken: token.token });
  return phone;
}

/** The telemetry counters of /metrics: accepted frames and drops by reason. */
async function telemetryCounters(server: TestServer): Promise<{ frames: number; dropped: Record<string, number> }> {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const frames = Number(/^perch_telemetry_frames_total (\d+)/m.exec(text)?.[1] ?? 0);
  const dropped: Record<string, number> = {};
  for (const m of text.matchAll(/^perch_telemetry_frames_dropped_total\{reason="(\w+)"\} (\d+)/gm)) dropped[m[1]!] = Number(m[2]);
  return { frames, dropped };
}

const battery = (percent: number, at = Date.now()) => ({
  observedAtUnixMs: BigInt(at),
  observations: [{ observedAtDeltaMs: 0, body: { case: "battery" as const, value: { percent } } }],
});

/** A peer removed while connected: its frames are skipped, the other peer's in the same batches stored. */
async function removedPeerTelemetry(server: TestServer): Promise<void> {
  const removed = await connect(server);
  const other = await connect(server);
  try {
    await eventually(() => server.transport!.connection(removed.publicKey)?.active && server.transport!.connection(other.publicKey)?.active);
    // The operator removes the peer from another process while it is connected.
    assert.equal(await server.domain.peers.remove(removed.publicKey), true);
    for (let i = 0; i < 3; i++) {
      // The node cuts the removed peer off at once: its frames race the close, or cannot be sent at all.
      try {
        removed.sendTelemetry(battery(11));
      } catch {}
      other.sendTelemetry(battery(22 + i));
      // Each round stored before the next is sent (a batch of its own), rather than a pause between them.
      await eventually(
        async () => (await server.domain.telemetry.latest(other.publicKey, undefined)).values[0]?.value === 22 + i,
        10_000,
        `the other peer's frame ${i + 1} stored`,
      );
    }
    assert.equal(await server.store.read((r) => r.peers.get(removed.publicKey)), undefined, "the removed peer is not recreated by telemetry");
  } finally {
    removed.close();
    other.close();
  }
}

describe("a hostile device sending telemetry packets", () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer();
  });
  after(async () => {
    await server.stop();
  });

  const send = (conn: PerchConnection, bytes: Uint8Array) => (conn as unknown as { packets: RTCDataChannel }).packets.send(new Uint8Array(bytes));

  test("invalid packets are counted by reason and store nothing; the valid one is visible to Side Control", async () => {
    const conn = await connect(server);
    try {
      const before = await telemetryCounters(server);
      const now = Date.now();
      send(conn, new Uint8Array(0));
      send(conn, new Uint8Array([0x40]));
      send(conn, new Uint8Array([0x41, 1, 2, 3]));
      send(conn, new Uint8Array([0x40, 0x0a, 0xff]));
      conn.sendTelemetry(battery(101, now));
      conn.sendTelemetry({
        observedAtUnixMs: BigInt(now),
        observations: [{ observedAtDeltaMs: 0, body: { case: "gnss", value: { latitude: 91, longitude: 0 } } }],
      });
      conn.sendTelemetry({ observedAtUnixMs: BigInt(now), observations: [{ observedAtDeltaMs: 0, body: { case: "battery", value: { voltageMv: -1 } } }] });
      conn.sendTelemetry({
        observedAtUnixMs: BigInt(now),
        observations: [{ observedAtDeltaMs: 0, body: { case: "system", value: { temperatureC: Number.NaN } } }],
      });
      conn.sendTelemetry(battery(50, now + 25 * 3_600_000));
      conn.sendTelemetry(battery(50, -5));
      conn.sendTelemetry({ observedAtUnixMs: BigInt(now), observations: [{ observedAtDeltaMs: 0 }] });
      conn.sendTelemetry({
        observedAtUnixMs: 9_223_372_036_854_775_807n,
        observations: [{ observedAtDeltaMs: 2_000_000_000, body: { case: "battery", value: { percent: 3 } } }],
      });
      // One invalid observation spoils the frame.
      conn.sendTelemetry({
        observedAtUnixMs: BigInt(now),
        observations: [
          { observedAtDeltaMs: 0, body: { case: "battery", value: { percent: 10 } } },
          { observedAtDeltaMs: 0, body: { case: "gnss", value: { latitude: 0, longitude: 181 } } },
        ],
      });
      conn.sendTelemetry(battery(42, now));
      const after = await eventually(async () => {
        const c = await telemetryCounters(server);
        const drops = Object.values(c.dropped).reduce((a, b) => a + b, 0) - Object.values(before.dropped).reduce((a, b) => a + b, 0);
        return c.frames - before.frames >= 1 && drops >= 13 ? c : undefined;
      });
      const delta = (reason: string) => (after.dropped[reason] ?? 0) - (before.dropped[reason] ?? 0);
      assert.deepEqual(
        {
          empty: delta("empty"),
          unknown_type: delta("unknown_type"),
          undecodable: delta("undecodable"),
          out_of_range: delta("out_of_range"),
          non_finite: delta("non_finite"),
          future: delta("future"),
        },
        { empty: 3, unknown_type: 1, undecodable: 1, out_of_range: 6, non_finite: 1, future: 1 },
      );
      assert.equal(after.frames - before.frames, 1);
      const phone = await sideControl(server, conn);
      const latest = await eventually(async () => {
        const l = await phone.sideControl.telemetryLatest();
        return l.values.length > 0 ? l : undefined;
      });
      assert.deepEqual(
        latest.values.map((v) => [v.field, v.value]),
        [["battery.percent", 42]],
      );
    } finally {
      conn.close();
    }
  });

  test("a removed peer's telemetry does not take other peers' frames down with it", () => removedPeerTelemetry(server));

  test("a frame sent the moment a new device is connected is stored", async () => {
    for (let i = 0; i < 3; i++) {
      const conn = await connect(server);
      try {
        conn.sendTelemetry(battery(60 + i));
        await eventually(async () => (await server.domain.telemetry.latest(conn.publicKey, undefined)).values.length > 0, 3_000, "the first frame");
      } finally {
        conn.close();
      }
    }
  });
});

describe("the telemetry limit runs on the node's injected clock", () => {
  // With time frozen no token comes back, whatever the machine's load.
  const at = Date.now();
  let still: TestServer;
  before(async () => {
    still = await startTestServer({ clock: { now: () => at } });
  });
  after(async () => {
    await still.stop();
  });

  test("1000 frames at once, the node's clock standing still: the burst of 200 is taken, 800 counted as rate_limited", async () => {
    const conn = await connect(still, { now: () => at });
    try {
      await eventually(() => still.transport!.connection(conn.publicKey)?.active);
      for (let i = 0; i < 1000; i++) conn.sendTelemetry(battery(i % 100, at - 1000 + i));
      const after = await eventually(async () => {
        const c = await telemetryCounters(still);
        return c.frames + (c.dropped.rate_limited ?? 0) >= 1000 ? c : undefined;
      });
      assert.deepEqual([after.frames, after.dropped.rate_limited], [200, 800]);
      await eventually(async () => (await still.domain.telemetry.latest(conn.publicKey, undefined)).values.length > 0);
    } finally {
      conn.close();
    }
  });
});

describe("hostile offers", () => {
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

  const post = async (variant: string) => {
    const keyPair = generateKeyPair();
    const s = sealOffer(serverKey, keyPair, variant);
    const res = await postOffer(server.url, s.headers, s.body);
    const body = new Uint8Array(await res.arrayBuffer());
    return { status: res.status, body, exchange: s.exchange, publicKey: encodeKey(keyPair.publicKey) };
  };

  test("a device whose offer has 100 audio sections connects and works", async () => {
    const Base = wrtc.RTCPeerConnection as unknown as typeof RTCPeerConnection;
    class Crowded extends Base {
      constructor(config?: RTCConfiguration) {
        super(config);
        for (let i = 0; i < 99; i++) this.addTransceiver("audio", { direction: i % 2 ? "recvonly" : "sendrecv" });
      }
    }
    const conn = await connect(server, { rtc: { ...(wrtc as unknown as { RTCPeerConnection: typeof RTCPeerConnection }), RTCPeerConnection: Crowded } });
    try {
      assert.equal(conn.pc.getTransceivers().length, 100);
      assert.equal((await conn.http(1, "GET", "/me")).status, 200);
      assert.ok((await conn.ping()).serverTime > 0);
    } finally {
      conn.close();
    }
    await eventually(() => server.transport!.size === 0, 3_000);
  });

  test("two offers of one key racing: one connection wins, none leaks", async () => {
    const keyPair = generateKeyPair();
    const results = await Promise.allSettled([connect(server, { keyPair }), connect(server, { keyPair })]);
    const conns = results.flatMap((r) => (r.status === "fulfilled" ? [r.value] : []));
    try {
      // The winner may still be activating (it waits for the loser's close, then for its address).
      await eventually(() => server.transport!.connection(encodeKey(keyPair.publicKey))?.active, 5_000, "an active winner");
      await eventually(() => server.transport!.size === 1, 5_000, "one connection left");
      assert.equal((await server.domain.peers.runtime(encodeKey(keyPair.publicKey))).online, true);
      const alive = await eventually(
        async () => {
          const open = [];
          for (const c of conns) if ((await c.http(1, "GET", "/me").catch(() => undefined))?.status === 200) open.push(c);
          return open.length === 1 ? open : undefined;
        },
        5_000,
        "exactly one working connection",
      );
      assert.equal(alive.length, 1);
    } finally {
      for (const c of conns) c.close();
    }
    await eventually(() => server.transport!.size === 0, 3_000);
    await eventually(async () => !(await server.domain.peers.runtime(encodeKey(keyPair.publicKey))).online, 2_000, "offline");
  });

  test("offers never followed by a connection (plain, trickle-only, 100 m-lines, 250 KiB) are answered, free their slot after 10 s and mark nothing online", {
    timeout: 30_000,
  }, async () => {
    const audio = /m=audio[\s\S]*?(?=m=application)/.exec(sdp)![0];
    const extra = Array.from({ length: 98 }, (_, i) => audio.replace(/a=mid:0/, `a=mid:${i + 2}`).replace(/a=ssrc:[^\r\n]*\r\n/g, "")).join("");
    const hundred = `${sdp}${extra}`;
    const bundled = hundred.replace("a=group:BUNDLE 0 1", `a=group:BUNDLE 0 1 ${Array.from({ length: 98 }, (_, i) => i + 2).join(" ")}`);
    const pad = Array.from({ length: (250 * 1024) / 64 }, (_, i) => `a=x-pad-${i}:${"p".repeat(50)}\r\n`)
      .join("")
      .slice(0, 250 * 1024 - sdp.length);
    const large = sdp.replace("t=0 0\r\n", `t=0 0\r\n${pad}`);
    assert.ok(large.length >= 249 * 1024 && large.length < 256 * 1024 - 16, String(large.length));
    const trickle = sdp.replace(/a=candidate:[^\r\n]*\r\n/g, "");
    const sizeBefore = server.transport!.size;
    const offers = [];
    for (const variant of [sdp, trickle, hundred, bundled, large]) offers.push(await post(variant));
    for (const o of offers) assert.equal(o.status, 200, Buffer.from(o.body).toString());
    assert.equal(server.transport!.size, sizeBefore + offers.length);
    await eventually(() => server.transport!.size === sizeBefore, 13_000, "the event-stream deadline");
    for (const o of offers) {
      assert.equal((await server.domain.peers.runtime(o.publicKey)).online, false);
      // Answered offers passed every check: their keys are registered (so that an operator can block a device the moment it connects).
      assert.equal((await server.store.read((r) => r.peers.get(o.publicKey)))?.status, "active");
    }
  });
});

/**
 * Counts the work of the real Opus encoder (libopus, which tones are encoded with): its own
 * methods, wrapped and still run, recording which encoder did what.
 */
function opusEncoderSpy() {
  const encode = mock.method(LibOpus.prototype, "encode");
  const release = mock.method(LibOpus.prototype, "close");
  return {
    /** Frames encoded by each encoder, in the order the encoders first encoded. */
    perEncoder(): Map<object, number> {
      const counts = new Map<object, number>();
      for (const call of encode.mock.calls) counts.set(call.this as object, (counts.get(call.this as object) ?? 0) + 1);
      return counts;
    },
    released(encoder: object): boolean {
      return release.mock.calls.some((call) => call.this === encoder);
    },
    restore() {
      encode.mock.restore();
      release.mock.restore();
    },
  };
}

describe("a hostile device asking for test tones", () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer();
  });
  after(async () => {
    await server.stop();
  });

  test("a tone is encoded frame by frame as it is taken, never up front; stopped early, its encoder is released", () => {
    const spy = opusEncoderSpy();
    try {
      const frames = toneFrames(440, 10_000);
      assert.equal(spy.perEncoder().size, 0, "making a 10 s tone encodes nothing");
      const decoder = new LibOpus("audio");
      try {
        for (let taken = 1; taken <= 3; taken++) {
          const frame = frames.next();
          assert.equal(frame.done, false);
          assert.deepEqual([...spy.perEncoder().values()], [taken], "one frame encoded per frame taken");
          const pcm = decoder.decode(frame.value as Buffer);
          let energy = 0;
          for (const x of pcm) energy += x ** 2;
          assert.ok(Math.sqrt(energy / pcm.length) > 1_000, "a frame of the tone, not silence");
        }
      } finally {
        decoder.close();
      }
      const [encoder] = spy.perEncoder().keys();
      assert.equal(spy.released(encoder!), false);
      frames.return();
      assert.equal(spy.released(encoder!), true, "stopped after 3 of 500 frames: the encoder is released");
      assert.deepEqual([...spy.perEncoder().values()], [3], "and the other 497 frames never encoded");
    } finally {
      spy.restore();
    }
  });

  // How long the event loop is held while 20 tones play at once: `npm run bench -- webrtc-health` (docs/benchmarks.md).
  test("20 requests for a 10 s tone at once: each 202; each tone replaced by the next was encoded only as far as it played", async () => {
    const conn = await connect(server);
    const spy = opusEncoderSpy();
    try {
      const tone = () =>
        conn.http(1, "POST", "/me/audio/tone", {
          body: JSON.stringify({ frequency_hz: 440 + Math.random(), duration_ms: 10_000 }),
          headers: { "content-type": "application/json" },
        });
      const results = await Promise.all(Array.from({ length: 20 }, tone));
      assert.deepEqual(new Set(results.map((r) => r.status)), new Set([202]));
      assert.equal(results[0]!.json<{ frames: number }>().frames, 500);
      // A tone replaces the one under way on the connection's track: 20 encoders, each started
      // before its 202; the 19 replaced ones released with a fraction of their 500 frames encoded
      // (encoding up front would have encoded all 10,000 frames before answering).
      const encoders = [...spy.perEncoder()];
      assert.equal(encoders.length, 20, "one encoder per tone, each started before its 202");
      const replaced = encoders.filter(([encoder, frames]) => spy.released(encoder) && frames < 500);
      assert.ok(replaced.length >= 19, `encoded frames per tone: ${encoders.map(([, n]) => n).join(", ")}`);
      await eventually(() => conn.audio.audible > 10, 5000, "audible audio");
    } finally {
      spy.restore();
      conn.close();
    }
  });
});

describe("telemetry of a removed peer on PostgreSQL", { skip: TEST_DATABASE_URL ? false : "PERCH_TEST_DATABASE_URL is not set" }, () => {
  test("a removed peer's telemetry does not take other peers' frames down with it", async () => {
    const server = await startTestServer({ config: { database_url: await freshPostgresDatabase() } });
    try {
      await removedPeerTelemetry(server);
    } finally {
      await server.stop();
    }
  });
});
