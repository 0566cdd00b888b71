/**
 * One root, several surfaces: each answers its own 404/405/413 and errors in its own envelope, the
 * root routes by base path, and the caller is resolved in one place (connection, then bearer).
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { Context } from "hono";
import { Hono } from "hono";
import pino from "pino";
import { DomainError } from "../src/domain/errors.ts";
import type { AppEnv } from "../src/http/env.ts";
import { bodyLimit } from "../src/http/middleware.ts";
import type { Surface } from "../src/http/surface.ts";
import { PerchApiError, PerchClient } from "../src/sdk/client.ts";
import type { HttpResponse, PerchConnection } from "../src/sdk/webrtc.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { UdpRelay } from "./support/udp-relay.ts";
import { connect, eventually } from "./support/webrtc.ts";

const JSON_UTF8 = "application/json; charset=utf-8";
const REQUEST_ID = /^[A-Za-z0-9._-]{1,128}$/;

/** A stand-in for the Compatible API: OpenAI's error envelope, a 1 MiB body limit, two routes. */
function openAiLikeSurface(): Surface {
  const fail = (c: Context<AppEnv>, status: 404 | 405 | 413 | 429 | 500, message: string, type: string, code: string | null) =>
    c.json({ error: { message, type, param: null, code } }, status);
  const app = new Hono<AppEnv>();
  app.post(
    "/echo",
    bodyLimit(1024 * 1024, (c) => fail(c, 413, "request body is over 1 MiB", "invalid_request_error", null)),
    async (c) => c.json({ bytes: (await c.req.arrayBuffer()).byteLength }),
  );
  app.get("/limited", () => {
    throw new DomainError("rate_limited", "RATE_LIMITED", "slow down", undefined, 7);
  });
  return {
    base: "/openai/v1",
    app,
    failure: (err) => {
      const error = (status: number, message: string, type: string, code: string | null) => ({
        status,
        body: { error: { message, type, param: null, code } },
        contentType: "application/json",
        ...(err instanceof DomainError ? { retryAfter: err.retryAfter } : {}),
      });
      if (err instanceof DomainError && err.kind === "rate_limited") return error(429, err.message, "rate_limit_error", "rate_limit_exceeded");
      return error(500, "internal error", "api_error", null);
    },
    unrouted: (c, allow) => {
      if (allow.length === 0) return fail(c, 404, `Invalid URL (${c.req.method} ${c.req.path})`, "invalid_request_error", null);
      c.header("Allow", allow.join(", "));
      return fail(c, 405, `${c.req.method} is not allowed`, "invalid_request_error", "method_not_allowed");
    },
  };
}

async function openAiError(res: Response, status: number, type: string): Promise<Record<string, unknown>> {
  assert.equal(res.status, status);
  assert.match(res.headers.get("x-request-id") ?? "", REQUEST_ID);
  assert.equal(res.headers.get("access-control-allow-origin"), "*");
  const body = (await res.json()) as { error: Record<string, unknown> };
  assert.deepEqual(Object.keys(body), ["error"]);
  assert.deepEqual(Object.keys(body.error).sort(), ["code", "message", "param", "type"]);
  assert.equal(body.error.type, type);
  return body.error;
}

async function publicError(res: Response, status: number, code: string): Promise<void> {
  assert.equal(res.status, status, `${res.url}`);
  assert.equal(res.headers.get("content-type"), JSON_UTF8);
  assert.match(res.headers.get("x-request-id") ?? "", REQUEST_ID);
  const body = (await res.json()) as { error: { code: string; message: string } };
  assert.equal(body.error.code, code);
  assert.equal(typeof body.error.message, "string");
}

