/**
 * How a chat request's body reaches the chat call, over TCP and over a device's stream 2: whole
 * with its head, in pieces, chunked; and the checks before it (size, then caller, then JSON), each
 * answered the same way on both transports.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import net from "node:net";
import { after, before, describe, test } from "node:test";
import type { PerchConnection } from "../src/sdk/webrtc.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { connect } from "./support/webrtc.ts";

const APP_KEY = "sk-perch-test-bodies";
const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");
const PATH = "/openai/v1/chat/completions";

interface Answer {
  status: number;
  headers: Record<string, string>;
  text: string;
}

/** One HTTP/1.1 exchange on a raw socket: `pieces` written one after another, each once the previous one was flushed and `gapMs` passed. */
function rawExchange(url: string, pieces: Array<string | Buffer>, gapMs = 0): Promise<Answer> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = net.connect(Number(port), hostname);
    let received = Buffer.alloc(0);
    socket.on("data", (d: Buffer) => {
      received = Buffer.concat([received, d]);
    });
    socket.on("error", reject);
    socket.on("close", () => {
      const text = received.toString("utf8");
      const [head = "", ...rest] = text.split("\r\n\r\n");
      const [statusLine = "", ...lines] = head.split("\r\n");
      const headers: Record<string, string> = {};
      for (const line of lines) {
        const at = line.indexOf(":");
        headers[line.slice(0, at).toLowerCase()] = line.slice(at + 1).trim();
      }
      resolve({ status: Number(statusLine.split(" ")[1]), headers, text: rest.join("\r\n\r\n") });
    });
    const write = (i: number) => {
      if (i >= pieces.length) return;
      socket.write(pieces[i]!, () => setTimeout(() => write(i + 1), gapMs));
    };
    socket.once("connect", () => write(0));
  });
}

/** The JSON of a response body that may be sent chunked (one chunk: the whole JSON). */
function bodyJson(a: Answer): { error?: { type: string; code: string | null; param: string | null }; choices?: Array<{ message: { content: string } }> } {
  const text = a.headers["transfer-encoding"] === "chunked" ? a.text.split("\r\n")[1]! : a.text;
  return JSON.parse(text);
}

