/**
 * Clients that never read their answers (issue 17): they must not pin the speech engine's slots
 * (its output is read ahead of the client, within a bound, and the slot freed when synthesis
 * ends), nor an upstream call (a write timeout disconnects them).
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import http from "node:http";
import net from "node:net";
import { availableParallelism } from "node:os";
import { after, before, describe, test } from "node:test";
import { engines } from "./support/engines.ts";
import { startTestServer, type TestServer } from "./support/server.ts";

const KEY = "sk-perch-hostile-readers";
const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");
const TEXT = "The small device reports its battery level and its temperature every minute. ".repeat(30).slice(0, 2048);

/** A client that sends one POST and then never reads a byte of the answer. */
function nonReader(port: number, path: string, body: unknown, host = "127.0.0.1"): net.Socket {
  const json = JSON.stringify(body);
  const socket = net.connect(port, "127.0.0.1", () => {
    socket.write(
      `POST ${path} HTTP/1.1\r\nHost: ${host}\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(json)}\r\n\r\n${json}`,
    );
    socket.pause();
  });
  socket.on("error", () => {});
  return socket;
}

async function until(condition: () => boolean, tries = 500): Promise<boolean> {
  for (let i = 0; i < tries && !condition(); i++) await new Promise((r) => setTimeout(r, 20));
  return condition();
}

describe("slow readers cannot pin engines", () => {
  let server: TestServer;
  before(async () => {
    // No write timeout to speak of here (only the read-ahead may free the slots), and no admission
    // budget (on a busy machine the queue's estimate for this one caller's next job can pass 10 s).
    server = await startTestServer({
      config: { api_keys: [{ name: "a", sha256: sha256(KEY) }], compat: { write_timeout_ms: 600_000, max_queue_wait_ms: 600_000 } },
      engines: engines(),
    });
  });
  after(() => server?.stop());

  test("non-reading speech clients, as many as the engine has slots, beside a reading one: the reader is answered", async () => {
    const port = Number(new URL(server.url).port);
    // ~14 MB of WAV each: more than the sockets' buffers hold, less than the read-ahead bound.
    const stalled = Array.from({ length: availableParallelism() }, () =>
      nonReader(port, "/openai/v1/audio/speech", { model: "tts-1", input: TEXT, voice: "alloy", response_format: "wav", speed: 0.35 }),
    );
    try {
      await new Promise((r) => setTimeout(r, 200));
      // Before the fix this waited for as long as the stalled clients' sockets stayed open.
      const res = await fetch(`${server.url}/openai/v1/audio/speech`, {
        method: "POST",
        headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "tts-1", input: "Hello there.", voice: "echo", response_format: "wav" }),
        signal: AbortSignal.timeout(30_000),
      });
      assert.equal(res.status, 200);
      const audio = Buffer.from(await res.arrayBuffer());
      assert.equal(audio.subarray(0, 4).toString("latin1"), "RIFF");
      assert.ok(audio.length > 10_000);
    } finally {
      for (const s of stalled) s.destroy();
    }
  });
});