describe("surfaces", () => {
  let server: TestServer;
  let device: PerchClient;
  before(async () => {
    server = await startTestServer({ surfaces: () => [openAiLikeSurface()] });
    device = server.client();
    await device.login();
  });
  after(() => server.stop());

  test("a surface mounted at /openai/v1 answers its own 404, 405, 413 and errors; the Public API keeps its own", async () => {
    const u = server.url;
    let error = await openAiError(await fetch(`${u}/openai/v1/nope`), 404, "invalid_request_error");
    assert.equal(error.message, "Invalid URL (GET /openai/v1/nope)");
    await openAiError(await fetch(`${u}/openai/v1`), 404, "invalid_request_error");
    await openAiError(await fetch(`${u}/openai/v1/me/status`, { headers: { authorization: `Bearer ${device.accessToken}` } }), 404, "invalid_request_error");
    const wrongMethod = await fetch(`${u}/openai/v1/echo`);
    assert.equal(wrongMethod.headers.get("allow"), "POST");
    error = await openAiError(wrongMethod, 405, "invalid_request_error");
    assert.equal(error.code, "method_not_allowed");

    // Its own body limit: over the Public API's 64 KiB is fine here, over 1 MiB is its own 413.
    const big = await fetch(`${u}/openai/v1/echo`, { method: "POST", body: "x".repeat(100 * 1024) });
    assert.equal(big.status, 200);
    assert.deepEqual(await big.json(), { bytes: 100 * 1024 });
    await openAiError(await fetch(`${u}/openai/v1/echo`, { method: "POST", body: "x".repeat(1024 * 1024 + 1) }), 413, "invalid_request_error");

    // Domain errors are mapped by the surface that raised them.
    const limited = await fetch(`${u}/openai/v1/limited`);
    assert.equal(limited.headers.get("retry-after"), "7");
    error = await openAiError(limited, 429, "rate_limit_error");
    assert.equal(error.code, "rate_limit_exceeded");

    // A path that only starts with the base path, and everything else, is the Public API's.
    await publicError(await fetch(`${u}/openai/v1x/nope`), 404, "NOT_FOUND");
    await publicError(await fetch(`${u}/openai`), 404, "NOT_FOUND");
    await publicError(
      await fetch(`${u}/me/status`, {
        method: "PUT",
        headers: { authorization: `Bearer ${device.accessToken}`, "content-type": "application/json" },
        body: `{}${" ".repeat(64 * 1024)}`,
      }),
      413,
      "PAYLOAD_TOO_LARGE",
    );
    const healthz = await fetch(`${u}/healthz`, { method: "POST" });
    assert.equal(healthz.headers.get("allow"), "GET");
    await publicError(healthz, 405, "METHOD_NOT_ALLOWED");
    assert.equal((await fetch(`${u}/healthz`)).status, 200);
  });

  test("the 405 matcher takes route paths literally: /openapiXjson is unknown", async () => {
    for (const path of ["/openapiXjson", "/openapi.jsonX", "/healthzz", "/me/statu", "/side-control/contacts/a/b"]) {
      await publicError(await fetch(`${server.url}${path}`), 404, "NOT_FOUND");
    }
    const doc = await fetch(`${server.url}/openapi.json`);
    assert.equal(doc.status, 200);
    assert.equal(doc.headers.get("content-type"), JSON_UTF8);
    await doc.arrayBuffer();
    const post = await fetch(`${server.url}/openapi.json`, { method: "POST" });
    assert.equal(post.headers.get("allow"), "GET");
    await publicError(post, 405, "METHOD_NOT_ALLOWED");
  });

  test("every JSON response says application/json; charset=utf-8", async () => {
    const u = server.url;
    const bearer = { authorization: `Bearer ${device.accessToken}` };
    const json = { ...bearer, "content-type": "application/json" };
    const token = await device.createDeviceToken();
    const phone = server.client();
    const assertion = await phone.assertion();
    const cases: Array<[string, number, () => Promise<Response>]> = [
      ["server-info", 200, () => fetch(`${u}/server-info`)],
      [
        "login",
        200,
        () =>
          fetch(`${u}/login`, {
            method: "POST",
            headers: { authorization: `Bearer ${assertion}`, "x-public-key": phone.publicKey, "content-type": "application/json" },
            body: JSON.stringify({ grant_type: "side_control", device_token: token.token }),
          }),
      ],
      ["me", 200, () => fetch(`${u}/me`, { headers: bearer })],
      ["status", 200, () => fetch(`${u}/me/status`, { headers: bearer })],
      ["put status", 200, () => fetch(`${u}/me/status`, { method: "PUT", headers: json, body: '{"volume":3}' })],
      ["device token", 201, () => fetch(`${u}/me/side-control/device-tokens`, { method: "POST", headers: bearer })],
      ["healthz", 200, () => fetch(`${u}/healthz`)],
      ["openapi", 200, () => fetch(`${u}/openapi.json`)],
      ["401", 401, () => fetch(`${u}/me`)],
      ["403", 403, () => fetch(`${u}/side-control/status`, { headers: bearer })],
      ["404", 404, () => fetch(`${u}/nope`)],
      ["405", 405, () => fetch(`${u}/me`, { method: "DELETE" })],
      ["400", 400, () => fetch(`${u}/me/status`, { method: "PUT", headers: json, body: "{" })],
      ["400 field", 400, () => fetch(`${u}/me/status`, { method: "PUT", headers: json, body: '{"volume":1000}' })],
      ["413", 413, () => fetch(`${u}/me/status`, { method: "PUT", headers: json, body: "x".repeat(70_000) })],
      ["415", 415, () => fetch(`${u}/me/status`, { method: "PUT", headers: bearer, body: "{}" })],
    ];
    for (const [name, status, send] of cases) {
      const res = await send();
      assert.equal(res.status, status, name);
      assert.equal(res.headers.get("content-type"), JSON_UTF8, name);
      JSON.parse(await res.text());
    }
  });
});

