/**
 * Request bodies whose cost must be bounded before they are parsed or validated (issue 17): a
 * 31 MiB body of 2.5 million invalid messages, counts past the limits, bodies of invalid items,
 * and one caller's many large bodies at once.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import { startTestServer, type TestServer } from "./support/server.ts";

const KEY = "sk-perch-hostile-bodies";
const OTHER_KEY = "sk-perch-hostile-bodies-other";
/** Five more callers, for the node-wide cap. */
const CROWD = Array.from({ length: 5 }, (_, i) => `sk-perch-hostile-bodies-crowd-${i}`);
const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");

interface Upload {
  /** Resolves with the answer's status and body. */
  answer: Promise<{ status: number; body: string }>;
  /** Writes the next `bytes` of the body; false once the whole body is written or the answer is in. */
  write(bytes: Buffer): Promise<boolean>;
  answered(): boolean;
  destroy(): void;
}

/** A POST whose body of declared `length` is written piece by piece, as the test says. */
function upload(url: string, key: string, length: number): Upload {
  let done = false;
  const req = http.request(url, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json", "content-length": length },
  });
  req.on("error", () => {});
  const answer = new Promise<{ status: number; body: string }>((resolve, reject) => {
    req.once("response", (res) => {
      done = true;
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.once("end", () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString("utf8") }));
      res.once("error", reject);
    });
  });
  return {
    answer,
    answered: () => done,
    destroy: () => req.destroy(),
    write: async (bytes) => {
      if (done || req.destroyed) return false;
      if (!req.write(bytes)) await new Promise((r) => req.once("drain", r));
      await new Promise((r) => setImmediate(r));
      return !done;
    },
  };
}

