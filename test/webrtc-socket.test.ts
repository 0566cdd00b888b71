import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { StreamSocket } from "../src/protocol/stream-socket.ts";
import type { PerchConnection } from "../src/sdk/webrtc.ts";
import { watchCrashes } from "./support/crashes.ts";
import { parseRawResponse } from "./support/raw-http.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { UdpRelay } from "./support/udp-relay.ts";
import { connect, eventually } from "./support/webrtc.ts";

/** Collects what comes back on `stream` (its raw bytes) and whether the server closed it. */
function collect(stream: StreamSocket): { raw: () => string; closed: Promise<void> } {
  let raw = "";
  stream.on("data", (chunk: Buffer) => (raw += chunk.toString("utf8")));
  const closed = new Promise<void>((resolve) => {
    stream.once("end", resolve);
    stream.once("close", resolve);
  });
  return { raw: () => raw, closed };
}

/** The server side of `conn`: its connection object, once active. */
const held = (server: TestServer, conn: PerchConnection) =>
  eventually(() => server.transport!.connection(conn.publicKey)?.active && server.transport!.connection(conn.publicKey));

/**
 * @hono/node-server waits this long for the unread rest of a request body after the response,
 * then calls the socket's `destroySoon` from a timer (its DRAIN_TIMEOUT_MS, not exported).
 */
const HONO_DRAIN_MS = 500;

const partial = (method: string, path: string) =>
  `${method} ${path} HTTP/1.1\r\nHost: perch\r\nContent-Type: application/json\r\nContent-Length: 40000000\r\n\r\n{"volume":`;

describe("an HTTP stream is a whole socket to Node's HTTP server and Hono's adapter", () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer({ config: { http: { request_timeout_ms: 1_000, max_connections: 10_000 } } });
  });
  after(async () => {
    await server.stop();
  });

  test("/metrics: Node's process figures, connections by state and streams by service and state", async () => {
    const device = await connect(server);
    try {
      const connection = await held(server, device);
      const streams = await Promise.all([device.openStream(1), device.openStream(1), device.openStream(2)]);
      for (const s of streams.slice(0, 2))
        s.port.send(Buffer.from("PUT /me/status HTTP/1.1\r\nHost: perch\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"));
      streams[2]!.port.send(
        Buffer.from("POST /v1/chat/completions HTTP/1.1\r\nHost: perch\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"),
      );
      await eventually(() => connection.openStreams === 3, 5_000, "the streams at the server");
      const text = await (await fetch(`${server.url}/metrics`)).text();
      for (const name of [
        "process_resident_memory_bytes",
        "nodejs_heap_size_used_bytes",
        "nodejs_eventloop_lag_p99_seconds",
        "nodejs_active_handles_total",
        "process_open_fds",
      ]) {
        assert.match(text, new RegExp(`^${name}(\\{[^}]*\\})? \\d`, "m"), name);
      }
      // The GC histogram has samples only once a collection ran, which a young process may not have.
      assert.match(text, /^# TYPE nodejs_gc_duration_seconds histogram$/m);
      assert.match(text, /^perch_webrtc_connections_by_state\{state="active"\} 1$/m);
      assert.match(text, /^perch_webrtc_connections_by_state\{state="pending"\} 0$/m);
      assert.match(text, /^perch_webrtc_streams\{service="public",state="open"\} 2$/m);
      assert.match(text, /^perch_webrtc_streams\{service="compatible",state="open"\} 1$/m);
      for (const s of streams) s.destroy();
      await eventually(() => connection.openStreams === 0, 5_000, "the streams closed");
      const after = await (await fetch(`${server.url}/metrics`)).text();
      assert.match(after, /^perch_webrtc_streams\{service="public",state="open"\} 0$/m);
    } finally {
      device.close();
    }
  });

  test("partial bodies answered early while a speed test fills the link and the way back is cut: the node stays up, serves others, and releases the streams", async () => {
    const relay = await UdpRelay.start();
    const device = await connect(server, { rtc: relay.rtc() });
    const other = await connect(server);
    const crashes = watchCrashes();
    try {
      const connection = await held(server, device);
      // A download on stream 0 keeps the association's queue full: the early answers wait behind it.
      const download = device.speedTest(8 * 1024 * 1024, 0);
      await eventually(() => connection.link.bytes().tx > 1024 * 1024, 10_000, "the download under way");
      const streams = await Promise.all([device.openStream(1), device.openStream(2)]);
      const exchanges = streams.map(collect);
      relay.cut("to-device");
      streams[0]!.port.send(Buffer.from(partial("PUT", "/me/status")));
      streams[1]!.port.send(Buffer.from(partial("POST", "/v1/chat/completions")));
      await eventually(() => connection.openStreams >= 3, 5_000, "the requests at the server");
      // Past Hono's drain wait: its timer has called destroySoon on both sockets (this used to end the process).
      await new Promise((r) => setTimeout(r, HONO_DRAIN_MS * 2));
      assert.equal((await other.http(1, "GET", "/me")).status, 200, "the node serves other devices");
      relay.restore();
      await Promise.all(exchanges.map((e) => e.closed));
      assert.deepEqual(
        exchanges.map((e) => parseRawResponse(e.raw())?.status),
        [413, 413],
      );
      assert.equal((await download).down, 8 * 1024 * 1024);
      await eventually(() => connection.openStreams === 0, 5_000, "every stream released");
      assert.equal((await device.http(1, "GET", "/me")).status, 200);
      assert.deepEqual(crashes.errors, []);
    } finally {
      crashes.stop();
      device.close();
      other.close();
      relay.close();
    }
  });

  test("a device leaving mid-body (its stream closed, then its connection cut) costs only its own streams", async () => {
    const relay = await UdpRelay.start();
    const device = await connect(server, { rtc: relay.rtc() });
    const crashes = watchCrashes();
    try {
      const connection = await held(server, device);
      const aborted = await device.openStream(1);
      aborted.port.send(Buffer.from("PUT /me/status HTTP/1.1\r\nHost: perch\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"));
      await eventually(() => connection.openStreams === 1, 5_000, "the request at the server");
      aborted.destroy();
      await eventually(() => connection.openStreams === 0, 5_000, "the aborted stream released");
      // Now half a body, and the device is gone without a word.
      const stranded = await Promise.all([device.openStream(1), device.openStream(2)]);
      stranded[0]!.port.send(Buffer.from("PUT /me/status HTTP/1.1\r\nHost: perch\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"));
      stranded[1]!.port.send(
        Buffer.from("POST /v1/chat/completions HTTP/1.1\r\nHost: perch\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"),
      );
      await eventually(() => connection.openStreams === 2, 5_000, "the requests at the server");
      relay.cut("both");
      // The request timeout (1 s here) answers both with a 408 nobody reads, and closes their streams.
      await eventually(() => connection.openStreams === 0, 5_000, "the stranded streams released");
      const other = await connect(server);
      try {
        assert.equal((await other.http(1, "GET", "/me")).status, 200);
      } finally {
        other.close();
      }
      await connection.close("connection closed");
      assert.equal(connection.openStreams, 0);
      assert.deepEqual(crashes.errors, []);
    } finally {
      crashes.stop();
      device.close();
      relay.close();
    }
  });
});
