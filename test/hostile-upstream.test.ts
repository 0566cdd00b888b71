/**
 * A model provider as an attacker (or a broken server) would answer (issue 17): tool-call indices
 * that are sparse, out of range or prototype keys, too many calls in one step, a server-sent event
 * stream without event boundaries, and an answer trickled a piece at a time forever. The upstream
 * is a real HTTP server on loopback answering raw bytes.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import { startTestServer, type TestServer } from "./support/server.ts";
import { sseJson } from "./support/sse.ts";

const KEY = "sk-perch-hostile-upstream";
const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");

type Handler = (body: Record<string, any>, res: http.ServerResponse) => void;

/** A provider whose answers each test scripts; counts requests and connections closed early. */
class RawUpstream {
  handler: Handler = (_b, res) => res.writeHead(500).end();
  requests = 0;
  closedEarly = 0;
  /** Bytes written by the current handler. */
  written = 0;
  private server!: http.Server;
  url = "";

  async start(): Promise<this> {
    this.server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        this.requests++;
        res.on("close", () => {
          if (!res.writableFinished) this.closedEarly++;
        });
        this.handler(JSON.parse(Buffer.concat(chunks).toString("utf8")) as Record<string, any>, res);
      });
    });
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/v1`;
    return this;
  }

  reset(handler: Handler): void {
    this.handler = handler;
    this.requests = 0;
    this.closedEarly = 0;
    this.written = 0;
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise((resolve) => this.server.close(resolve));
  }
}

/** Waits (briefly) for `condition`: the upstream sees its connection close a moment after the answer ends. */
async function until(condition: () => boolean): Promise<boolean> {
  for (let i = 0; i < 200 && !condition(); i++) await new Promise((r) => setTimeout(r, 10));
  return condition();
}

const chunk = (delta: Record<string, unknown>, finish: string | null = null) =>
  `data: ${JSON.stringify({ id: "c", object: "chat.completion.chunk", created: 1, model: "x", choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;

/** A stream of one step whose tool-call deltas are `deltas`, raw. */
function toolStream(deltas: unknown[]): Handler {
  return (_body, res) => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.write(chunk({ role: "assistant", content: "" }));
    res.write(chunk({ tool_calls: deltas }));
    res.end(`${chunk({}, "tool_calls")}data: [DONE]\n\n`);
  };
}

function completionWith(message: Record<string, unknown>): Handler {
  return (_body, res) =>
    res.writeHead(200, { "content-type": "application/json" }).end(
      JSON.stringify({
        id: "c",
        object: "chat.completion",
        created: 1,
        model: "x",
        choices: [{ index: 0, message: { role: "assistant", content: null, ...message }, finish_reason: "tool_calls" }],
        usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
      }),
    );
}

describe("upstreams as untrusted input", () => {
  let server: TestServer;
  let upstream: RawUpstream;
  const post = (body: Record<string, unknown>, signal?: AbortSignal) =>
    fetch(`${server.url}/openai/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
      body: JSON.stringify(body),
      ...(signal ? { signal } : {}),
    });
  /** The streamed answer's `data:` payloads. */
  const events = sseJson;

  before(async () => {
    upstream = await new RawUpstream().start();
    server = await startTestServer({
      config: {
        providers: [
          { id: "p", kind: "openai-compatible", base_url: upstream.url, max_retries: 0 },
          { id: "slow", kind: "openai-compatible", base_url: upstream.url, max_retries: 0, timeout_ms: 400, deadline_ms: 1500 },
        ],
        models: [
          { id: "m", kind: "chat", provider: "p", upstream_model: "x" },
          { id: "slow-m", kind: "chat", provider: "slow", upstream_model: "x" },
        ],
        agents: [{ id: "agent", model: "m", tools: ["device_status"], max_steps: 3 }],
        api_keys: [{ name: "a", sha256: sha256(KEY) }],
      },
    });
  });
  after(async () => {
    await server?.stop();
    await upstream?.close();
  });

  test("a sparse tool-call index (4294967294) is refused at once; the node stays responsive", async () => {
    upstream.reset(toolStream([{ index: 4294967294, id: "call_1", type: "function", function: { name: "device_status", arguments: "{}" } }]));
    const answer = post({ model: "agent", stream: true, messages: [{ role: "user", content: "hi" }] });
    let settled = false;
    void answer.then(
      () => (settled = true),
      () => (settled = true),
    );
    // /healthz probed until the answer is in: each probe is answered (a frozen node answers none).
    let slowest = 0;
    do {
      const asked = performance.now();
      const health = await fetch(`${server.url}/healthz`);
      assert.equal(health.status, 200);
      slowest = Math.max(slowest, performance.now() - asked);
    } while (!settled);
    process.stderr.write(`# /healthz beside a sparse tool-call index: slowest ${slowest.toFixed(0)} ms\n`);
    const res = await answer;
    const last = (await events(res)).at(-1);
    assert.match(last?.error?.message ?? "", /tool call index 4294967294/, JSON.stringify(last));
    assert.equal(upstream.requests, 1, "no second step: no tool ran");
  });

  test("`__proto__` and other non-integer indices are refused; Array.prototype is untouched", async () => {
    for (const index of ["__proto__", "constructor", -1, 1.5, null, "0"]) {
      upstream.reset(toolStream([{ index, id: "call_p", type: "function", function: { name: "device_status", arguments: "{}" } }]));
      const last = (await events(await post({ model: "agent", stream: true, messages: [{ role: "user", content: "hi" }] }))).at(-1);
      assert.match(last?.error?.message ?? "", /tool call index/, `${JSON.stringify(index)}: ${JSON.stringify(last)}`);
      assert.equal(upstream.requests, 1);
    }
    assert.equal(Object.hasOwn(Array.prototype, "id"), false);
    assert.equal(([] as unknown as { id?: unknown }).id, undefined);
  });

  test("more than 128 tool calls in one step are refused, streamed or not; none runs", async () => {
    const deltas = Array.from({ length: 129 }, (_, i) => ({ index: i, id: `c${i}`, type: "function", function: { name: "device_status", arguments: "{}" } }));
    upstream.reset(toolStream(deltas));
    const last = (await events(await post({ model: "agent", stream: true, messages: [{ role: "user", content: "hi" }] }))).at(-1);
    assert.match(last?.error?.message ?? "", /more than 128 tool calls/, JSON.stringify(last));
    assert.equal(upstream.requests, 1);

    const calls = deltas.map((d) => ({ id: d.id, type: "function", function: d.function }));
    upstream.reset(completionWith({ tool_calls: calls }));
    let res = await post({ model: "agent", messages: [{ role: "user", content: "hi" }] });
    assert.equal(res.status, 502);
    assert.match(((await res.json()) as any).error.message, /more than 128 tool calls/);
    assert.equal(upstream.requests, 1);

    // A malformed call (an id that is not a string; no function) in a completion.
    for (const bad of [
      { id: 7, type: "function", function: { name: "device_status", arguments: "{}" } },
      { id: "x", type: "function" },
    ]) {
      upstream.reset(completionWith({ tool_calls: [bad] }));
      res = await post({ model: "agent", messages: [{ role: "user", content: "hi" }] });
      assert.equal(res.status, 502, JSON.stringify(bad));
      assert.match(((await res.json()) as any).error.message, /tool call/);
    }
  });

  test("a valid tool call still runs: the next step gets its result", async () => {
    let step = 0;
    upstream.reset((body, res) => {
      step++;
      if (step === 1) return toolStream([{ index: 0, id: "call_ok", type: "function", function: { name: "device_status", arguments: "{}" } }])(body, res);
      const tool = body.messages.find((m: any) => m.role === "tool");
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.end(`${chunk({ role: "assistant", content: `saw ${tool?.tool_call_id}` })}${chunk({}, "stop")}data: [DONE]\n\n`);
    });
    const all = await events(await post({ model: "agent", stream: true, messages: [{ role: "user", content: "hi" }] }));
    assert.ok(
      all.some((e) => e.choices?.[0]?.delta?.content === "saw call_ok"),
      JSON.stringify(all),
    );
  });

  test("a server-sent event stream without event boundaries is cut at the cap on one event, long before its end", async () => {
    const total = 48 * 1024 * 1024;
    upstream.reset((_body, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write(chunk({ role: "assistant", content: "" }));
      res.write('data: {"choices":[{"index":0,"delta":{"content":"');
      const piece = Buffer.alloc(64 * 1024, "a");
      const more = () => {
        while (upstream.written < total) {
          upstream.written += piece.length;
          if (!res.write(piece)) return void res.once("drain", more);
        }
        res.end('"}}]}\n\n');
      };
      res.on("error", () => {});
      more();
    });
    const res = await post({ model: "m", stream: true, messages: [{ role: "user", content: "hi" }] });
    const text = await res.text();
    assert.match(text, /an event over \d+ bytes/);
    assert.ok(await until(() => upstream.closedEarly === 1), "the provider's connection is closed");
    assert.ok(upstream.written < total, `the upstream wrote all ${upstream.written} bytes`);
  });

  test("a trickling upstream (an event every 100 ms, forever) is cut at the call's deadline, streamed or not", async () => {
    let timer: NodeJS.Timeout | undefined;
    upstream.reset((body, res) => {
      res.on("close", () => clearInterval(timer));
      if (body.stream) {
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.write(chunk({ role: "assistant", content: "" }));
        timer = setInterval(() => res.write(chunk({ content: "." })), 100);
      } else {
        res.writeHead(200, { "content-type": "application/json" });
        res.write("{");
        timer = setInterval(() => res.write(" "), 100);
      }
    });
    const streamed = await post({ model: "slow-m", stream: true, messages: [{ role: "user", content: "hi" }] });
    const last = (await events(streamed)).at(-1);
    assert.match(last?.error?.message ?? "", /did not finish within 1500 ms/, JSON.stringify(last));
    assert.ok(await until(() => upstream.closedEarly === 1), "the provider's connection is closed");

    upstream.reset(upstream.handler);
    const whole = await post({ model: "slow-m", messages: [{ role: "user", content: "hi" }] });
    assert.equal(whole.status, 504);
    assert.match(((await whole.json()) as any).error.message, /did not finish within 1500 ms/);
    assert.ok(await until(() => upstream.closedEarly === 1), "the provider's connection is closed");
  });
});
