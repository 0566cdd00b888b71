/**
 * What Node answers before the app runs (bad framing, timeouts, oversized headers), requests their
 * clients abandon, and the bounds on request time and connections: over raw TCP.
 */
import assert from "node:assert/strict";
import type { Socket } from "node:net";
import { type Duplex, duplexPair } from "node:stream";
import { after, before, describe, test } from "node:test";
import pino from "pino";
import type { PerchClient } from "../src/sdk/client.ts";
import { exchange, parseRawResponse, type RawResponse, tcp } from "./support/raw-http.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { eventually } from "./support/webrtc.ts";

const REQUEST_ID = /^[A-Za-z0-9._-]{1,128}$/;

function expectEnvelope(res: RawResponse | undefined, status: number, code: string, what: string): void {
  assert.ok(res, `${what}: no response`);
  assert.equal(res.status, status, `${what}: ${JSON.stringify(res)}`);
  assert.equal(res.headers["content-type"], "application/json; charset=utf-8", what);
  assert.match(res.headers["x-request-id"] ?? "", REQUEST_ID, what);
  assert.equal(res.headers.connection?.toLowerCase(), "close", what);
  const body = JSON.parse(res.body) as { error: { code: string; message: string } };
  assert.deepEqual(Object.keys(body), ["error"], what);
  assert.equal(body.error.code, code, what);
  assert.ok(body.error.message.length > 0, what);
}

/** Prometheus samples of perch_http_requests_total as "method route status" → count. */
async function requestCounts(server: TestServer): Promise<Map<string, number>> {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const out = new Map<string, number>();
  for (const m of text.matchAll(/^perch_http_requests_total\{method="([^"]*)",route="([^"]*)",status="(\d+)"\} (\d+)$/gm)) {
    out.set(`${m[1]} ${m[2]} ${m[3]}`, Number(m[4]));
  }
  return out;
}