describe("request bodies of bounded cost", () => {
  let server: TestServer;
  const chatUrl = () => `${server.url}/openai/v1/chat/completions`;

  let upstream: http.Server;
  let forwarded: Buffer | undefined;

  before(async () => {
    // A provider that keeps what it was sent and answers briefly.
    upstream = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        forwarded = Buffer.concat(chunks);
        const message = { role: "assistant", content: "ok" };
        res
          .writeHead(200, { "content-type": "application/json" })
          .end(JSON.stringify({ id: "c", object: "chat.completion", created: 1, model: "x", choices: [{ index: 0, message, finish_reason: "stop" }] }));
      });
    });
    await new Promise<void>((resolve) => upstream.listen(0, "127.0.0.1", resolve));
    server = await startTestServer({
      config: {
        providers: [
          { id: "p", kind: "openai-compatible", base_url: "http://127.0.0.1:9/v1", max_retries: 0 },
          { id: "real", kind: "openai-compatible", base_url: `http://127.0.0.1:${(upstream.address() as AddressInfo).port}/v1`, max_retries: 0 },
        ],
        models: [
          { id: "m", kind: "chat", provider: "p", upstream_model: "x" },
          { id: "real-m", kind: "chat", provider: "real", upstream_model: "big" },
        ],
        api_keys: [
          { name: "a", sha256: sha256(KEY) },
          { name: "b", sha256: sha256(OTHER_KEY) },
          ...CROWD.map((k, i) => ({ name: `crowd-${i}`, sha256: sha256(k) })),
        ],
      },
    });
  });
  after(async () => {
    await server?.stop();
    upstream?.closeAllConnections();
    await new Promise((r) => upstream?.close(r));
  });

  test("a large valid body (parsed and serialised off the main thread) reaches the provider intact", async () => {
    const content = `${"héllo wörld ✓ ".repeat(200_000)}"quoted" \\ end`;
    const res = await fetch(chatUrl(), {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}` },
      body: JSON.stringify({ model: "real-m", messages: [{ role: "user", content }], temperature: null }),
    });
    assert.equal(res.status, 200, await res.clone().text());
    assert.equal(((await res.json()) as { choices: Array<{ message: { content: string } }> }).choices[0]?.message.content, "ok");
    const sent = JSON.parse(forwarded!.toString("utf8")) as { model: string; messages: Array<{ content: string }>; temperature?: unknown };
    assert.equal(sent.model, "big");
    assert.equal(sent.messages[0]?.content, content);
    assert.equal("temperature" in sent, false);
    assert.ok(forwarded!.length > 3 * 1024 * 1024);
  });

  test("31 MiB of 2.5 million invalid messages: refused while still arriving; /healthz answered meanwhile", async () => {
    const body = Buffer.from(JSON.stringify({ model: "m", messages: Array.from({ length: 2_500_000 }, () => ({ role: "x" })) }));
    assert.ok(body.length > 30 * 2 ** 20, `${body.length} bytes`);
    await fetch(`${server.url}/metrics`).then((r) => r.text()); // resets the lag gauge
    const big = upload(chatUrl(), KEY, body.length);
    const piece = 512 * 1024;
    let written = 0;
    let healthy = 0;
    let slowest = 0;
    while (written < body.length) {
      const more = await big.write(body.subarray(written, written + piece));
      written += piece;
      // Health is answered between the pieces, while the big request is still being processed.
      const asked = performance.now();
      const health = await fetch(`${server.url}/healthz`);
      assert.equal(health.status, 200);
      slowest = Math.max(slowest, performance.now() - asked);
      healthy++;
      if (!more) break;
    }
    const sent = performance.now();
    const answer = await big.answer;
    const waited = performance.now() - sent;
    big.destroy();
    process.stderr.write(
      `# 31 MiB invalid body: ${answer.status} ${waited.toFixed(0)} ms after the last piece sent; slowest /healthz ${slowest.toFixed(0)} ms\n`,
    );
    assert.ok(written < body.length, `the answer came only after all ${body.length} bytes were sent`);
    assert.ok(healthy > 0);
    assert.equal(answer.status, 413, answer.body);
    const error = (JSON.parse(answer.body) as { error: { code: string; message: string } }).error;
    assert.equal(error.code, "request_too_complex");
    assert.match(error.message, /more than 100000 values/);
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    const lag = /^perch_event_loop_lag_max_seconds (\S+)$/m.exec(metrics)?.[1];
    process.stderr.write(
      `# 31 MiB invalid body: answered after ${(written / 2 ** 20).toFixed(1)} MiB sent, ${healthy} health probes meanwhile; event loop held at most ${(Number(lag) * 1000).toFixed(1)} ms beyond its 10 ms sampling\n`,
    );
  });

  test("counts past the limits are refused before the schema, naming the field", async () => {
    const post = async (body: unknown) => {
      const res = await fetch(chatUrl(), { method: "POST", headers: { authorization: `Bearer ${KEY}` }, body: JSON.stringify(body) });
      return { status: res.status, error: ((await res.json()) as { error: { param: string | null; message: string } }).error };
    };
    const user = { role: "user", content: "hi" };
    let r = await post({ model: "m", messages: Array.from({ length: 4097 }, () => user) });
    assert.equal(r.status, 400);
    assert.equal(r.error.param, "messages");
    assert.match(r.error.message, /at most 4096 messages/);
    r = await post({ model: "m", messages: [{ role: "user", content: Array.from({ length: 513 }, () => ({ type: "text", text: "a" })) }] });
    assert.equal(r.error.param, "messages[0].content");
    r = await post({ model: "m", messages: [user], stop: ["a", "b", "c", "d", "e"] });
    assert.equal(r.error.param, "stop");
    r = await post({ model: "m", messages: [user], tools: Array.from({ length: 129 }, () => ({ type: "function", function: { name: "f" } })) });
    assert.equal(r.error.param, "tools");
    // Thousands of invalid messages: one issue, the first.
    r = await post({ model: "m", messages: [user, ...Array.from({ length: 4000 }, () => ({ role: "x" }))] });
    assert.equal(r.status, 400);
    assert.equal(r.error.param, "messages[1].role");
  });

  test("a caller has at most two large bodies in progress; another caller is not held up by them", async () => {
    const length = 3 * 1024 * 1024;
    const held = [upload(chatUrl(), KEY, length), upload(chatUrl(), KEY, length)];
    for (const h of held) await h.write(Buffer.from('{"model":"m","messages":[{"role":"user","content":"'));
    // Both are being read: the server has taken their slots.
    await new Promise((r) => setTimeout(r, 100));
    const third = upload(chatUrl(), KEY, length);
    await third.write(Buffer.from("{"));
    const refused = await third.answer;
    third.destroy();
    assert.equal(refused.status, 429, refused.body);
    assert.equal((JSON.parse(refused.body) as { error: { code: string } }).error.code, "too_many_large_requests");

    const whole = Buffer.from(JSON.stringify({ model: "m", messages: [{ role: "user", content: "a".repeat(length) }] }));
    const other = upload(chatUrl(), OTHER_KEY, whole.length);
    await other.write(whole.subarray(0, 1000));
    await other.write(whole.subarray(1000));
    const otherAnswer = await other.answer;
    assert.notEqual(otherAnswer.status, 429, otherAnswer.body);

    // Once one ends (here: the client gives up), the caller may send another.
    held[0]!.destroy();
    await new Promise((r) => setTimeout(r, 100));
    const again = upload(chatUrl(), KEY, whole.length);
    await again.write(whole);
    assert.notEqual((await again.answer).status, 429);
    held[1]!.destroy();
  });

  test("the node has at most eight large bodies in progress, whoever sends them", async () => {
    const length = 3 * 1024 * 1024;
    const start = '{"model":"m","messages":[{"role":"user","content":"';
    const held = CROWD.slice(0, 4).flatMap((key) => [upload(chatUrl(), key, length), upload(chatUrl(), key, length)]);
    try {
      for (const h of held) await h.write(Buffer.from(start));
      await new Promise((r) => setTimeout(r, 100));
      const ninth = upload(chatUrl(), CROWD[4]!, length);
      await ninth.write(Buffer.from("{"));
      const refused = await ninth.answer;
      ninth.destroy();
      assert.equal(refused.status, 429, refused.body);
      assert.match((JSON.parse(refused.body) as { error: { message: string } }).error.message, /The server has 8 requests/);
      // A small body is never held up by them.
      const small = await fetch(chatUrl(), { method: "POST", headers: { authorization: `Bearer ${CROWD[4]}` }, body: JSON.stringify({ model: 1 }) });
      assert.equal(small.status, 400);
    } finally {
      for (const h of held) h.destroy();
    }
  });
});