describe("Compatible API: chat request bodies", () => {
  let server: TestServer;
  let upstream: FakeUpstream;
  let conn: PerchConnection;

  const head = (o: { length?: number; chunked?: boolean; auth?: string | null }) =>
    [
      `POST ${PATH} HTTP/1.1`,
      "host: perch",
      "connection: close",
      "content-type: application/json",
      ...(o.auth === null ? [] : [`authorization: Bearer ${o.auth ?? APP_KEY}`]),
      o.chunked ? "transfer-encoding: chunked" : `content-length: ${o.length}`,
      "",
      "",
    ].join("\r\n");
  const chunk = (s: string) => `${Buffer.byteLength(s).toString(16)}\r\n${s}\r\n`;
  const chatBody = (content: string) => JSON.stringify({ model: "my-chat", messages: [{ role: "user", content }], temperature: null, stream: false });

  /** What the provider was asked by the last call: the checked body, with the upstream model and without null fields. */
  const lastUpstreamCall = () => upstream.received.at(-1)!.body;

  before(async () => {
    upstream = await startFakeUpstream();
    server = await startTestServer({
      config: {
        providers: [{ id: "p", kind: "openai-compatible", base_url: upstream.url, max_retries: 0 }],
        models: [
          { id: "my-chat", kind: "chat", provider: "p", upstream_model: "llama3.2" },
          { id: "cloud-tts", kind: "speech", provider: "p", upstream_model: "tts" },
        ],
        api_keys: [{ name: "app", sha256: sha256(APP_KEY), models: ["*"] }],
      },
    });
    conn = await connect(server);
  });

  after(async () => {
    conn?.close();
    await server?.stop();
    await upstream?.close();
  });

  test("a body that arrives whole with its head, in two pieces, or chunked: the same call upstream", async () => {
    for (const [how, pieces, gap] of [
      ["whole", (b: string) => [head({ length: Buffer.byteLength(b) }) + b], 0],
      ["two pieces", (b: string) => [head({ length: Buffer.byteLength(b) }) + b.slice(0, 20), b.slice(20)], 50],
      ["chunked", (b: string) => [head({ chunked: true }) + chunk(b.slice(0, 20)), chunk(b.slice(20)) + chunk("")], 50],
    ] as const) {
      const body = chatBody(`hello ${how}`);
      const answer = await rawExchange(server.url, pieces(body), gap);
      assert.equal(answer.status, 200, `${how}: ${answer.text}`);
      assert.equal(bodyJson(answer).choices?.[0]?.message.content, "Hello from llama3.2");
      assert.deepEqual(lastUpstreamCall(), { model: "llama3.2", messages: [{ role: "user", content: `hello ${how}` }], stream: false }, how);
    }
    const res = await conn.http(2, "POST", "/v1/chat/completions", { body: chatBody("hello stream 2"), headers: { "content-type": "application/json" } });
    assert.equal(res.status, 200, res.body.toString());
    assert.deepEqual(lastUpstreamCall(), { model: "llama3.2", messages: [{ role: "user", content: "hello stream 2" }], stream: false });
  });

  test("bad JSON, an empty body and a body of too many values: 400 / 413 before any call, on both transports", async () => {
    const calls = upstream.received.length;
    const tooComplex = `{"model":"my-chat","messages":[${"1,".repeat(100_001)}1]}`;
    for (const [body, status, code] of [
      ["{not json", 400, "invalid_json"],
      ["  \n", 400, "invalid_json"],
      [tooComplex, 413, "request_too_complex"],
    ] as const) {
      const tcp = await rawExchange(server.url, [head({ length: Buffer.byteLength(body) }) + body]);
      assert.equal(tcp.status, status);
      assert.equal(bodyJson(tcp).error?.code, code);
      assert.ok(tcp.headers["x-request-id"]);
      const chunked = await rawExchange(server.url, [head({ chunked: true }) + chunk(body) + chunk("")]);
      assert.equal(chunked.status, status);
      assert.equal(bodyJson(chunked).error?.code, code);
      const dc = await conn.http(2, "POST", "/v1/chat/completions", { body, headers: { "content-type": "application/json" } });
      assert.equal(dc.status, status);
      assert.equal(dc.json<{ error: { code: string } }>().error.code, code);
    }
    assert.equal(upstream.received.length, calls);
  });

  test("the checks' order: the size first (413 even without a key), then the caller (401 even for bad JSON)", async () => {
    const calls = upstream.received.length;
    // Refused on its head alone: the 32 MiB + 1 bytes it declares are never sent.
    const over = await rawExchange(server.url, [head({ length: 32 * 1024 * 1024 + 1, auth: null })]);
    assert.equal(over.status, 413);
    assert.equal(bodyJson(over).error?.code, "request_too_large");
    assert.ok(over.headers["x-request-id"]);

    for (const auth of [null, "sk-wrong"]) {
      const bad = await rawExchange(server.url, [`${head({ length: 9, auth })}{not json`]);
      assert.equal(bad.status, 401);
      assert.equal(bodyJson(bad).error?.code, "invalid_api_key");
      assert.equal(bad.headers["access-control-allow-origin"], "*");
    }
    assert.equal(upstream.received.length, calls);
  });

  test("a model that does not exist, or that does not chat: 404 / 400 naming `model`, on both transports", async () => {
    const calls = upstream.received.length;
    for (const [model, status, code] of [
      ["no-such-model", 404, "model_not_found"],
      ["cloud-tts", 400, "invalid_model"],
    ] as const) {
      const body = JSON.stringify({ model, messages: [{ role: "user", content: "hi" }] });
      const tcp = await rawExchange(server.url, [head({ length: Buffer.byteLength(body) }) + body]);
      assert.equal(tcp.status, status);
      assert.equal(bodyJson(tcp).error?.code, code);
      assert.equal(bodyJson(tcp).error?.param, "model");
      const dc = await conn.http(2, "POST", "/v1/chat/completions", { body, headers: { "content-type": "application/json" } });
      assert.equal(dc.status, status);
      assert.equal(dc.json<{ error: { code: string } }>().error.code, code);
    }
    assert.equal(upstream.received.length, calls);
  });

  test("a message the schema refuses is named by its index; the fields around the messages are still checked", async () => {
    const bad = await rawExchange(server.url, [
      (() => {
        const b = JSON.stringify({
          model: "my-chat",
          messages: [
            { role: "user", content: "ok" },
            { role: "user", content: 7 },
          ],
        });
        return head({ length: Buffer.byteLength(b) }) + b;
      })(),
    ]);
    assert.equal(bad.status, 400);
    assert.match(bodyJson(bad).error?.param ?? "", /^messages\[1\]/);
    const b = JSON.stringify({ model: "my-chat", messages: [{ role: "user", content: "ok" }], stream_options: { include_usage: true } });
    const around = await rawExchange(server.url, [head({ length: Buffer.byteLength(b) }) + b]);
    assert.equal(around.status, 400);
    assert.equal(bodyJson(around).error?.param, "stream_options");
  });

  test("a stream whose client leaves: the provider's call is closed", { timeout: 30_000 }, async () => {
    upstream.reply({ hang: true });
    const body = JSON.stringify({ model: "my-chat", messages: [{ role: "user", content: "a long story" }], stream: true });
    const { hostname, port } = new URL(server.url);
    const socket = net.connect(Number(port), hostname);
    socket.write(head({ length: Buffer.byteLength(body) }) + body);
    // The first event reached the client: the call is under way; then the client leaves.
    await new Promise<void>((resolve) => socket.once("data", () => resolve()));
    const call = upstream.received.at(-1)!;
    assert.equal(call.body.messages[0].content, "a long story");
    socket.destroy();
    await call.aborted;
  });
});