describe("HTTP framing errors", () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer();
  });
  after(() => server.stop());

  test("400 malformed, 431 oversized headers, 400 bad target: the ErrorResponse envelope, a request id, Connection: close", async () => {
    const cases: Array<[string, string, number, string]> = [
      ["not HTTP", "HELLO THERE\r\n\r\n", 400, "INVALID_REQUEST"],
      ["bad header line", "GET /healthz HTTP/1.1\r\nHost: x\r\nNo colon here\r\n\r\n", 400, "INVALID_REQUEST"],
      ["bad chunk size", "PUT /me/status HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400, "INVALID_REQUEST"],
      ["backslash in the path", "GET /a\\b HTTP/1.1\r\nHost: x\r\n\r\n", 400, "INVALID_REQUEST"],
      ["no Host header", "GET /healthz HTTP/1.1\r\n\r\n", 400, "INVALID_REQUEST"],
      ["two Host headers", "GET /healthz HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400, "INVALID_REQUEST"],
      ["two Host headers, one in another case, the same value", "GET /healthz HTTP/1.1\r\nHost: x\r\nhOST: x\r\n\r\n", 400, "INVALID_REQUEST"],
      ["two Host headers on an absolute target", "GET http://x/healthz HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400, "INVALID_REQUEST"],
      ["CONNECT", "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", 400, "INVALID_REQUEST"],
      ["an expectation other than 100-continue", "GET /healthz HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\n\r\n", 417, "EXPECTATION_FAILED"],
      ["headers over 16 KiB", `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${"a".repeat(20_000)}\r\n\r\n`, 431, "HEADERS_TOO_LARGE"],
    ];
    for (const [what, request, status, code] of cases) {
      const { raw, timedOut } = await exchange(await tcp(server.port), request);
      assert.equal(timedOut, false, `${what}: the connection is closed`);
      expectEnvelope(parseRawResponse(raw), status, code, what);
    }
    // The same over a stream served as service streams are (the HTTP server handed a connection), not a TCP socket.
    const [client, served] = duplexPair();
    for (const end of [client, served] as Array<Duplex & Record<string, unknown>>) {
      end.setTimeout = () => end;
      end.setNoDelay = () => end;
      end.setKeepAlive = () => end;
      end.ref = () => end;
      end.unref = () => end;
    }
    server.httpServer.emit("connection", served);
    const { raw } = await exchange(client, "GET /healthz HTTP/1.1\r\nHost: x\r\nHost: y\r\nConnection: close\r\n\r\n");
    expectEnvelope(parseRawResponse(raw), 400, "INVALID_REQUEST", "two Host headers over a served stream");
    // Nothing was counted as a server error, and the server still answers.
    for (const key of (await requestCounts(server)).keys()) assert.ok(!key.endsWith(" 500"), key);
    assert.equal((await fetch(`${server.url}/healthz`)).status, 200);
  });
});

describe("bounded request time and connections", () => {
  let server: TestServer;
  let device: PerchClient;
  before(async () => {
    server = await startTestServer({ config: { http: { request_timeout_ms: 400 } } });
    device = server.client();
    await device.login();
  });
  after(() => server.stop());

  test("408 REQUEST_TIMEOUT for headers or a body that do not arrive in time", async () => {
    // Headers that never end.
    let r = await exchange(await tcp(server.port), "GET /healthz HTTP/1.1\r\nHost: x\r\n");
    assert.equal(r.timedOut, false, "the server closed the connection (the client never gave up)");
    expectEnvelope(parseRawResponse(r.raw), 408, "REQUEST_TIMEOUT", "slow headers");

    // A body that stops half way.
    const status = await device.status();
    r = await exchange(await tcp(server.port), [
      `PUT /me/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${device.accessToken}\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n`,
      '{"volume":',
    ]);
    assert.equal(r.timedOut, false, "the server closed the connection (the client never gave up)");
    expectEnvelope(parseRawResponse(r.raw), 408, "REQUEST_TIMEOUT", "slow body");
    assert.deepEqual(await device.status(), status, "nothing written");
    // The half-sent PUT's handler has ended once the request is counted; none was a server error.
    const counts = await eventually(
      async () => {
        const c = await requestCounts(server);
        return [...c.keys()].some((k) => k.startsWith("PUT /me/status ")) ? c : undefined;
      },
      10_000,
      "the half-sent PUT counted",
    );
    for (const key of counts.keys()) assert.ok(!key.endsWith(" 500"), key);
  });

  test("connections over http.maxConnections are closed on arrival", async () => {
    // A server of its own: no client of this process holds a kept-alive connection to it.
    const s = await startTestServer({ config: { http: { max_connections: 2 } } });
    try {
      const held = [await tcp(s.port), await tcp(s.port)];
      try {
        // Each held connection is known to the server once it answered a request on it.
        for (const socket of held) {
          const answered = await exchangeKeepingOpen(socket, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
          assert.equal(answered, true, "a held connection is served");
        }
        const extra = await exchange(await tcp(s.port), "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 3_000);
        assert.equal(extra.timedOut, false, "the third connection is closed");
        assert.equal(extra.raw, "", "and gets no answer");
      } finally {
        for (const socket of held) socket.destroy();
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
      const again = await fetch(`${s.url}/healthz`, { headers: { connection: "close" } });
      assert.equal(again.status, 200, "a connection is accepted once others closed");
    } finally {
      await s.stop();
    }
  });
});

/** Writes `request` on `socket` and waits (at most 3 s) for the first bytes of an answer, leaving the connection open. */
function exchangeKeepingOpen(socket: Socket, request: string): Promise<boolean> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), 3_000);
    socket.once("data", () => {
      clearTimeout(timer);
      resolve(true);
    });
    socket.write(request);
  });
}

describe("requests their clients abandon", () => {
  test("a body cut off by its client is 499 in /metrics, never a 500, and nothing is logged as an error", async () => {
    let log = "";
    const logger = pino(
      { level: "trace" },
      {
        write: (line: string) => {
          log += line;
        },
      },
    );
    const server = await startTestServer({ logger });
    try {
      const device = server.client();
      await device.login();
      const head = `PUT /me/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${device.accessToken}\r\nContent-Type: application/json\r\n`;
      for (const request of [`${head}Transfer-Encoding: chunked\r\n\r\n5\r\n{"vol\r\n`, `${head}Content-Length: 40\r\n\r\n{"volume":`]) {
        const socket = await tcp(server.port);
        socket.write(request);
        await new Promise((resolve) => setTimeout(resolve, 100));
        socket.destroy();
      }
      // Both handlers have ended once both requests are counted, whatever their status.
      const counts = await eventually(
        async () => {
          const c = await requestCounts(server);
          const put = [...c.entries()].filter(([k]) => k.startsWith("PUT /me/status ")).reduce((n, [, v]) => n + v, 0);
          return put >= 2 ? c : undefined;
        },
        10_000,
        "both abandoned PUTs counted",
      );
      for (const key of counts.keys()) assert.ok(!key.endsWith(" 500"), key);
      assert.equal(counts.get("PUT /me/status 499"), 2, [...counts.keys()].join("; "));
      const lines = log
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l) as { level: number; msg: string; status?: number });
      assert.deepEqual(
        lines.filter((l) => l.level >= 50),
        [],
        "no error-level line",
      );
      assert.equal(lines.filter((l) => l.msg === "request" && l.status === 499).length, 2);
      assert.equal((await device.status()).volume, undefined, "nothing written");
    } finally {
      await server.stop();
    }
  });
});
