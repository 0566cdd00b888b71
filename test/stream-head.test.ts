/**
 * A streamed chat answer's head goes out before its first event when that event is not at hand
 * (an agent's tool step produces no bytes), on a connection's first request and a later one: the
 * provider's next step is held until the client has the head, so a server that kept the head back
 * for the first event would wait forever.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import http from "node:http";
import type net from "node:net";
import { after, before, test } from "node:test";
import { startTestServer, type TestServer } from "./support/server.ts";

const KEY = "sk-perch-stream-head";
const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");
const event = (delta: unknown, finish: string | null) =>
  `data: ${JSON.stringify({ id: "c", object: "chat.completion.chunk", created: 1, model: "x", choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;

let server: TestServer;
let upstream: http.Server;
/** The client has the head: the provider then answers the step after the tool call. */
let headSeen: Promise<void> = Promise.resolve();
let seeHead: () => void = () => {};

before(async () => {
  upstream = http.createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on("data", (c: Buffer) => parts.push(c));
    req.on("end", () => {
      const body = JSON.parse(Buffer.concat(parts).toString()) as { messages: Array<{ role: string }> };
      res.writeHead(200, { "content-type": "text/event-stream" });
      if (!body.messages.some((m) => m.role === "tool")) {
        const call = { tool_calls: [{ index: 0, id: "t1", type: "function", function: { name: "device_status", arguments: "{}" } }] };
        res.end(`${event(call, null)}${event({}, "tool_calls")}data: [DONE]\n\n`);
        return;
      }
      void headSeen.then(() => res.end(`${event({ content: "hi" }, "stop")}data: [DONE]\n\n`));
    });
  });
  await new Promise<void>((r) => upstream.listen(0, "127.0.0.1", r));
  const base = `http://127.0.0.1:${(upstream.address() as net.AddressInfo).port}/v1`;
  server = await startTestServer({
    config: {
      providers: [{ id: "p", kind: "openai-compatible", base_url: base, max_retries: 0 }],
      models: [{ id: "m", kind: "chat", provider: "p", upstream_model: "x" }],
      agents: [{ id: "ag", model: "m", tools: ["device_status"] }],
      api_keys: [{ name: "a", sha256: sha256(KEY) }],
    },
  });
});
after(async () => {
  await server?.stop();
  upstream.closeAllConnections();
  await new Promise((r) => upstream.close(r));
});

test("an agent's stream: the head arrives while the next step is held, on a connection's first request and a later one", async () => {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  try {
    for (const path of ["first request", "second request"]) {
      headSeen = new Promise((resolve) => {
        seeHead = resolve;
      });
      const body = await new Promise<string>((resolve, reject) => {
        const req = http.request(
          `${server.url}/openai/v1/chat/completions`,
          { method: "POST", agent, headers: { host: "head.test", authorization: `Bearer ${KEY}`, "content-type": "application/json" } },
          (res) => {
            assert.equal(res.statusCode, 200, path);
            let text = "";
            res.on("data", (d: Buffer) => {
              text += d.toString();
            });
            res.on("end", () => resolve(text));
            seeHead();
          },
        );
        req.on("error", reject);
        req.end(JSON.stringify({ model: "ag", stream: true, messages: [{ role: "user", content: "hi" }] }));
      });
      assert.match(body, /"content":"hi"/, path);
      assert.match(body, /data: \[DONE\]/, path);
    }
  } finally {
    agent.destroy();
  }
});