describe("a write timeout on responses", () => {
  let server: TestServer;
  let upstream: http.Server;
  /** The same, with a write timeout of 2 s. */
  let patient: TestServer;
  let closedEarly = 0;
  let written = 0;

  before(async () => {
    upstream = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        const asked = JSON.parse(Buffer.concat(chunks).toString()) as { stream?: boolean; messages: Array<{ content: string }> };
        if (asked.messages[0]?.content === "slow") {
          // A small whole answer, a second late.
          const completion = {
            id: "c",
            object: "chat.completion",
            created: 1,
            model: "x",
            choices: [{ index: 0, message: { role: "assistant", content: "late" }, finish_reason: "stop" }],
          };
          setTimeout(() => {
            res.writeHead(200, { "content-type": "application/json" });
            res.end(JSON.stringify(completion));
          }, 1000);
          return;
        }
        if (!asked.stream) {
          // A whole answer larger than the sockets' buffers: 40 MB of content.
          const completion = {
            id: "c",
            object: "chat.completion",
            created: 1,
            model: "x",
            choices: [{ index: 0, message: { role: "assistant", content: "a".repeat(40_000_000) }, finish_reason: "stop" }],
          };
          res.writeHead(200, { "content-type": "application/json" });
          res.end(JSON.stringify(completion));
          return;
        }
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.on("close", () => {
          if (!res.writableFinished) closedEarly++;
        });
        res.on("error", () => {});
        const event = Buffer.from(
          `data: ${JSON.stringify({ id: "c", object: "chat.completion.chunk", created: 1, model: "x", choices: [{ index: 0, delta: { content: "a".repeat(16_000) }, finish_reason: null }] })}\n\n`,
        );
        const more = () => {
          // 256 MB if nobody stops it.
          while (written < 256 * 1024 * 1024 && !res.destroyed) {
            written += event.length;
            if (!res.write(event)) return void res.once("drain", more);
          }
          res.end("data: [DONE]\n\n");
        };
        more();
      });
    });
    await new Promise<void>((resolve) => upstream.listen(0, "127.0.0.1", resolve));
    const base = `http://127.0.0.1:${(upstream.address() as net.AddressInfo).port}/v1`;
    const config = (writeTimeoutMs: number) => ({
      providers: [{ id: "p", kind: "openai-compatible" as const, base_url: base, max_retries: 0 }],
      models: [{ id: "m", kind: "chat" as const, provider: "p", upstream_model: "x" }],
      api_keys: [{ name: "a", sha256: sha256(KEY) }],
      compat: { write_timeout_ms: writeTimeoutMs },
    });
    server = await startTestServer({ config: config(500) });
    patient = await startTestServer({ config: config(2000) });
  });
  after(async () => {
    await server?.stop();
    await patient?.stop();
    upstream.closeAllConnections();
    await new Promise((r) => upstream.close(r));
  });

  test("a client that stops reading a stream is disconnected, and the upstream call with it", async () => {
    const socket = nonReader(Number(new URL(server.url).port), "/openai/v1/chat/completions", {
      model: "m",
      stream: true,
      messages: [{ role: "user", content: "hi" }],
    });
    let closed = false;
    socket.once("close", () => {
      closed = true;
    });
    try {
      assert.ok(await until(() => closedEarly === 1), `the upstream call is still open after ${written} bytes`);
      assert.ok(written < 256 * 1024 * 1024);
      // What the client had received is still there to read, then the connection ends.
      socket.resume();
      assert.ok(await until(() => closed), "the client's connection is closed");
    } finally {
      socket.destroy();
    }
  });

  test("a client that does not read a whole answer is disconnected, on a new Host and a known one alike", async () => {
    const port = Number(new URL(server.url).port);
    // The exchange remembers no Host: the first request of one and a later one are served the same way.
    for (const path of ["first request", "second request"]) {
      let held: net.Socket | undefined;
      server.httpServer.once("connection", (s: net.Socket) => {
        held = s;
      });
      const socket = nonReader(port, "/openai/v1/chat/completions", { model: "m", messages: [{ role: "user", content: "hi" }] }, "whole.test");
      let received = 0;
      socket.on("data", (c: Buffer) => {
        received += c.length;
      });
      let closed = false;
      socket.once("close", () => {
        closed = true;
      });
      try {
        // The client cannot see the end of a connection it does not read: the server's side says.
        assert.ok(await until(() => held?.destroyed === true), `${path}: the connection of a client that does not read is still open`);
        socket.resume();
        assert.ok(await until(() => closed), `${path}: the client's connection is closed`);
        assert.ok(received < 40_000_000, `${path}: the whole answer arrived (${received} bytes)`);
      } finally {
        socket.destroy();
      }
    }
  });

  test("a whole answer queued behind another on its connection (pipelined), never read, is cut too", async () => {
    const port = Number(new URL(server.url).port);
    let held: net.Socket | undefined;
    server.httpServer.once("connection", (s: net.Socket) => {
      held = s;
    });
    const request = (content: string) => {
      const json = JSON.stringify({ model: "m", messages: [{ role: "user", content }] });
      return `POST /openai/v1/chat/completions HTTP/1.1\r\nHost: pipelined.test\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(json)}\r\n\r\n${json}`;
    };
    // The second answer (40 MB) is written while the first (a second late) still holds the connection.
    const socket = net.connect(port, "127.0.0.1", () => {
      socket.write(request("slow") + request("big"));
      socket.pause();
    });
    socket.on("error", () => {});
    try {
      assert.ok(await until(() => held?.destroyed === true), "the connection of a client that does not read is still open");
    } finally {
      socket.destroy();
    }
  });

  test("a client that reads a whole answer slowly, for longer than the write timeout, gets all of it", async () => {
    // A megabyte each 100 ms: about 4 s for the answer, while the server's timeout is 2 s of no progress.
    const socket = nonReader(Number(new URL(patient.url).port), "/openai/v1/chat/completions", { model: "m", messages: [{ role: "user", content: "hi" }] });
    let received = 0;
    let ended = false;
    socket.once("end", () => {
      ended = true;
    });
    const started = performance.now();
    try {
      while (!socket.destroyed && !ended) {
        await new Promise((r) => setTimeout(r, 100));
        const until = received + 1_000_000;
        socket.resume();
        await new Promise<void>((resolve) => {
          const take = (c: Buffer) => {
            received += c.length;
            if (received < until) return;
            socket.off("data", take);
            socket.pause();
            resolve();
          };
          socket.on("data", take);
          socket.once("close", () => resolve());
        });
        if (received > 40_000_000) break;
      }
      assert.ok(received > 40_000_000, `only ${received} bytes arrived, in ${Math.round(performance.now() - started)} ms`);
    } finally {
      socket.destroy();
    }
  });
});
