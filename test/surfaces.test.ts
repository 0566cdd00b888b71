/**
 * One root, several surfaces: each answers its own 404/405/413 and errors in its own envelope, the
 * root routes by base path, and the caller is resolved in one place (connection, then bearer).
 */
import assert from "node:assert/strict";
import { duplexPair } from "node:stream";
import { after, before, describe, test } from "node:test";
import type { Context } from "hono";
import { Hono } from "hono";
import pino from "pino";
import { DomainError } from "../src/domain/errors.ts";
import { bindConnection } from "../src/http/connection.ts";
import type { AppEnv } from "../src/http/env.ts";
import { bodyLimit } from "../src/http/middleware.ts";
import type { Surface } from "../src/http/surface.ts";
import type { PerchClient } from "../src/sdk/client.ts";
import { exchange, parseRawResponse } from "./support/raw-http.ts";
import { startTestServer, type TestServer } from "./support/server.ts";

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
    error: (c, err) => {
      if (err instanceof DomainError && err.kind === "rate_limited") {
        c.header("Retry-After", String(err.retryAfter));
        return fail(c, 429, err.message, "rate_limit_error", "rate_limit_exceeded");
      }
      return fail(c, 500, "internal error", "api_error", null);
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

describe("who is calling", () => {
  let server: TestServer;
  let log = "";
  before(async () => {
    const logger = pino(
      { level: "info" },
      {
        write: (line: string) => {
          log += line;
        },
      },
    );
    server = await startTestServer({ logger });
  });
  after(() => server.stop());

  /** One HTTP exchange over a stream bound to a connection of `peerKey`, the way the transport serves service streams. */
  async function overConnection(peerKey: string, request: string, remoteAddress = "198.51.100.7") {
    const [ours, theirs] = duplexPair();
    bindConnection(theirs, { peerKey, remoteAddress });
    server.httpServer.emit("connection", theirs);
    const { raw } = await exchange(ours, request);
    const res = parseRawResponse(raw);
    assert.ok(res, `no response in ${JSON.stringify(raw)}`);
    return { ...res, json: res.body ? (JSON.parse(res.body) as Record<string, any>) : undefined };
  }
  const get = (path: string, headers = "") => `GET ${path} HTTP/1.1\r\nHost: peer\r\nConnection: close\r\n${headers}\r\n`;

  test("a connection's peer is a primary principal on the Public API without a bearer", async () => {
    const device = server.client();
    await device.login();
    await device.putStatus({ volume: 21 });

    let res = await overConnection(device.publicKey, get("/me/status", "X-Request-ID: over-stream.1\r\n"));
    assert.equal(res.status, 200);
    assert.equal(res.headers["content-type"], JSON_UTF8);
    assert.equal(res.headers["x-request-id"], "over-stream.1");
    assert.equal(res.json?.volume, 21);

    const body = '{"volume":22}';
    res = await overConnection(
      device.publicKey,
      `PUT /me/status HTTP/1.1\r\nHost: peer\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
    );
    assert.equal(res.status, 200);
    assert.equal((await device.status()).volume, 22, "written as the connection's peer");

    // The connection decides, whatever bearer the request carries.
    const other = server.client();
    await other.login();
    res = await overConnection(device.publicKey, get("/me", `Authorization: Bearer ${other.accessToken}\r\n`));
    assert.equal(res.status, 200);
    assert.equal(res.json?.public_key, device.publicKey);

    // It is a primary principal: Side Control routes refuse it; a contradicting X-Public-Key is refused.
    res = await overConnection(device.publicKey, get("/side-control/status"));
    assert.equal(res.status, 403);
    assert.equal(res.json?.error.code, "SIDE_CONTROL_SESSION_REQUIRED");
    res = await overConnection(device.publicKey, get("/me", `X-Public-Key: ${other.publicKey}\r\n`));
    assert.equal(res.status, 401);
    assert.equal(res.json?.error.code, "PUBLIC_KEY_MISMATCH");

    // The peer is re-checked on every request.
    assert.equal(await server.domain.peers.setBlocked(device.publicKey, true), true);
    res = await overConnection(device.publicKey, get("/me/status"));
    assert.equal(res.status, 403);
    assert.equal(res.json?.error.code, "PEER_BLOCKED");
    res = await overConnection(server.client().publicKey, get("/me/status"));
    assert.equal(res.status, 401);
    assert.equal(res.json?.error.code, "INVALID_SESSION");

    // Logs carry the connection's address, not a socket's.
    const line = log
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as Record<string, unknown>)
      .find((l) => l.req_id === "over-stream.1");
    assert.equal(line?.client, "198.51.100.7");
  });

  test("per-address limits use the connection's address", async () => {
    const s = await startTestServer({ config: { rateLimits: { loginPerKey: 0, loginPerAddress: 2, deviceTokenPerDevice: 0 } } });
    try {
      const login = async (address: string) => {
        const c = s.client();
        const assertion = await c.assertion();
        const [ours, theirs] = duplexPair();
        bindConnection(theirs, { peerKey: c.publicKey, remoteAddress: address });
        s.httpServer.emit("connection", theirs);
        const { raw } = await exchange(
          ours,
          `POST /login HTTP/1.1\r\nHost: peer\r\nConnection: close\r\nAuthorization: Bearer ${assertion}\r\nX-Public-Key: ${c.publicKey}\r\nContent-Length: 0\r\n\r\n`,
        );
        return parseRawResponse(raw)?.status;
      };
      assert.equal(await login("203.0.113.1"), 200);
      assert.equal(await login("203.0.113.1"), 200);
      assert.equal(await login("203.0.113.1"), 429);
      assert.equal(await login("203.0.113.2"), 200, "another connection address has its own count");
      const tcp = s.client();
      await tcp.login(); // 127.0.0.1 over TCP: not counted with the streams' addresses
    } finally {
      await s.stop();
    }
  });
});
