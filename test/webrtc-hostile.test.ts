import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { ChannelStream } from "../src/protocol/channel.ts";
import type { PerchConnection } from "../src/sdk/webrtc.ts";
import { parseRawResponse } from "./support/raw-http.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { connect, eventually } from "./support/webrtc.ts";

/** Sends `pieces` on `stream`, each as its own DataChannel message, and collects the answer until the stream closes (or `timeoutMs`). */
function rawExchange(stream: ChannelStream, pieces: Array<string | Buffer>, timeoutMs = 5_000): Promise<{ raw: string; closed: boolean }> {
  return new Promise((resolve) => {
    let raw = "";
    let done = false;
    const finish = (closed: boolean) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      stream.destroy();
      resolve({ raw, closed });
    };
    const timer = setTimeout(() => finish(false), timeoutMs);
    stream.on("data", (chunk: Buffer) => (raw += chunk.toString("utf8")));
    stream.once("end", () => finish(true));
    stream.once("close", () => finish(true));
    for (const piece of pieces) stream.port.send(typeof piece === "string" ? Buffer.from(piece) : piece);
  });
}

describe("a hostile device over HTTP streams 1 and 2", () => {
  let server: TestServer;
  let conn: PerchConnection;
  before(async () => {
    server = await startTestServer({ config: { http: { requestTimeoutMs: 1_000, maxConnections: 10_000 } } });
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
    const started = Date.now();
    const { raw, closed } = await rawExchange(await conn.openStream(1), ["GET /me HTTP/1.1\r\nHost: perch\r\n"], 6_000);
    assert.ok(closed, "the stream is closed by the server");
    assert.equal(parseRawResponse(raw)?.status, 408, raw);
    assert.ok(Date.now() - started < 5_000);
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
    await new Promise((r) => setTimeout(r, 200));
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
    const big = JSON.stringify({ volume: 13, pad: "x".repeat(20 * 1024) });
    const large = await rawExchange(await conn.openStream(1), [
      `PUT /me/status HTTP/1.1\r\nHost: perch\r\nContent-Type: application/json\r\nContent-Length: ${big.length}\r\nConnection: close\r\n\r\n${big}`,
    ]);
    assert.ok([200, 400].includes(parseRawResponse(large.raw)?.status ?? 0), large.raw);
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
