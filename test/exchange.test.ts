/**
 * The one exchange (src/http/exchange.ts) and its two native routes, `GET /me/status` and
 * `POST /openai/v1/chat/completions`: every answer, error and refusal of each, with its one log line
 * and its metrics, served in process (`server.request`, through Node's parser and the exchange as
 * over TCP); what needs bytes a `Request` cannot carry (a GET with a body, a missing or bad `Host`,
 * a client that leaves) over the TCP listener.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, before, describe, test } from "node:test";
import pino from "pino";
import { ManualClock } from "../src/domain/clock.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { exchange, parseRawResponse, tcp } from "./support/raw-http.ts";
import { startTestServer, type TestServer } from "./support/server.ts";

const APP_KEY = "sk-perch-exchange-app";
const METERED_KEY = "sk-perch-exchange-metered";
const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");
const CHAT = "/openai/v1/chat/completions";
const STATUS = "/me/status";

interface LogLine {
  level: number;
  msg: string;
  req_id?: string;
  [key: string]: unknown;
}

/** A raw HTTP/1.1 request written in one piece, the connection closed after it; `host` null leaves the Host line out. */
function rawRequest(method: string, path: string, headers: Record<string, string>, body?: string, host: string | null = "exchange.test"): string {
  const lines = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`);
  if (body !== undefined && !Object.keys(headers).some((k) => /^(content-length|transfer-encoding)$/i.test(k)))
    lines.push(`Content-Length: ${Buffer.byteLength(body)}\r\n`);
  return `${method} ${path} HTTP/1.1\r\n${host === null ? "" : `Host: ${host}\r\n`}${lines.join("")}Connection: close\r\n\r\n${body ?? ""}`;
}

describe("the exchange and its native routes", () => {
  const clock = new ManualClock(Date.UTC(2026, 0, 1));
  const lines: LogLine[] = [];
  const waiting = new Set<() => void>();
  let server: TestServer;
  let upstream: FakeUpstream;
  let token: string;
  let publicKey: string;
  let sideControlToken: string;

  /** The request lines (not the failures logged beside them) of request id `id`. */
  const linesOf = (id: string) => lines.filter((l) => l.req_id === id && l.msg === "request");
  /** Resolves once `count` request lines carry request id `id`. */
  const linesFor = async (id: string, count: number): Promise<LogLine[]> => {
    while (linesOf(id).length < count) await new Promise<void>((resolve) => waiting.add(resolve));
    return linesOf(id);
  };

  const send = async (request: string) => {
    const { raw, timedOut } = await exchange(await tcp(server.port), request, 30_000);
    assert.equal(timedOut, false);
    return raw;
  };

  /**
   * `init` to `path` in process, with request id `id`: the status expected, and the one request
   * line it logs, with its route and status (`route` for the ones no route answers: `unmatched`).
   */
  const answer = async (what: string, id: string, path: string, init: RequestInit, status: number, route: string): Promise<Response> => {
    const res = await server.request(path, { ...init, headers: { ...(init.headers as Record<string, string>), "X-Request-ID": id } });
    assert.equal(res.status, status, what);
    assert.equal(res.headers.get("x-request-id"), id, `${what}: its request id`);
    assert.equal(res.headers.get("access-control-allow-origin"), "*", `${what}: CORS`);
    const [line] = await linesFor(id, 1);
    assert.deepEqual([line!.msg, line!.route, line!.status], ["request", route, status], `${what}: its log line`);
    return res;
  };

  /** The same over TCP, for a request `Request` cannot carry (a GET with a body). */
  const answerRaw = async (what: string, id: string, request: string, status: number, route: string): Promise<string> => {
    const raw = await send(request);
    assert.match(raw, new RegExp(`^HTTP/1\\.1 ${status} `), what);
    const [line] = await linesFor(id, 1);
    assert.deepEqual([line!.route, line!.status], [route, status], `${what}: its log line`);
    return raw;
  };

  before(async () => {
    upstream = await startFakeUpstream();
    const logger = pino(
      { level: "info" },
      {
        write(line: string) {
          lines.push(JSON.parse(line) as LogLine);
          for (const wake of waiting) wake();
          waiting.clear();
        },
      },
    );
    server = await startTestServer({
      clock,
      logger,
      config: {
        providers: [
          { id: "up", kind: "openai-compatible", base_url: upstream.url, max_retries: 0 },
          { id: "slow", kind: "openai-compatible", base_url: upstream.url, max_retries: 0, timeout_ms: 150 },
        ],
        models: [
          { id: "my-chat", kind: "chat", provider: "up", upstream_model: "llama3.2" },
          { id: "slow-chat", kind: "chat", provider: "slow", upstream_model: "sloth" },
        ],
        api_keys: [
          { name: "app", sha256: sha256(APP_KEY), models: ["*"] },
          { name: "metered", sha256: sha256(METERED_KEY), models: ["*"], rate_limit: 2 },
        ],
      },
    });
    const peer = server.client();
    await peer.login();
    token = peer.accessToken!;
    publicKey = peer.publicKey;
    await peer.putStatus({ volume: 33, battery_percent: 81 });
    const phone = server.client();
    await phone.login({ deviceToken: (await peer.createDeviceToken()).token });
    sideControlToken = phone.accessToken!;
  });

  after(async () => {
    await server?.stop();
    await upstream?.close();
  });

  test("GET /me/status: the document, and every refusal", async () => {
    const bearer = { Authorization: `Bearer ${token}` };
    const get = (headers: Record<string, string> = {}): RequestInit => ({ headers });
    const ok = await answer("success", "st-ok", STATUS, get(bearer), 200, STATUS);
    assert.equal(ok.headers.get("content-type"), "application/json; charset=utf-8");
    assert.equal((await ok.json()).battery_percent, 81);
    await answer("with its X-Public-Key", "st-key", STATUS, get({ ...bearer, "X-Public-Key": publicKey }), 200, STATUS);
    const none = await answer("no bearer", "st-none", STATUS, get(), 401, STATUS);
    assert.deepEqual(Object.keys((await none.json()).error).sort(), ["code", "message"]);
    await answer("an unknown bearer", "st-unknown", STATUS, get({ Authorization: "Bearer nope" }), 401, STATUS);
    await answer("not a bearer", "st-basic", STATUS, get({ Authorization: "Basic eDp5" }), 401, STATUS);
    await answer("another key's X-Public-Key", "st-mismatch", STATUS, get({ ...bearer, "X-Public-Key": server.client().publicKey }), 401, STATUS);
    const side = await answer("a Side Control session", "st-side", STATUS, get({ Authorization: `Bearer ${sideControlToken}` }), 403, STATUS);
    assert.equal((await side.json()).error.code, "PRIMARY_SESSION_REQUIRED");
    await answer("a query string", "st-query", `${STATUS}?x=1`, get(bearer), 200, STATUS);
    const head = await answer("HEAD", "st-head", STATUS, { method: "HEAD", headers: bearer }, 200, STATUS);
    assert.equal(head.headers.get("content-type"), "application/json; charset=utf-8");
    const preflight = await answer(
      "a preflight",
      "st-options",
      STATUS,
      { method: "OPTIONS", headers: { "Access-Control-Request-Method": "GET" } },
      204,
      "unmatched",
    );
    assert.match(preflight.headers.get("access-control-allow-methods") ?? "", /GET/);
    const post = await answer("another method", "st-post", STATUS, { method: "POST", headers: bearer, body: "{}" }, 405, "unmatched");
    assert.equal(post.headers.get("allow"), "GET, PUT");
    assert.equal((await post.json()).error.code, "METHOD_NOT_ALLOWED");

    // Bodies a GET may carry: the Public API's limit, declared or counted.
    const big = await answerRaw(
      "a body over the limit",
      "st-big",
      rawRequest("GET", STATUS, { ...bearer, "X-Request-ID": "st-big" }, "x".repeat(70_000)),
      413,
      STATUS,
    );
    assert.equal(JSON.parse(parseRawResponse(big)!.body).error.code, "PAYLOAD_TOO_LARGE");
    await answerRaw("a small body", "st-body", rawRequest("GET", STATUS, { ...bearer, "X-Request-ID": "st-body" }, "{}"), 200, STATUS);
    const chunk = "x".repeat(40_000);
    const chunked = `${chunk.length.toString(16)}\r\n${chunk}\r\n${chunk.length.toString(16)}\r\n${chunk}\r\n0\r\n\r\n`;
    await answerRaw(
      "a chunked body over the limit",
      "st-chunked",
      rawRequest("GET", STATUS, { ...bearer, "X-Request-ID": "st-chunked", "Transfer-Encoding": "chunked" }, chunked),
      413,
      STATUS,
    );

    // A request id the server makes itself.
    const made = await server.request(STATUS, get({ ...bearer, "X-Request-ID": "not a valid id" }));
    assert.match(made.headers.get("x-request-id") ?? "", /^[0-9a-f-]{36}$/);

    // Blocked, then revoked: refused at once on the very next request.
    await server.domain.peers.setBlocked(publicKey, true);
    await answer("a blocked peer", "st-blocked", STATUS, get(bearer), 403, STATUS);
    await server.domain.peers.setBlocked(publicKey, false);
    const other = server.client();
    const login = await other.login();
    const otherBearer = { Authorization: `Bearer ${other.accessToken}` };
    await answer("before its revocation", "st-live", STATUS, get(otherBearer), 200, STATUS);
    assert.equal(await server.domain.auth.revokeSession(login.session_id), true);
    await answer("a revoked session", "st-revoked", STATUS, get(otherBearer), 401, STATUS);
  });

  test("a status request reads the session once, refused or not", async () => {
    const auth = server.domain.auth;
    const original = auth.authenticate;
    let reads = 0;
    auth.authenticate = (...args) => {
      reads++;
      return original.apply(auth, args);
    };
    try {
      await answer("an unknown bearer, counted", "st-once", STATUS, { headers: { Authorization: "Bearer nope" } }, 401, STATUS);
      assert.equal(reads, 1);
      await answer("a session, counted", "st-once-ok", STATUS, { headers: { Authorization: `Bearer ${token}` } }, 200, STATUS);
      assert.equal(reads, 2);
    } finally {
      auth.authenticate = original;
    }
  });

  test("the Host: a missing or malformed one is refused on every request, a new one is served like any other", async () => {
    const bearer = { Authorization: `Bearer ${token}` };
    for (const [what, host] of [
      ["no Host", null],
      ["an empty Host", ""],
      ["a Host with a path", "exchange.test/x"],
      ["a Host with a space", "exchange test"],
    ] as const) {
      for (const path of [STATUS, "/server-info"]) {
        const refusedBefore = lines.filter((l) => l.msg === "request refused before routing").length;
        const raw = await send(rawRequest("GET", path, bearer, undefined, host));
        const r = parseRawResponse(raw)!;
        assert.equal(r.status, 400, `${what}, ${path}`);
        assert.equal(r.headers.connection, "close", `${what}, ${path}`);
        assert.deepEqual(JSON.parse(r.body), { error: { code: "INVALID_REQUEST", message: "the request is not well-formed HTTP/1.1" } }, `${what}, ${path}`);
        assert.ok(lines.filter((l) => l.msg === "request refused before routing").length > refusedBefore, `${what}, ${path}: logged`);
      }
    }
    // A backslash in the path: refused as the adapter refuses it, for a native route too.
    assert.match(await send(rawRequest("GET", "/me\\status", bearer)), /^HTTP\/1\.1 400 /);
    // Hosts never seen before, one after another (more than any bound a cache of them could have), each answered.
    for (let i = 0; i < 70; i++) {
      const raw = await send(rawRequest("GET", STATUS, bearer, undefined, `new-${i}.test:${1000 + i}`));
      assert.match(raw, /^HTTP\/1\.1 200 /, `new Host ${i}`);
      assert.match(parseRawResponse(raw)!.body, /"battery_percent":81/);
    }
    // Upper case, an IPv6 literal, the absolute form: parsed as a URL would.
    for (const host of ["EXCHANGE.Test", "[::1]:8080"]) assert.match(await send(rawRequest("GET", STATUS, bearer, undefined, host)), /^HTTP\/1\.1 200 /, host);
    assert.match(await send(rawRequest("GET", `http://absolute.test${STATUS}`, bearer)), /^HTTP\/1\.1 200 /);
  });

  test("POST /openai/v1/chat/completions: the completion, and every error", async () => {
    const json = { "Content-Type": "application/json" };
    const device = { ...json, Authorization: `Bearer ${token}` };
    const app = { ...json, Authorization: `Bearer ${APP_KEY}` };
    const body = (o: Record<string, unknown> = {}) => JSON.stringify({ model: "my-chat", messages: [{ role: "user", content: "Hi" }], ...o });
    const chat = (headers: Record<string, string>, b = body()): RequestInit => ({ method: "POST", headers, body: b });
    const call = (what: string, id: string, init: RequestInit, status: number) => answer(what, id, CHAT, init, status, CHAT);
    const error = async (res: Response) => ((await res.json()) as { error: { type: string; code: string | null } }).error;

    const ok = await call("a device's call", "ch-device", chat(device), 200);
    assert.equal(ok.headers.get("content-type"), "application/json");
    assert.match(await ok.text(), /"content":"Hello from llama3\.2"/);
    await call("an application's call", "ch-app", chat(app), 200);
    await call("no content type (OpenAI reads any)", "ch-type", chat({ Authorization: `Bearer ${APP_KEY}` }), 200);
    await call("another content type", "ch-text", chat({ "Content-Type": "text/plain", Authorization: `Bearer ${APP_KEY}` }), 200);
    await call("a large body", "ch-large", chat(app, body({ messages: [{ role: "user", content: "u".repeat(150_000) }] })), 200);
    assert.equal((await error(await call("no key", "ch-none", chat(json), 401))).code, "invalid_api_key");
    await call("a wrong key", "ch-wrong", chat({ ...json, Authorization: "Bearer sk-wrong" }), 401);
    assert.equal(
      (await error(await call("a Side Control session", "ch-side", chat({ ...json, Authorization: `Bearer ${sideControlToken}` }), 403))).type,
      "permission_error",
    );
    assert.equal((await error(await call("malformed JSON", "ch-malformed", chat(app, '{"model":'), 400))).code, "invalid_json");
    await call("an empty body", "ch-empty", chat(app, "   "), 400);
    assert.equal((await error(await call("an unknown parameter", "ch-param", chat(app, body({ bogus: 1 })), 400))).code, "unknown_parameter");
    await call("an invalid value", "ch-value", chat(app, body({ temperature: "hot" })), 400);
    await call("an unknown model", "ch-model", chat(app, body({ model: "nope" })), 404);
    const other = await answer("another method", "ch-get", CHAT, { headers: app }, 405, "unmatched");
    assert.equal(other.headers.get("allow"), "POST");
    assert.equal((await error(other)).code, "method_not_allowed");
    const huge = await answerRaw(
      "a body declared over 32 MiB",
      "ch-huge",
      rawRequest("POST", CHAT, { ...app, "X-Request-ID": "ch-huge", "Content-Length": String(40 * 1024 * 1024) }),
      413,
      CHAT,
    );
    assert.equal(JSON.parse(parseRawResponse(huge)!.body).error.code, "request_too_large");
    const streamed = await call("a stream", "ch-stream", chat(app, body({ stream: true })), 200);
    assert.equal(streamed.headers.get("content-type"), "text/event-stream; charset=utf-8");
    assert.match(await streamed.text(), /data: \[DONE\]/);
    await call("a stream with its usage", "ch-usage", chat(device, body({ stream: true, stream_options: { include_usage: true } })), 200);
    upstream.reply({ chunks: ["Hel", "lo"], after: "close" });
    const broken = await call("a stream the provider cuts short", "ch-cut", chat(app, body({ stream: true })), 200);
    assert.match(await broken.text(), /"error":/);

    upstream.reply({ status: 500, error: { message: "boom" } });
    await call("the provider fails", "ch-upstream", chat(app), 502);
    upstream.reply({ status: 429, retryAfter: "7", error: { message: "slow down" } });
    await call("the provider limits", "ch-limited", chat(app), 502);
    upstream.reply({ hang: true });
    await call("the provider does not answer in time", "ch-timeout", chat(app, body({ model: "slow-chat" })), 504);

    // The metered key allows two calls, then refuses with its Retry-After, streamed or not.
    const metered = { ...json, Authorization: `Bearer ${METERED_KEY}` };
    await call("within the key's rate", "ch-meter-1", chat(metered), 200);
    await call("within the key's rate, streamed", "ch-meter-2", chat(metered, body({ stream: true })), 200);
    const refused = await call("over the key's rate", "ch-meter-3", chat(metered), 429);
    assert.match(refused.headers.get("retry-after") ?? "", /^\d+$/);
    await call("over the rate, streamed", "ch-meter-4", chat(metered, body({ stream: true })), 429);
  });

  test("a client that leaves during the call: 499 logged, the provider's call cancelled", async () => {
    upstream.reply({ hang: true });
    const socket = await tcp(server.port);
    socket.write(
      rawRequest(
        "POST",
        CHAT,
        { "Content-Type": "application/json", Authorization: `Bearer ${APP_KEY}`, "X-Request-ID": "gone" },
        JSON.stringify({ model: "my-chat", messages: [{ role: "user", content: "Hi" }] }),
      ),
    );
    const received = upstream.received.length;
    while (upstream.received.length === received) await new Promise((r) => setTimeout(r, 10));
    socket.destroy();
    await upstream.received.at(-1)!.aborted;
    const [line] = await linesFor("gone", 1);
    assert.deepEqual([line!.status, line!.route], [499, CHAT]);
  });

  const metric = async (series: string) => {
    const text = await (await server.request("/metrics")).text();
    const line = text.split("\n").find((l) => l.startsWith(`${series} `));
    return Number(line?.split(" ")[1] ?? 0);
  };

  test("a client that leaves a stream: its call counted 499 once, the provider's stream cancelled", async () => {
    const gone = 'perch_ai_requests_total{route="/chat/completions",model="my-chat",status="499"}';
    const ok = 'perch_ai_requests_total{route="/chat/completions",model="my-chat",status="200"}';
    const before = await metric(gone);
    const okBefore = await metric(ok);
    upstream.reply({ hang: true });
    const socket = await tcp(server.port);
    const body = JSON.stringify({ model: "my-chat", messages: [{ role: "user", content: "Hi" }], stream: true });
    const first = new Promise<string>((resolve) => socket.once("data", (d: Buffer) => resolve(d.toString())));
    socket.write(rawRequest("POST", CHAT, { "Content-Type": "application/json", Authorization: `Bearer ${APP_KEY}`, "X-Request-ID": "left" }, body));
    assert.match(await first, /^HTTP\/1\.1 200 /);
    socket.destroy();
    await upstream.received.at(-1)!.aborted;
    assert.equal(await metric(gone), before + 1);
    // Once: the provider's stream, cut, then fails the awaited event; that is not a second end.
    assert.equal(await metric(ok), okBefore, "counted again as ended");
  });

  test("the native routes' requests are counted in the metrics under their routes' labels", async () => {
    const status = 'perch_http_requests_total{method="GET",route="/me/status",status="200"}';
    const calls = 'perch_ai_requests_total{route="/chat/completions",model="my-chat",status="200"}';
    const http = 'perch_http_requests_total{method="POST",route="/openai/v1/chat/completions",status="200"}';
    const [s0, c0, h0] = [await metric(status), await metric(calls), await metric(http)];
    assert.equal((await server.request(STATUS, { headers: { Authorization: `Bearer ${token}` } })).status, 200);
    const res = await server.request(CHAT, {
      method: "POST",
      headers: { Authorization: `Bearer ${APP_KEY}` },
      body: JSON.stringify({ model: "my-chat", messages: [{ role: "user", content: "Hi" }] }),
    });
    assert.equal(res.status, 200);
    assert.deepEqual([await metric(status), await metric(calls), await metric(http)], [s0 + 1, c0 + 1, h0 + 1]);
  });

  test("an expired session is refused", async () => {
    clock.advance(400 * 24 * 3600 * 1000);
    await answer("status, expired", "st-expired", STATUS, { headers: { Authorization: `Bearer ${token}` } }, 401, STATUS);
    await answer(
      "chat, expired",
      "ch-expired",
      CHAT,
      { method: "POST", headers: { Authorization: `Bearer ${token}` }, body: JSON.stringify({ model: "my-chat", messages: [] }) },
      401,
      CHAT,
    );
  });
});
