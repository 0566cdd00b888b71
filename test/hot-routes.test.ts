/**
 * The listener's hot routes (`GET /me/status`, `POST /openai/v1/chat/completions`, served before
 * Hono: src/http/hot-routes.ts) answer every request byte for byte as the app does. The same
 * battery (successes and every error) goes to the node's TCP listener and to a second listener
 * that serves the same node's app without them; the raw answers (the `Date` line aside), the
 * request log lines and the state left behind (rate limits, revocation) must match.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import pino from "pino";
import { ManualClock } from "../src/domain/clock.ts";
import { createHttpServer } from "../src/http/listener.ts";
import { Metrics } from "../src/http/metrics.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { exchange, tcp } from "./support/raw-http.ts";
import { startTestServer, type TestServer } from "./support/server.ts";

const APP_KEY = "sk-perch-hot-app";
const METERED_KEY = "sk-perch-hot-metered";
const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");
const HOST = "hot.test";
const CHAT = "/openai/v1/chat/completions";

interface LogLine {
  level: number;
  msg: string;
  req_id?: string;
  [key: string]: unknown;
}

/** A raw HTTP/1.1 request written in one piece (so a small body arrives with its head), the connection closed after it. */
function rawRequest(method: string, path: string, headers: Record<string, string>, body?: string): string {
  const lines = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`);
  if (body !== undefined) lines.push(`Content-Length: ${Buffer.byteLength(body)}\r\n`);
  return `${method} ${path} HTTP/1.1\r\nHost: ${HOST}\r\n${lines.join("")}Connection: close\r\n\r\n${body ?? ""}`;
}

describe("hot routes answer as the app does", () => {
  const clock = new ManualClock(Date.UTC(2026, 0, 1));
  const lines: LogLine[] = [];
  const waiting = new Set<() => void>();
  let server: TestServer;
  let upstream: FakeUpstream;
  let appOnly: Server;
  let appPort: number;
  let token: string;
  let publicKey: string;
  let sideControlToken: string;

  /** The lines logged for a request id so far. */
  const linesOf = (id: string) => lines.filter((l) => l.req_id === id);
  /** Resolves once `count` lines carry request id `id` (what a request logs after its answer is written). */
  const linesFor = async (id: string, count: number): Promise<LogLine[]> => {
    while (linesOf(id).length < count) await new Promise<void>((resolve) => waiting.add(resolve));
    return linesOf(id);
  };

  /** What a log line says, without its timing. */
  const said = (l: LogLine) => ({ level: l.level, msg: l.msg, method: l.method, path: l.path, route: l.route, status: l.status, client: l.client });

  const send = async (port: number, request: string) => {
    const { raw, timedOut } = await exchange(await tcp(port), request, 30_000);
    assert.equal(timedOut, false);
    return raw.replace(/^Date: .*\r\n/m, "");
  };

  /**
   * `request` to the hot listener, then to the app alone: the same raw answer, and the same log
   * lines (each request logs its own: two of each, the hot one first). `by`: whether a hot route
   * answered it itself, or handed it to the app.
   */
  const same = async (what: string, id: string, request: string, expectedStatus: number, by?: "hot" | "app"): Promise<string> => {
    const before = linesOf(id).length;
    const answered = server.hotRoutes.answered;
    const hot = await send(server.port, request);
    if (by) assert.equal(server.hotRoutes.answered - answered, by === "hot" ? 1 : 0, `${what}: answered by the ${by === "hot" ? "hot route" : "app"}`);
    const hotLines = (await linesFor(id, before + 1)).slice(before);
    const app = await send(appPort, request);
    const all = await linesFor(id, before + 2 * hotLines.length);
    assert.equal(hot, app, what);
    assert.match(hot, new RegExp(`^HTTP/1\\.1 ${expectedStatus} `), what);
    assert.equal(all.length - before, 2 * hotLines.length, `${what}: as many log lines each way`);
    assert.deepEqual(all.slice(before, before + hotLines.length).map(said), all.slice(before + hotLines.length).map(said), what);
    return hot;
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
    appOnly = createHttpServer({
      fetch: (request, env) => server.app.fetch(request, env),
      requestTimeoutMs: 30_000,
      maxConnections: 100,
      logger: pino({ level: "silent" }),
      metrics: new Metrics(async () => 0),
    });
    await new Promise<void>((resolve) => appOnly.listen(0, "127.0.0.1", resolve));
    appPort = (appOnly.address() as AddressInfo).port;

    const peer = server.client();
    await peer.login();
    token = peer.accessToken!;
    publicKey = peer.publicKey;
    await peer.putStatus({ volume: 33, battery_percent: 81 });
    const phone = server.client();
    await phone.login({ deviceToken: (await peer.createDeviceToken()).token });
    sideControlToken = phone.accessToken!;
    // The hot routes serve a Host only once the app has accepted it.
    await send(server.port, rawRequest("GET", "/server-info", {}));
  });

  after(async () => {
    await new Promise((resolve) => appOnly?.close(resolve));
    await server?.stop();
    await upstream?.close();
  });

  test("GET /me/status: the document, and every refusal", async () => {
    const bearer = { Authorization: `Bearer ${token}` };
    const ok = await same("success", "st-ok", rawRequest("GET", "/me/status", { ...bearer, "X-Request-ID": "st-ok" }), 200, "hot");
    assert.match(ok, /\r\n\r\n\{.*"battery_percent":81/);
    await same(
      "with its X-Public-Key",
      "st-key",
      rawRequest("GET", "/me/status", { ...bearer, "X-Public-Key": publicKey, "X-Request-ID": "st-key" }),
      200,
      "hot",
    );
    await same("no bearer", "st-none", rawRequest("GET", "/me/status", { "X-Request-ID": "st-none" }), 401, "app");
    await same("an unknown bearer", "st-unknown", rawRequest("GET", "/me/status", { Authorization: "Bearer nope", "X-Request-ID": "st-unknown" }), 401, "app");
    await same("not a bearer", "st-basic", rawRequest("GET", "/me/status", { Authorization: "Basic eDp5", "X-Request-ID": "st-basic" }), 401);
    await same(
      "another key's X-Public-Key",
      "st-mismatch",
      rawRequest("GET", "/me/status", { ...bearer, "X-Public-Key": server.client().publicKey, "X-Request-ID": "st-mismatch" }),
      401,
    );
    await same(
      "a Side Control session",
      "st-side",
      rawRequest("GET", "/me/status", { Authorization: `Bearer ${sideControlToken}`, "X-Request-ID": "st-side" }),
      403,
    );
    await same("a body over the limit", "st-big", rawRequest("GET", "/me/status", { ...bearer, "X-Request-ID": "st-big" }, "x".repeat(70_000)), 413);
    await same("a small body", "st-body", rawRequest("GET", "/me/status", { ...bearer, "X-Request-ID": "st-body" }, "{}"), 200);
    await same("a query string", "st-query", rawRequest("GET", "/me/status?x=1", { ...bearer, "X-Request-ID": "st-query" }), 200);
    await same("a preflight", "st-options", rawRequest("OPTIONS", "/me/status", { "X-Request-ID": "st-options", "Access-Control-Request-Method": "GET" }), 204);
    await same("another method", "st-post", rawRequest("POST", "/me/status", { ...bearer, "X-Request-ID": "st-post" }, "{}"), 405);

    // A request id the server makes itself: the same shape either way.
    const hot = await send(server.port, rawRequest("GET", "/me/status", { ...bearer, "X-Request-ID": "not a valid id" }));
    const app = await send(appPort, rawRequest("GET", "/me/status", { ...bearer, "X-Request-ID": "not a valid id" }));
    const uuid = /X-Request-ID: [0-9a-f-]{36}\r\n/;
    assert.match(hot, uuid);
    assert.equal(hot.replace(uuid, ""), app.replace(uuid, ""));

    // Blocked, then revoked: refused at once on the very next request, either way.
    await server.domain.peers.setBlocked(publicKey, true);
    await same("a blocked peer", "st-blocked", rawRequest("GET", "/me/status", { ...bearer, "X-Request-ID": "st-blocked" }), 403);
    await server.domain.peers.setBlocked(publicKey, false);
    const other = server.client();
    const login = await other.login();
    const otherBearer = { Authorization: `Bearer ${other.accessToken}` };
    await same("before its revocation", "st-live", rawRequest("GET", "/me/status", { ...otherBearer, "X-Request-ID": "st-live" }), 200);
    assert.equal(await server.domain.auth.revokeSession(login.session_id), true);
    await same("a revoked session", "st-revoked", rawRequest("GET", "/me/status", { ...otherBearer, "X-Request-ID": "st-revoked" }), 401);
  });

  test("a refusal the hot route hands to the app reads the session once: the app takes the same answer", async () => {
    const auth = server.domain.auth;
    const original = auth.authenticateWithStatus;
    let reads = 0;
    auth.authenticateWithStatus = (...args) => {
      reads++;
      return original.apply(auth, args);
    };
    try {
      await same(
        "an unknown bearer, counted",
        "st-once",
        rawRequest("GET", "/me/status", { Authorization: "Bearer nope", "X-Request-ID": "st-once" }),
        401,
        "app",
      );
      // Once for the hot listener's request, once for the app-only listener's.
      assert.equal(reads, 2);
    } finally {
      auth.authenticateWithStatus = original;
    }
  });

  test("POST /openai/v1/chat/completions: the completion, and every error", async () => {
    const json = { "Content-Type": "application/json" };
    const device = { ...json, Authorization: `Bearer ${token}` };
    const app = { ...json, Authorization: `Bearer ${APP_KEY}` };
    const body = (o: Record<string, unknown> = {}) => JSON.stringify({ model: "my-chat", messages: [{ role: "user", content: "Hi" }], ...o });
    const chat = (id: string, headers: Record<string, string>, b = body()) => rawRequest("POST", CHAT, { ...headers, "X-Request-ID": id }, b);

    const ok = await same("a device's call", "ch-device", chat("ch-device", device), 200, "hot");
    assert.match(ok, /"content":"Hello from llama3\.2"/);
    await same("an application's call", "ch-app", chat("ch-app", app), 200, "hot");
    await same("no content type (OpenAI reads any)", "ch-type", chat("ch-type", { Authorization: `Bearer ${APP_KEY}` }), 200);
    await same("another content type", "ch-text", chat("ch-text", { "Content-Type": "text/plain", Authorization: `Bearer ${APP_KEY}` }), 200);
    await same(
      "a body over the hot route's size",
      "ch-large",
      chat("ch-large", app, body({ messages: [{ role: "user", content: "u".repeat(150_000) }] })),
      200,
    );
    await same("no key", "ch-none", chat("ch-none", json), 401, "app");
    await same("a wrong key", "ch-wrong", chat("ch-wrong", { ...json, Authorization: "Bearer sk-wrong" }), 401);
    await same("a Side Control session", "ch-side", chat("ch-side", { ...json, Authorization: `Bearer ${sideControlToken}` }), 403);
    await same("malformed JSON", "ch-malformed", chat("ch-malformed", app, '{"model":'), 400);
    await same("an empty body", "ch-empty", chat("ch-empty", app, "   "), 400);
    await same("an unknown parameter", "ch-param", chat("ch-param", app, body({ bogus: 1 })), 400);
    await same("an invalid value", "ch-value", chat("ch-value", app, body({ temperature: "hot" })), 400);
    await same("an unknown model", "ch-model", chat("ch-model", app, body({ model: "nope" })), 404);
    await same(
      "a body declared over 32 MiB",
      "ch-huge",
      rawRequest("POST", CHAT, { ...app, "X-Request-ID": "ch-huge", "Content-Length": String(40 * 1024 * 1024) }),
      413,
    );
    const streamed = await same("a stream", "ch-stream", chat("ch-stream", app, body({ stream: true })), 200, "hot");
    assert.match(streamed, /data: \[DONE\]/);
    await same("a stream with its usage", "ch-usage", chat("ch-usage", device, body({ stream: true, stream_options: { include_usage: true } })), 200);
    const cut = { chunks: ["Hel", "lo"], after: "close" as const };
    upstream.reply(cut, cut);
    const broken = await same("a stream the provider cuts short", "ch-cut", chat("ch-cut", app, body({ stream: true })), 200);
    assert.match(broken, /"error":/);

    upstream.reply({ status: 500, error: { message: "boom" } }, { status: 500, error: { message: "boom" } });
    await same("the provider fails", "ch-upstream", chat("ch-upstream", app), 502, "hot");
    upstream.reply({ status: 429, retryAfter: "7", error: { message: "slow down" } }, { status: 429, retryAfter: "7", error: { message: "slow down" } });
    await same("the provider limits", "ch-limited", chat("ch-limited", app), 502);
    upstream.reply({ hang: true }, { hang: true });
    await same("the provider does not answer in time", "ch-timeout", chat("ch-timeout", app, body({ model: "slow-chat" })), 504);

    // The metered key allows two calls: one each way (a stream, which the hot route hands to the
    // app: counted once), then refused with its Retry-After each way.
    const metered = { ...json, Authorization: `Bearer ${METERED_KEY}` };
    await same("within the key's rate, streamed", "ch-meter-1", chat("ch-meter-1", metered, body({ stream: true })), 200);
    const refused = await same("over the key's rate", "ch-meter-2", chat("ch-meter-2", metered), 429);
    assert.match(refused, /retry-after: \d+\r\n/i);
    await same("over the rate, streamed", "ch-meter-3", chat("ch-meter-3", metered, body({ stream: true })), 429);
  });

  test("a client that leaves during the call: 499 logged either way, the provider's call cancelled", async () => {
    const logged: LogLine[] = [];
    for (const [port, id] of [
      [server.port, "gone-hot"],
      [appPort, "gone-app"],
    ] as const) {
      upstream.reply({ hang: true });
      const socket = await tcp(port);
      socket.write(
        rawRequest(
          "POST",
          CHAT,
          { "Content-Type": "application/json", Authorization: `Bearer ${APP_KEY}`, "X-Request-ID": id },
          JSON.stringify({ model: "my-chat", messages: [{ role: "user", content: "Hi" }] }),
        ),
      );
      const received = upstream.received.length;
      while (upstream.received.length === received) await new Promise((r) => setTimeout(r, 10));
      socket.destroy();
      await upstream.received.at(-1)!.aborted;
      logged.push(...(await linesFor(id, 1)));
    }
    assert.equal(logged.length, 2);
    assert.deepEqual(said(logged[0]!), said(logged[1]!));
    assert.deepEqual([logged[0]!.status, logged[0]!.route], [499, CHAT]);
  });

  const metric = async (series: string) => {
    const text = await (await fetch(`${server.url}/metrics`)).text();
    const line = text.split("\n").find((l) => l.startsWith(`${series} `));
    return Number(line?.split(" ")[1] ?? 0);
  };

  test("a client that leaves a stream: its call counted 499 either way, the provider's stream cancelled", async () => {
    const gone = 'perch_ai_requests_total{route="/chat/completions",model="my-chat",status="499"}';
    const ok = 'perch_ai_requests_total{route="/chat/completions",model="my-chat",status="200"}';
    for (const [port, id] of [
      [server.port, "left-hot"],
      [appPort, "left-app"],
    ] as const) {
      const before = await metric(gone);
      const okBefore = await metric(ok);
      upstream.reply({ hang: true });
      const socket = await tcp(port);
      const body = JSON.stringify({ model: "my-chat", messages: [{ role: "user", content: "Hi" }], stream: true });
      const first = new Promise<string>((resolve) => socket.once("data", (d: Buffer) => resolve(d.toString())));
      socket.write(rawRequest("POST", CHAT, { "Content-Type": "application/json", Authorization: `Bearer ${APP_KEY}`, "X-Request-ID": id }, body));
      assert.match(await first, /^HTTP\/1\.1 200 /);
      socket.destroy();
      await upstream.received.at(-1)!.aborted;
      // The call is counted when its body is cancelled, which is what cancels the provider's stream.
      assert.equal(await metric(gone), before + 1, id);
      // Once: the provider's stream, cut, then fails the awaited event; that is not a second end.
      assert.equal(await metric(ok), okBefore, `${id}: counted again as ended`);
    }
  });

  test("the hot routes' requests are counted in the metrics under the app's labels", async () => {
    const status = 'perch_http_requests_total{method="GET",route="/me/status",status="200"}';
    const calls = 'perch_ai_requests_total{route="/chat/completions",model="my-chat",status="200"}';
    const http = 'perch_http_requests_total{method="POST",route="/openai/v1/chat/completions",status="200"}';
    const [s0, c0, h0] = [await metric(status), await metric(calls), await metric(http)];
    await send(server.port, rawRequest("GET", "/me/status", { Authorization: `Bearer ${token}` }));
    await send(
      server.port,
      rawRequest("POST", CHAT, { Authorization: `Bearer ${APP_KEY}` }, JSON.stringify({ model: "my-chat", messages: [{ role: "user", content: "Hi" }] })),
    );
    assert.deepEqual([await metric(status), await metric(calls), await metric(http)], [s0 + 1, c0 + 1, h0 + 1]);
  });

  test("an expired session is refused either way", async () => {
    clock.advance(400 * 24 * 3600 * 1000);
    await same("status, expired", "st-expired", rawRequest("GET", "/me/status", { Authorization: `Bearer ${token}`, "X-Request-ID": "st-expired" }), 401);
    await same(
      "chat, expired",
      "ch-expired",
      rawRequest("POST", CHAT, { Authorization: `Bearer ${token}`, "X-Request-ID": "ch-expired" }, JSON.stringify({ model: "my-chat", messages: [] })),
      401,
    );
  });
});