/**
 * Who is calling over a device's own connection: real devices, connected over WebRTC, their
 * requests on stream 1 served as production serves them. Each device reaches the server through a
 * UDP relay that sends from a loopback address of its own (127.0.0.2, 127.0.0.3), so the address
 * the server sees for a connection is not the 127.0.0.1 every TCP client here has (or is, when the
 * relay sends from 127.0.0.1).
 */
describe("who is calling", () => {
  let server: TestServer;
  let log = "";
  const relays: UdpRelay[] = [];
  const conns: PerchConnection[] = [];
  before(async () => {
    const logger = pino(
      { level: "info" },
      {
        write: (line: string) => {
          log += line;
        },
      },
    );
    // The watch for blocked and removed peers polls SQLite off: a block written to the store below
    // reaches the open connection only through its requests' own checks, as one written by another
    // node whose notice has not arrived yet would.
    server = await startTestServer({ logger, config: { webrtc: { peer_poll_ms: 0 } } });
  });
  after(async () => {
    for (const c of conns) c.close();
    for (const r of relays) r.close();
    await server.stop();
  });

  /** A device connected to `s` from `address`; the server sees the connection there. */
  async function deviceFrom(s: TestServer, address: string): Promise<PerchConnection> {
    const relay = await UdpRelay.start({ source: address });
    relays.push(relay);
    const conn = await connect(s, { rtc: relay.rtc() });
    conns.push(conn);
    const held = await eventually(() => s.transport!.connection(conn.publicKey));
    assert.equal(held.link.remoteAddress()?.replace(/:\d+$/, ""), address, "the connection's address");
    return conn;
  }

  const json = { "content-type": "application/json" };
  const error = (res: HttpResponse) => res.json<{ error: { code: string } }>().error.code;

  test("a connection's peer is a primary principal on the Public API without a bearer", async () => {
    const conn = await deviceFrom(server, "127.0.0.2");
    assert.equal((await conn.http(1, "PUT", "/me/status", { body: '{"volume":21}', headers: json })).status, 200);

    let res = await conn.http(1, "GET", "/me/status", { headers: { "x-request-id": "over-stream.1" } });
    assert.equal(res.status, 200);
    assert.equal(res.headers["content-type"], JSON_UTF8);
    assert.equal(res.headers["x-request-id"], "over-stream.1");
    assert.equal(res.json<{ volume: number }>().volume, 21);

    // Written as the connection's peer: the same key's session over TCP reads it.
    const tcp = new PerchClient({ baseUrl: server.url, keyPair: conn.keyPair });
    await tcp.login();
    assert.equal((await tcp.status()).volume, 21);
    res = await conn.http(1, "PUT", "/me/status", { body: '{"volume":22}', headers: json });
    assert.equal(res.status, 200);
    assert.equal((await tcp.status()).volume, 22, "written as the connection's peer");

    // The connection decides, whatever bearer the request carries.
    const other = server.client();
    await other.login();
    res = await conn.http(1, "GET", "/me", { headers: { authorization: `Bearer ${other.accessToken}` } });
    assert.equal(res.status, 200);
    assert.equal(res.json<{ public_key: string }>().public_key, conn.publicKey);

    // It is a primary principal: Side Control routes refuse it; a contradicting X-Public-Key is refused.
    res = await conn.http(1, "GET", "/side-control/status");
    assert.equal(res.status, 403);
    assert.equal(error(res), "SIDE_CONTROL_SESSION_REQUIRED");
    res = await conn.http(1, "GET", "/me", { headers: { "x-public-key": other.publicKey } });
    assert.equal(res.status, 401);
    assert.equal(error(res), "PUBLIC_KEY_MISMATCH");

    // The peer is re-checked on every request: blocked, then removed, in the store while its connection is open.
    assert.equal(await server.store.transaction((tx) => tx.peers.setStatus(conn.publicKey, "blocked", Date.now())), true);
    res = await conn.http(1, "GET", "/me/status");
    assert.equal(res.status, 403);
    assert.equal(error(res), "PEER_BLOCKED");
    assert.equal(await server.store.transaction((tx) => tx.peers.remove(conn.publicKey)), true);
    res = await conn.http(1, "GET", "/me/status");
    assert.equal(res.status, 401);
    assert.equal(error(res), "INVALID_SESSION");

    // Logs carry the connection's address, not a socket's.
    const line = log
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as Record<string, unknown>)
      .find((l) => l.req_id === "over-stream.1");
    assert.equal(line?.client, "127.0.0.2");
  });

  test("per-address limits count a stream's login under its connection's address: apart from TCP's, or with it when the same", async () => {
    const s = await startTestServer({ config: { rate_limits: { login_per_key: 0, login_per_address: 2, device_token_per_device: 0 } } });
    try {
      const login = async (conn: PerchConnection) => {
        const assertion = await new PerchClient({ baseUrl: s.url, keyPair: conn.keyPair }).assertion();
        const res = await conn.http(1, "POST", "/login", { headers: { authorization: `Bearer ${assertion}`, "x-public-key": conn.publicKey } });
        return res.status;
      };
      const a = await deviceFrom(s, "127.0.0.2");
      assert.equal(await login(a), 200);
      assert.equal(await login(a), 200);
      assert.equal(await login(a), 429);
      const b = await deviceFrom(s, "127.0.0.3");
      assert.equal(await login(b), 200, "another connection address has its own count");
      const tcp = s.client();
      await tcp.login(); // 127.0.0.1 over TCP: not counted with the streams' addresses
      // A device whose connection comes from 127.0.0.1 is counted with TCP's logins from there: the limit is the address's.
      const c = await deviceFrom(s, "127.0.0.1");
      assert.equal(await login(c), 200);
      await assert.rejects(s.client().login(), (err: unknown) => err instanceof PerchApiError && err.status === 429);
      assert.equal(await login(c), 429);
    } finally {
      await s.stop();
    }
  });
});
