/**
 * The write timeout on a service stream's socket (a DataChannel, served by the same adapter as
 * TCP): it has no handle whose queue shows progress, so a whole answer the peer takes steadily,
 * for longer than the timeout, must still arrive whole. The channel is a fake port draining at a
 * fixed rate (the DataChannel is outside what is tested); the HTTP server, the adapter and the
 * watcher are Perch's own.
 */
import assert from "node:assert/strict";
import type { ServerResponse } from "node:http";
import { test } from "node:test";
import { Hono } from "hono";
import pino from "pino";
import { writeTimeout } from "../src/http/compat/write-timeout.ts";
import { adapterListener } from "../src/http/listener.ts";
import { Metrics } from "../src/http/metrics.ts";
import { type ChannelPort, type ChannelSink, LOW_WATER_BYTES } from "../src/protocol/channel.ts";
import { StreamHttpServer } from "../src/transport/http-streams.ts";

/** A channel whose peer takes `rate` bytes a second, steadily, in 10 ms steps. */
function steadyPort(rate: number) {
  let sink: ChannelSink | undefined;
  let buffered = 0;
  let delivered = 0;
  let closed = false;
  const timer = setInterval(() => {
    const take = Math.min(buffered, rate / 100);
    buffered -= take;
    delivered += take;
    if (take > 0 && buffered <= LOW_WATER_BYTES) sink?.drained();
  }, 10);
  const port: ChannelPort = {
    label: "giznet/v1/service/2",
    send: (d) => {
      buffered += d.length;
    },
    bufferedAmount: () => buffered,
    close: () => {
      if (closed) return;
      closed = true;
      clearInterval(timer);
      setImmediate(() => sink?.closed());
    },
    attach: (s) => {
      sink = s;
    },
  };
  return { port, deliver: (request: string) => sink!.message(Buffer.from(request)), delivered: () => delivered, closed: () => closed };
}

test("a whole answer a service stream's peer takes steadily, for longer than the write timeout, arrives whole", async () => {
  const app = new Hono();
  const watch = writeTimeout(600);
  const content = "a".repeat(2_000_000);
  app.get("/big", (c) => {
    watch((c.env as { outgoing: ServerResponse }).outgoing);
    return c.json({ content });
  });
  const http = new StreamHttpServer(adapterListener(app.fetch), {
    requestTimeoutMs: 30_000,
    logger: pino({ level: "silent" }),
    metrics: new Metrics(async () => 0),
  });
  // 500 KB a second: about 4 s for the answer, while the timeout is 0.6 s without progress.
  const channel = steadyPort(500_000);
  const socket = StreamHttpServer.socket(channel.port, "192.0.2.7:4000");
  http.serve(socket, { peerKey: "steady", remoteAddress: "192.0.2.7" });
  try {
    channel.deliver("GET /big HTTP/1.1\r\nHost: perch\r\n\r\n");
    // The body and more than 100 bytes of head: the answer is through.
    const whole = content.length + 100;
    for (let i = 0; i < 600 && !socket.destroyed && channel.delivered() < whole; i++) await new Promise((r) => setTimeout(r, 50));
    assert.ok(channel.delivered() >= whole, `only ${channel.delivered()} bytes taken before the stream ended`);
  } finally {
    channel.port.close();
    http.close();
  }
});
