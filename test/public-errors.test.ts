/**
 * Every error of the Public API contract, through the real server and real HTTP: exact status,
 * exact `{"error":{"code","message"}}` body, and that a refused request changed nothing.
 *
 * PEER_NOT_FOUND (`GET /me`, and `GET /side-control/info` for a vanished target) is not tested
 * over HTTP: it is only reachable in a race. Every bearer request is authenticated first, and
 * authentication already refuses a session whose peer row is gone (401 INVALID_SESSION); removing a
 * peer also deletes its sessions. So the 404 needs the peer to be removed between authentication
 * and the handler's read of the same row, which no sequence of requests can arrange
 * deterministically.
 */
import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import { base58 } from "@scure/base";
import { signAssertion } from "../src/crypto/assertion.ts";
import { decodeKey, privateKeyObject, sharedSecret } from "../src/crypto/keys.ts";
import { ManualClock } from "../src/domain/clock.ts";
import type { LoginResult } from "../src/protocol/public.ts";
import { PerchApiError, type PerchClient } from "../src/sdk/client.ts";
import { STORES, startTestNode, type TestNode, tempDir } from "./support/server.ts";

const DAY_MS = 24 * 60 * 60 * 1000;
const DEVICE_TOKEN_TTL_MS = 5 * 60 * 1000;
const KIB = 1024;

// ---------------------------------------------------------------------------------------------
// HTTP helpers

interface Res {
  status: number;
  headers: Headers;
  body: any;
}

interface CallOptions {
  /** `Authorization: Bearer <bearer>`. */
  bearer?: string;
  /** A raw `Authorization` header (wins over `bearer`). */
  authorization?: string;
  publicKey?: string;
  /** A JSON body, sent as `application/json`. */
  json?: unknown;
  /** A raw body (a string gets fetch's `text/plain`, bytes get no Content-Type). */
  body?: string | Uint8Array<ArrayBuffer>;
  /** Content-Type to send (wins over the one `json` implies). */
  contentType?: string;
  headers?: Record<string, string>;
  query?: Record<string, string | number>;
}

async function call(server: { url: string; fetch: typeof fetch }, method: string, path: string, o: CallOptions = {}): Promise<Res> {
  const url = new URL(server.url + path);
  for (const [k, v] of Object.entries(o.query ?? {})) url.searchParams.set(k, String(v));
  const headers: Record<string, string> = { ...o.headers };
  if (o.bearer !== undefined) headers.authorization = `Bearer ${o.bearer}`;
  if (o.authorization !== undefined) headers.authorization = o.authorization;
  if (o.publicKey !== undefined) headers["x-public-key"] = o.publicKey;
  let body: string | Uint8Array<ArrayBuffer> | undefined;
  if (o.json !== undefined) {
    body = JSON.stringify(o.json);
    headers["content-type"] = "application/json";
  }
  if (o.body !== undefined) body = o.body;
  if (o.contentType !== undefined) headers["content-type"] = o.contentType;
  const res = await server.fetch(url, { method, headers, ...(body !== undefined ? { body } : {}) });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = text ? JSON.parse(text) : undefined;
  } catch {
    // Kept as text: expectError then reports it.
  }
  return { status: res.status, headers: res.headers, body: parsed };
}

/** Asserts the contract's error: status, JSON `{"error":{"code","message"[,"details"]}}`, X-Request-ID. */
function expectError(res: Res, status: number, code: string, details?: Record<string, unknown>, what = ""): void {
  const ctx = `${what ? `${what}: ` : ""}got ${res.status} ${JSON.stringify(res.body)}`;
  assert.equal(res.status, status, ctx);
  assert.match(res.headers.get("content-type") ?? "", /^application\/json/, ctx);
  assert.ok(res.headers.get("x-request-id"), ctx);
  assert.equal(typeof res.body, "object", ctx);
  assert.deepEqual(Object.keys(res.body), ["error"], ctx);
  const error = res.body.error as Record<string, unknown>;
  assert.equal(error.code, code, ctx);
  assert.equal(typeof error.message, "string", ctx);
  assert.ok((error.message as string).length > 0, ctx);
  for (const key of Object.keys(error)) assert.ok(["code", "message", "details"].includes(key), `${ctx}: unexpected key ${key}`);
  if (error.details !== undefined) assert.equal(typeof error.details, "object", ctx);
  for (const [k, v] of Object.entries(details ?? {})) assert.deepEqual((error.details as Record<string, unknown> | undefined)?.[k], v, ctx);
}

/** The SDK's view of the same: the promise rejects with `PerchApiError` of `status` and `code`. */
async function rejectsWith(p: Promise<unknown>, status: number, code: string, what = ""): Promise<void> {
  await assert.rejects(p, (e: unknown) => {
    assert.ok(e instanceof PerchApiError, `${what}: ${String(e)}`);
    assert.equal(e.status, status, `${what}: ${e.message}`);
    assert.equal(e.code, code, `${what}: ${e.message}`);
    return true;
  });
}

/** `POST /login` for `client`: a fresh assertion unless one is given. Like the SDK, keeps the access token of a success. */
async function loginCall(server: TestNode, client: PerchClient, o: CallOptions & { assertion?: string } = {}): Promise<Res> {
  const { assertion, ...rest } = o;
  const res = await call(server, "POST", "/login", { bearer: assertion ?? (await client.assertion()), publicKey: client.publicKey, ...rest });
  if (res.status === 200) client.accessToken = res.body.access_token;
  return res;
}

function expectLogin(res: Res, grant: "primary" | "side_control", what = ""): LoginResult {
  assert.equal(res.status, 200, `${what}: got ${res.status} ${JSON.stringify(res.body)}`);
  assert.equal(res.body.grant_type, grant, what);
  assert.equal(res.body.token_type, "Bearer", what);
  return res.body as LoginResult;
}

/** A registered device with a primary session. */
async function newDevice(server: TestNode): Promise<PerchClient> {
  const device = server.client();
  await device.login();
  return device;
}

/** A controller (an unregistered key) with a Side Control session on `device`. */
async function newController(server: TestNode, device: PerchClient): Promise<{ controller: PerchClient; session: LoginResult }> {
  const token = await device.createDeviceToken();
  const controller = server.client();
  const session = await controller.login({ deviceToken: token.token });
  return { controller, session };
}

/** An assertion for `client` with claims (or header, or MAC key) changed from a valid one. */
function craftAssertion(
  server: TestNode,
  client: PerchClient,
  nowMs: number,
  o: { claims?: Record<string, unknown>; header?: Record<string, unknown>; secret?: Uint8Array } = {},
): string {
  const serverKey = server.domain.ctx.serverKey.publicKeyText;
  const secret = o.secret ?? sharedSecret(privateKeyObject(client.keyPair.privateKey), decodeKey(serverKey));
  const iat = Math.floor(nowMs / 1000);
  const claims = { iss: client.publicKey, aud: serverKey, iat, exp: iat + 60, nonce: `n-${Math.random().toString(36).slice(2)}`, ...o.claims };
  return signAssertion(JSON.stringify(o.header ?? { alg: "X25519-HS256", typ: "JWT" }), JSON.stringify(claims), secret);
}

/** `claims`'s header and claims with `macOf`'s MAC. */
function spliceMac(claims: string, macOf: string): string {
  const [h, c] = claims.split(".");
  return `${h}.${c}.${macOf.split(".")[2]}`;
}

async function isRegistered(server: TestNode, key: string): Promise<boolean> {
  return (await server.store.read((r) => r.peers.get(key))) !== undefined;
}

/** A ManualClock at 15 s past a minute: limits refill only when a test moves it. */
function manualClock(): ManualClock {
  return new ManualClock(Math.floor(Date.now() / 60_000) * 60_000 + 15_000);
}

const NO_LIMITS = { login_per_key: 0, login_per_address: 0, device_token_per_device: 0 };

// ---------------------------------------------------------------------------------------------

describe("POST /login errors", () => {
  const clock = manualClock();
  let server: TestNode;
  before(async () => {
    server = await startTestNode({ clock });
  });
  after(() => server.stop());

  test("empty body, {}, grant_type primary, and an empty body labelled JSON all give a primary session", async () => {
    const c = server.client();
    expectLogin(await loginCall(server, c), "primary", "no body");
    expectLogin(await loginCall(server, c, { body: new Uint8Array(0) }), "primary", "empty body, no Content-Type");
    expectLogin(await loginCall(server, c, { body: "", contentType: "application/json" }), "primary", "empty body, JSON");
    expectLogin(await loginCall(server, c, { json: {} }), "primary", "{}");
    expectLogin(await loginCall(server, c, { json: { grant_type: "primary" } }), "primary", "grant_type primary");
    expectLogin(await loginCall(server, c, { body: '{"grant_type":"primary"}', contentType: "application/json; charset=utf-8" }), "primary", "charset");
  });

  test("400 INVALID_REQUEST: not JSON, wrong shape, unknown grant_type, side_control without device_token — nothing written", async () => {
    const c = server.client();
    const assertion = await c.assertion();
    const cases: Array<[string, CallOptions]> = [
      ["malformed JSON", { body: '{"grant_type":', contentType: "application/json" }],
      ["not JSON at all", { body: "grant_type=primary", contentType: "application/json" }],
      ["unknown grant_type", { json: { grant_type: "password" } }],
      ["grant_type of the wrong type", { json: { grant_type: 1 } }],
      ["side_control without device_token", { json: { grant_type: "side_control" } }],
      ["side_control with an empty device_token", { json: { grant_type: "side_control", device_token: "" } }],
      ["side_control with a non-string device_token", { json: { grant_type: "side_control", device_token: 42 } }],
      ["device_token with the primary grant", { json: { grant_type: "primary", device_token: "x" } }],
      ["unknown field", { json: { grant_type: "primary", remember_me: true } }],
      ["an array", { json: [] }],
      ["a string", { json: "primary" }],
      ["null", { json: null }],
    ];
    for (const [what, o] of cases) expectError(await loginCall(server, c, { assertion, ...o }), 400, "INVALID_REQUEST", undefined, what);
    assert.equal(await isRegistered(server, c.publicKey), false, "a refused login registers nobody");
    // The assertion's nonce was never claimed: the same assertion still logs in, once.
    expectLogin(await loginCall(server, c, { assertion }), "primary");
    assert.equal(await isRegistered(server, c.publicKey), true);
    expectError(await loginCall(server, c, { assertion }), 401, "INVALID_ASSERTION", undefined, "replay");
  });

  test("401 MISSING_ASSERTION: no Authorization, another scheme, a bearer without a token", async () => {
    const c = server.client();
    expectError(await call(server, "POST", "/login", { publicKey: c.publicKey }), 401, "MISSING_ASSERTION", undefined, "no Authorization");
    expectError(await call(server, "POST", "/login", { publicKey: c.publicKey, json: {} }), 401, "MISSING_ASSERTION", undefined, "no Authorization, {}");
    expectError(
      await call(server, "POST", "/login", { publicKey: c.publicKey, authorization: "Basic dXNlcjpwYXNz" }),
      401,
      "MISSING_ASSERTION",
      undefined,
      "Basic",
    );
    expectError(await call(server, "POST", "/login", { publicKey: c.publicKey, authorization: "Bearer" }), 401, "MISSING_ASSERTION", undefined, "Bearer alone");
    expectError(await call(server, "POST", "/login", { publicKey: c.publicKey, authorization: "" }), 401, "MISSING_ASSERTION", undefined, "empty header");
    assert.equal(await isRegistered(server, c.publicKey), false);
    // The auth scheme is case-insensitive (RFC 9110), as the server's own parsing is.
    expectLogin(
      await call(server, "POST", "/login", { publicKey: c.publicKey, authorization: `bearer ${await c.assertion()}` }),
      "primary",
      "lower-case scheme",
    );
  });

  test("401 INVALID_PUBLIC_KEY: missing, not base58, wrong length, all-zero and other low-order keys", async () => {
    const c = server.client();
    const assertion = await c.assertion();
    const lowOrder = new Uint8Array(32);
    lowOrder[0] = 1; // u = 1: a point of small order, its shared secret with anything is all zeros
    const cases: Array<[string, string | undefined]> = [
      ["missing", undefined],
      ["empty", ""],
      ["not base58 (0, O, I, l)", "0OIl0OIl0OIl0OIl0OIl0OIl0OIl0OIl0OIl0OIl0OI"],
      ["not base58 (punctuation)", `${c.publicKey.slice(0, -1)}!`],
      ["31 bytes", base58.encode(c.keyPair.publicKey.slice(0, 31))],
      ["33 bytes", base58.encode(new Uint8Array([...c.keyPair.publicKey, 7]))],
      ["all-zero key", "11111111111111111111111111111111"],
      ["low-order key u=1", base58.encode(lowOrder)],
    ];
    for (const [what, key] of cases) {
      const res = await call(server, "POST", "/login", { bearer: assertion, ...(key !== undefined ? { publicKey: key } : {}) });
      expectError(res, 401, "INVALID_PUBLIC_KEY", undefined, what);
    }
    assert.equal(base58.encode(new Uint8Array(32)), "11111111111111111111111111111111");
    expectLogin(await loginCall(server, c, { assertion }), "primary", "the assertion was not used up");
  });

  test("401 INVALID_ASSERTION: bad MAC, wrong aud, expired, future, too long, iss mismatch, malformed, replay — nothing written", async () => {
    const c = server.client();
    const other = server.client();
    const now = clock.now();
    const s = Math.floor(now / 1000);
    const cases: Array<[string, string, string?]> = [
      ["bad MAC (another key's secret)", craftAssertion(server, c, now, { secret: new Uint8Array(32).fill(9) })],
      ["MAC of another claim set", spliceMac(craftAssertion(server, c, now), craftAssertion(server, c, now))],
      ["wrong aud", craftAssertion(server, c, now, { claims: { aud: other.publicKey } })],
      ["expired", craftAssertion(server, c, now, { claims: { iat: s - 120, exp: s - 60 } })],
      ["exp == now", craftAssertion(server, c, now, { claims: { iat: s - 60, exp: s } })],
      ["issued more than 60 s ahead", craftAssertion(server, c, now, { claims: { iat: s + 61, exp: s + 120 } })],
      ["lifetime over 300 s", craftAssertion(server, c, now, { claims: { iat: s, exp: s + 301 } })],
      ["iss is another key", craftAssertion(server, c, now, { claims: { iss: other.publicKey } })],
      ["X-Public-Key is another key", await c.assertion(), other.publicKey],
      ["wrong alg", craftAssertion(server, c, now, { header: { alg: "HS256", typ: "JWT" } })],
      ["empty nonce", craftAssertion(server, c, now, { claims: { nonce: "" } })],
      ["iat not an integer", craftAssertion(server, c, now, { claims: { iat: s + 0.5 } })],
      ["two parts", (await c.assertion()).split(".").slice(0, 2).join(".")],
      ["not base64url", "a!.b!.c!"],
      ["not a token", "hello"],
    ];
    for (const [what, assertion, key] of cases) {
      expectError(await call(server, "POST", "/login", { bearer: assertion, publicKey: key ?? c.publicKey }), 401, "INVALID_ASSERTION", undefined, what);
    }
    assert.equal(await isRegistered(server, c.publicKey), false);
    assert.equal(await isRegistered(server, other.publicKey), false);

    // Replay of an accepted assertion, for the primary and the Side Control grant.
    const accepted = await c.assertion();
    expectLogin(await loginCall(server, c, { assertion: accepted }), "primary");
    expectError(await loginCall(server, c, { assertion: accepted }), 401, "INVALID_ASSERTION", undefined, "replay");
    const token = await c.createDeviceToken();
    const scAssertion = await other.assertion();
    expectLogin(await loginCall(server, other, { assertion: scAssertion, json: { grant_type: "side_control", device_token: token.token } }), "side_control");
    const token2 = await c.createDeviceToken();
    const replay = await loginCall(server, other, { assertion: scAssertion, json: { grant_type: "side_control", device_token: token2.token } });
    expectError(replay, 401, "INVALID_ASSERTION", undefined, "side control replay");
    // The replay did not consume the second token.
    expectLogin(await loginCall(server, other, { json: { grant_type: "side_control", device_token: token2.token } }), "side_control");
  });

  test("401 INVALID_DEVICE_TOKEN: unknown, consumed, revoked, expired, target removed — and the assertion stays usable", async () => {
    const device = await newDevice(server);
    const controller = server.client();
    const sc = (deviceToken: string, assertion?: string) =>
      loginCall(server, controller, { json: { grant_type: "side_control", device_token: deviceToken }, ...(assertion ? { assertion } : {}) });

    // Unknown. The checks before the store transaction write nothing, so the nonce is still free.
    const assertion = await controller.assertion({ lifetimeSeconds: 300 });
    expectError(await sc("no-such-token", assertion), 401, "INVALID_DEVICE_TOKEN", undefined, "unknown");
    const good = await device.createDeviceToken();
    expectLogin(await sc(good.token, assertion), "side_control", "same assertion, valid token");
    assert.equal(await isRegistered(server, controller.publicKey), false, "a Side Control login does not register the controller");

    // Consumed.
    expectError(await sc(good.token), 401, "INVALID_DEVICE_TOKEN", undefined, "consumed");

    // Revoked by its device.
    const revoked = await device.createDeviceToken();
    await device.revokeDeviceToken(revoked.id);
    expectError(await sc(revoked.token), 401, "INVALID_DEVICE_TOKEN", undefined, "revoked");

    // Expired: valid until 5 minutes after issue, not at 5 minutes.
    const almost = await device.createDeviceToken();
    const expiring = await device.createDeviceToken();
    assert.equal(expiring.expires_at, clock.now() + DEVICE_TOKEN_TTL_MS);
    clock.advance(DEVICE_TOKEN_TTL_MS - 1);
    expectLogin(await sc(almost.token), "side_control", "1 ms before expiry");
    clock.advance(1);
    expectError(await sc(expiring.token), 401, "INVALID_DEVICE_TOKEN", undefined, "expired");

    // The device behind the token was removed by the operator.
    const doomed = await newDevice(server);
    const orphan = await doomed.createDeviceToken();
    assert.equal(await server.domain.peers.remove(doomed.publicKey), true);
    expectError(await sc(orphan.token), 401, "INVALID_DEVICE_TOKEN", undefined, "target removed");

    // A device token is not a session bearer and vice versa.
    const fresh = await device.createDeviceToken();
    expectError(await call(server, "GET", "/side-control/status", { bearer: fresh.token }), 401, "INVALID_SESSION", undefined, "device token as bearer");
    expectError(await sc(device.accessToken!), 401, "INVALID_DEVICE_TOKEN", undefined, "access token as device token");
    expectLogin(await sc(fresh.token), "side_control", "the token survived being shown as a bearer");
  });

  test("403 PEER_BLOCKED: blocked caller, blocked token target, blocked Side Control target or controller", async () => {
    // The caller is blocked: its login and its existing session are refused until unblocked.
    const device = await newDevice(server);
    const deviceBearer = device.accessToken!;
    await server.domain.peers.setBlocked(device.publicKey, true);
    const assertion = await device.assertion({ lifetimeSeconds: 300 });
    expectError(await loginCall(server, device, { assertion }), 403, "PEER_BLOCKED", undefined, "blocked caller login");
    expectError(await call(server, "GET", "/me", { bearer: deviceBearer }), 403, "PEER_BLOCKED", undefined, "blocked caller session");
    await server.domain.peers.setBlocked(device.publicKey, false);
    expectLogin(await loginCall(server, device, { assertion }), "primary", "same assertion after unblock");
    assert.equal((await call(server, "GET", "/me", { bearer: deviceBearer })).status, 200);

    // The device token's target is blocked: refused, and the token is not consumed.
    const token = await device.createDeviceToken();
    const controller = server.client();
    const scAssertion = await controller.assertion({ lifetimeSeconds: 300 });
    await server.domain.peers.setBlocked(device.publicKey, true);
    const body = { grant_type: "side_control", device_token: token.token };
    expectError(await loginCall(server, controller, { assertion: scAssertion, json: body }), 403, "PEER_BLOCKED", undefined, "blocked target");
    await server.domain.peers.setBlocked(device.publicKey, false);
    const session = expectLogin(await loginCall(server, controller, { assertion: scAssertion, json: body }), "side_control", "token still usable");

    // A live Side Control session whose target gets blocked.
    assert.equal((await call(server, "GET", "/side-control/status", { bearer: session.access_token })).status, 200);
    await server.domain.peers.setBlocked(device.publicKey, true);
    for (const path of ["/side-control/status", "/side-control/info", "/side-control/contacts"]) {
      expectError(await call(server, "GET", path, { bearer: session.access_token }), 403, "PEER_BLOCKED", undefined, `blocked target: ${path}`);
    }
    await server.domain.peers.setBlocked(device.publicKey, false);
    assert.equal((await call(server, "GET", "/side-control/status", { bearer: session.access_token })).status, 200);

    // A controller that is itself a registered, blocked peer: its Side Control login and session are refused.
    const other = await newDevice(server);
    const { controller: peerController, session: peerSession } = await newController(server, device);
    await peerController.login(); // registers the controller key as a peer of its own
    await server.domain.peers.setBlocked(peerController.publicKey, true);
    expectError(await call(server, "GET", "/side-control/status", { bearer: peerSession.access_token }), 403, "PEER_BLOCKED", undefined, "blocked controller");
    const otherToken = await other.createDeviceToken();
    const blockedLogin = await loginCall(server, peerController, { json: { grant_type: "side_control", device_token: otherToken.token } });
    expectError(blockedLogin, 403, "PEER_BLOCKED", undefined, "blocked controller login");
    await server.domain.peers.setBlocked(peerController.publicKey, false);
    expectLogin(await loginCall(server, peerController, { json: { grant_type: "side_control", device_token: otherToken.token } }), "side_control");
  });
});

describe("registration policies", () => {
  let tokenServer: TestNode;
  let closedServer: TestNode;
  before(async () => {
    tokenServer = await startTestNode({ config: { registration: { policy: "token", tokens: ["open-sesame", "second-token"] } } });
    closedServer = await startTestNode({ config: { registration: { policy: "closed" } } });
  });
  after(async () => {
    await tokenServer.stop();
    await closedServer.stop();
  });

  test("401 REGISTRATION_REQUIRED without or with a wrong X-Registration-Token; nothing registered, assertion reusable", async () => {
    const server = tokenServer;
    const c = server.client();
    const assertion = await c.assertion();
    expectError(await loginCall(server, c, { assertion }), 401, "REGISTRATION_REQUIRED", undefined, "no token");
    for (const wrong of ["open-sesam", "open-sesame2", "OPEN-SESAME", "x"]) {
      const res = await loginCall(server, c, { assertion, headers: { "x-registration-token": wrong } });
      expectError(res, 401, "REGISTRATION_REQUIRED", undefined, `wrong token ${wrong}`);
    }
    assert.equal(await isRegistered(server, c.publicKey), false);
    expectLogin(await loginCall(server, c, { assertion, headers: { "x-registration-token": "second-token" } }), "primary");
    assert.equal(await isRegistered(server, c.publicKey), true);
    // Once registered, no token is needed; a Side Control controller never needs one.
    expectLogin(await loginCall(server, c), "primary", "registered peer without token");
    const token = await c.createDeviceToken();
    const controller = server.client();
    expectLogin(await loginCall(server, controller, { json: { grant_type: "side_control", device_token: token.token } }), "side_control");
    assert.equal(await isRegistered(server, controller.publicKey), false);
  });

  test("403 PEER_NOT_REGISTERED for an unknown key under policy closed; nothing registered, assertion reusable", async () => {
    const server = closedServer;
    const c = server.client();
    const assertion = await c.assertion();
    expectError(await loginCall(server, c, { assertion }), 403, "PEER_NOT_REGISTERED");
    expectError(await loginCall(server, c, { headers: { "x-registration-token": "anything" } }), 403, "PEER_NOT_REGISTERED", undefined, "tokens do not help");
    assert.equal(await isRegistered(server, c.publicKey), false);
    assert.equal(await server.domain.peers.add(c.publicKey), true);
    expectLogin(await loginCall(server, c, { assertion }), "primary", "same assertion once the operator added the key");
    // Controllers need no registration, even here, and are not registered by their login.
    const token = await c.createDeviceToken();
    const controller = server.client();
    expectLogin(await loginCall(server, controller, { json: { grant_type: "side_control", device_token: token.token } }), "side_control");
    assert.equal(await isRegistered(server, controller.publicKey), false);
  });
});

describe("sessions, device tokens and Side Control sessions", () => {
  const clock = manualClock();
  let server: TestNode;
  before(async () => {
    server = await startTestNode({ clock });
  });
  after(() => server.stop());

  test("401 INVALID_SESSION: missing, unknown, malformed, expired, revoked, peer removed", async () => {
    const device = await newDevice(server);
    expectError(await call(server, "GET", "/me"), 401, "INVALID_SESSION", undefined, "missing");
    expectError(await call(server, "GET", "/me", { bearer: "bm8tc3VjaC1zZXNzaW9u" }), 401, "INVALID_SESSION", undefined, "unknown");
    expectError(await call(server, "GET", "/me", { authorization: `Basic ${device.accessToken}` }), 401, "INVALID_SESSION", undefined, "not a bearer");
    expectError(await call(server, "GET", "/me", { authorization: `Bearer ${device.accessToken} extra` }), 401, "INVALID_SESSION", undefined, "two words");
    expectError(await call(server, "GET", "/me", { bearer: `${device.accessToken}x` }), 401, "INVALID_SESSION", undefined, "altered token");
    expectError(await call(server, "GET", "/me", { bearer: await device.assertion() }), 401, "INVALID_SESSION", undefined, "an assertion");

    // Expired: valid until 24 h after login, not at 24 h.
    const login = await device.login();
    assert.equal(login.expires_at, clock.now() + DAY_MS);
    const { session: sc } = await newController(server, device);
    assert.equal(sc.expires_at, clock.now() + DAY_MS);
    clock.advance(DAY_MS - 1);
    assert.equal((await call(server, "GET", "/me", { bearer: login.access_token })).status, 200);
    assert.equal((await call(server, "GET", "/side-control/status", { bearer: sc.access_token })).status, 200);
    clock.advance(1);
    expectError(await call(server, "GET", "/me", { bearer: login.access_token }), 401, "INVALID_SESSION", undefined, "expired primary");
    expectError(await call(server, "GET", "/side-control/status", { bearer: sc.access_token }), 401, "INVALID_SESSION", undefined, "expired side control");

    // Revoked: a primary session by the operator, a Side Control session by its device.
    await device.login();
    const primary = await server.client().login();
    assert.equal(await server.domain.auth.revokeSession(primary.session_id), true);
    expectError(await call(server, "GET", "/me", { bearer: primary.access_token }), 401, "INVALID_SESSION", undefined, "revoked primary");
    const { controller, session } = await newController(server, device);
    await device.revokeSideControlSession(session.session_id);
    await rejectsWith(controller.sideControl.status(), 401, "INVALID_SESSION", "revoked side control");

    // The peer behind the session is removed: its own session and sessions aimed at it stop working.
    const { session: live } = await newController(server, device);
    const bearer = device.accessToken!;
    assert.equal(await server.domain.peers.remove(device.publicKey), true);
    expectError(await call(server, "GET", "/me", { bearer }), 401, "INVALID_SESSION", undefined, "removed peer");
    expectError(await call(server, "GET", "/side-control/info", { bearer: live.access_token }), 401, "INVALID_SESSION", undefined, "removed target");
  });

  test("401 PUBLIC_KEY_MISMATCH when X-Public-Key is not the session's key", async () => {
    const device = await newDevice(server);
    const { controller, session } = await newController(server, device);
    const stranger = server.client();
    const me = (publicKey: string) => call(server, "GET", "/me", { bearer: device.accessToken!, publicKey });
    expectError(await me(stranger.publicKey), 401, "PUBLIC_KEY_MISMATCH", undefined, "another key");
    expectError(await me("not-a-key"), 401, "PUBLIC_KEY_MISMATCH", undefined, "not a key");
    assert.equal((await me(device.publicKey)).status, 200);
    const sc = (publicKey: string) => call(server, "GET", "/side-control/status", { bearer: session.access_token, publicKey });
    expectError(await sc(device.publicKey), 401, "PUBLIC_KEY_MISMATCH", undefined, "the target's key on a Side Control session");
    assert.equal((await sc(controller.publicKey)).status, 200);
  });

  test("409 TOO_MANY_DEVICE_TOKENS for the 21st unconsumed token; consumed, revoked and expired ones do not count", async () => {
    const device = await newDevice(server);
    const usable = () => server.store.read((r) => r.deviceTokens.countUsable(device.publicKey, clock.now()));
    const tokens: Array<{ id: string; token: string }> = [];
    for (let i = 0; i < 20; i++) tokens.push(await device.createDeviceToken());
    expectError(await call(server, "POST", "/me/side-control/device-tokens", { bearer: device.accessToken! }), 409, "TOO_MANY_DEVICE_TOKENS");
    assert.equal(await usable(), 20, "the refused request stored nothing");
    // Another device has its own quota.
    await (await newDevice(server)).createDeviceToken();
    // A revoked token frees a place.
    await device.revokeDeviceToken(tokens[0]!.id);
    tokens.push(await device.createDeviceToken());
    await rejectsWith(device.createDeviceToken(), 409, "TOO_MANY_DEVICE_TOKENS", "full again");
    // A consumed token frees a place.
    await server.client().login({ deviceToken: tokens[1]!.token });
    tokens.push(await device.createDeviceToken());
    await rejectsWith(device.createDeviceToken(), 409, "TOO_MANY_DEVICE_TOKENS", "full again");
    assert.equal(await usable(), 20);
    // Expired tokens free every place.
    clock.advance(DEVICE_TOKEN_TTL_MS);
    for (let i = 0; i < 20; i++) await device.createDeviceToken();
    await rejectsWith(device.createDeviceToken(), 409, "TOO_MANY_DEVICE_TOKENS", "after expiry");
  });

  test("404 DEVICE_TOKEN_NOT_FOUND: unknown, another device's, consumed, expired, already revoked", async () => {
    const device = await newDevice(server);
    const other = await newDevice(server);
    const del = (d: PerchClient, id: string) => call(server, "DELETE", `/me/side-control/device-tokens/${encodeURIComponent(id)}`, { bearer: d.accessToken! });

    expectError(await del(device, "no-such-id"), 404, "DEVICE_TOKEN_NOT_FOUND", undefined, "unknown");

    const theirs = await other.createDeviceToken();
    expectError(await del(device, theirs.id), 404, "DEVICE_TOKEN_NOT_FOUND", undefined, "another device's");
    expectLogin(await loginCall(server, server.client(), { json: { grant_type: "side_control", device_token: theirs.token } }), "side_control", "still usable");

    const consumed = await device.createDeviceToken();
    await server.client().login({ deviceToken: consumed.token });
    expectError(await del(device, consumed.id), 404, "DEVICE_TOKEN_NOT_FOUND", undefined, "consumed");

    const revoked = await device.createDeviceToken();
    assert.equal((await del(device, revoked.id)).status, 204);
    expectError(await del(device, revoked.id), 404, "DEVICE_TOKEN_NOT_FOUND", undefined, "already revoked");

    const expiring = await device.createDeviceToken();
    clock.advance(DEVICE_TOKEN_TTL_MS);
    expectError(await del(device, expiring.id), 404, "DEVICE_TOKEN_NOT_FOUND", undefined, "expired");
  });

  test("404 SIDE_CONTROL_SESSION_NOT_FOUND: unknown, another device's, already revoked, a primary session, expired", async () => {
    const device = await newDevice(server);
    const other = await newDevice(server);
    const del = (d: PerchClient, id: string) => call(server, "DELETE", `/me/side-control/sessions/${encodeURIComponent(id)}`, { bearer: d.accessToken! });

    expectError(await del(device, "no-such-session"), 404, "SIDE_CONTROL_SESSION_NOT_FOUND", undefined, "unknown");

    const { controller: theirController, session: theirs } = await newController(server, other);
    expectError(await del(device, theirs.session_id), 404, "SIDE_CONTROL_SESSION_NOT_FOUND", undefined, "another device's");
    assert.deepEqual(await theirController.sideControl.status(), {}, "the other device's session still works");

    const { session: mine } = await newController(server, device);
    assert.equal((await del(device, mine.session_id)).status, 204);
    expectError(await del(device, mine.session_id), 404, "SIDE_CONTROL_SESSION_NOT_FOUND", undefined, "already revoked");

    const primary = await other.login();
    expectError(await del(device, primary.session_id), 404, "SIDE_CONTROL_SESSION_NOT_FOUND", undefined, "another device's primary session");
    const own = await device.login();
    expectError(await del(device, own.session_id), 404, "SIDE_CONTROL_SESSION_NOT_FOUND", undefined, "own primary session");
    assert.equal((await call(server, "GET", "/me", { bearer: own.access_token })).status, 200);

    const { session: old } = await newController(server, device);
    clock.advance(DAY_MS);
    const fresh = await device.login();
    expectError(
      await call(server, "DELETE", `/me/side-control/sessions/${old.session_id}`, { bearer: fresh.access_token }),
      404,
      "SIDE_CONTROL_SESSION_NOT_FOUND",
      undefined,
      "expired",
    );
  });
});

// ---------------------------------------------------------------------------------------------
// Every bearer route of the contract, with every wrong principal.

interface BearerRoute {
  method: string;
  /** The path as the contract (and /openapi.json) writes it. */
  template: string;
  /** A concrete path (with query) to call. */
  path: string;
  json?: unknown;
  /** Status with the right principal (routes whose ids are made up answer 404). */
  ok: number;
  /** An event stream: with the right principal only its status and media type are read. */
  stream?: true;
}

const ME_ROUTES: BearerRoute[] = [
  { method: "GET", template: "/me", path: "/me", ok: 200 },
  { method: "GET", template: "/me/status", path: "/me/status", ok: 200 },
  { method: "PUT", template: "/me/status", path: "/me/status", json: { volume: 10 }, ok: 200 },
  { method: "GET", template: "/me/runtime", path: "/me/runtime", ok: 200 },
  { method: "GET", template: "/me/usage", path: "/me/usage", ok: 200 },
  { method: "POST", template: "/me/side-control/device-tokens", path: "/me/side-control/device-tokens", ok: 201 },
  { method: "DELETE", template: "/me/side-control/device-tokens/{tokenId}", path: "/me/side-control/device-tokens/no-such-token", ok: 404 },
  { method: "GET", template: "/me/side-control/sessions", path: "/me/side-control/sessions", ok: 200 },
  { method: "DELETE", template: "/me/side-control/sessions/{sessionId}", path: "/me/side-control/sessions/no-such-session", ok: 404 },
  // Over TCP the caller has no WebRTC connection on this node.
  { method: "POST", template: "/me/audio/tone", path: "/me/audio/tone", ok: 409 },
];

const SIDE_CONTROL_ROUTES: BearerRoute[] = [
  { method: "GET", template: "/side-control/info", path: "/side-control/info", ok: 200 },
  { method: "GET", template: "/side-control/runtime", path: "/side-control/runtime", ok: 200 },
  { method: "GET", template: "/side-control/status", path: "/side-control/status", ok: 200 },
  { method: "GET", template: "/side-control/telemetry/latest", path: "/side-control/telemetry/latest", ok: 200 },
  { method: "GET", template: "/side-control/telemetry", path: "/side-control/telemetry?field=battery.percent", ok: 200 },
  {
    method: "GET",
    template: "/side-control/telemetry/aggregate",
    path: "/side-control/telemetry/aggregate?field=battery.percent&bucket_ms=3600000&aggregate=avg",
    ok: 200,
  },
  { method: "GET", template: "/side-control/events", path: "/side-control/events", ok: 200, stream: true },
  { method: "GET", template: "/side-control/usage", path: "/side-control/usage", ok: 200 },
  { method: "GET", template: "/side-control/contacts", path: "/side-control/contacts", ok: 200 },
  { method: "POST", template: "/side-control/contacts", path: "/side-control/contacts", json: { name: "table", display_name: "Table" }, ok: 201 },
  { method: "GET", template: "/side-control/contacts/{name}", path: "/side-control/contacts/nobody", ok: 404 },
  { method: "PUT", template: "/side-control/contacts/{name}", path: "/side-control/contacts/nobody", json: { display_name: "N" }, ok: 404 },
  { method: "DELETE", template: "/side-control/contacts/{name}", path: "/side-control/contacts/nobody", ok: 404 },
  { method: "GET", template: "/side-control/conversations", path: "/side-control/conversations", ok: 200 },
  { method: "GET", template: "/side-control/conversations/{id}", path: "/side-control/conversations/none", ok: 404 },
  { method: "DELETE", template: "/side-control/conversations/{id}", path: "/side-control/conversations/none", ok: 404 },
  {
    method: "GET",
    template: "/side-control/conversations/{id}/turns/{turn}/audio",
    path: "/side-control/conversations/none/turns/1/audio?side=user",
    ok: 404,
  },
  { method: "DELETE", template: "/side-control/conversations", path: "/side-control/conversations", ok: 204 },
  // No agent remembers on this server: the memory reads as off, an edit is refused, forgetting works.
  { method: "GET", template: "/side-control/memory", path: "/side-control/memory", ok: 200 },
  { method: "PUT", template: "/side-control/memory", path: "/side-control/memory", json: { text: "x" }, ok: 409 },
  { method: "DELETE", template: "/side-control/memory", path: "/side-control/memory", ok: 204 },
  // Last: its success ends the Side Control session the routes above use.
  { method: "DELETE", template: "/side-control/session", path: "/side-control/session", ok: 204 },
];

describe("bearer routes: every wrong principal on every route", () => {
  const clock = manualClock();
  let server: TestNode;
  before(async () => {
    server = await startTestNode({ clock });
  });
  after(() => server.stop());

  test("the table holds exactly the bearer routes /openapi.json documents", async () => {
    const doc = (await call(server, "GET", "/openapi.json")).body as { paths: Record<string, Record<string, { security?: unknown[] }>> };
    const documented: string[] = [];
    for (const [path, ops] of Object.entries(doc.paths)) {
      for (const [method, op] of Object.entries(ops)) if (op.security?.length) documented.push(`${method.toUpperCase()} ${path}`);
    }
    const table = [...ME_ROUTES, ...SIDE_CONTROL_ROUTES].map((r) => `${r.method} ${r.template}`);
    assert.deepEqual([...table].sort(), [...documented].sort());
    assert.equal(new Set(table).size, 32);
  });

  test("anonymous, unknown, wrong kind, revoked, mismatched key, then expired: refused everywhere, nothing written", async () => {
    const device = await newDevice(server);
    const primary = device.accessToken!;
    const { controller, session } = await newController(server, device);
    const sideControl = session.access_token;
    // Revoked sessions of both kinds.
    const revokedPrimary = await server.client().login();
    await server.domain.auth.revokeSession(revokedPrimary.session_id);
    const { session: revokedSc } = await newController(server, device);
    await device.revokeSideControlSession(revokedSc.session_id);
    const sessionsBefore = await device.sideControlSessions();
    const stranger = server.client().publicKey;

    const send = (r: BearerRoute, o: CallOptions) => call(server, r.method, r.path, { ...(r.json !== undefined ? { json: r.json } : {}), ...o });
    const all = [...ME_ROUTES, ...SIDE_CONTROL_ROUTES];
    for (const r of all) {
      const what = `${r.method} ${r.path}`;
      expectError(await send(r, {}), 401, "INVALID_SESSION", undefined, `${what} anonymous`);
      expectError(await send(r, { bearer: "c29tZXRoaW5nLWVsc2U" }), 401, "INVALID_SESSION", undefined, `${what} unknown bearer`);
      expectError(await send(r, { authorization: `Token ${primary}` }), 401, "INVALID_SESSION", undefined, `${what} other scheme`);
      expectError(await send(r, { bearer: revokedPrimary.access_token }), 401, "INVALID_SESSION", undefined, `${what} revoked primary`);
      expectError(await send(r, { bearer: revokedSc.access_token }), 401, "INVALID_SESSION", undefined, `${what} revoked side control`);
      const own = r.template.startsWith("/me") ? primary : sideControl;
      expectError(await send(r, { bearer: own, publicKey: stranger }), 401, "PUBLIC_KEY_MISMATCH", undefined, `${what} mismatched key`);
    }
    for (const r of ME_ROUTES) {
      expectError(await send(r, { bearer: sideControl }), 403, "PRIMARY_SESSION_REQUIRED", undefined, `${r.method} ${r.path} side control bearer`);
    }
    for (const r of SIDE_CONTROL_ROUTES) {
      expectError(await send(r, { bearer: primary }), 403, "SIDE_CONTROL_SESSION_REQUIRED", undefined, `${r.method} ${r.path} primary bearer`);
    }

    // Nothing was written by any of those.
    assert.deepEqual(await device.status(), {});
    assert.equal(await server.store.read((r) => r.deviceTokens.countUsable(device.publicKey, clock.now())), 0);
    assert.deepEqual(await device.sideControlSessions(), sessionsBefore);
    assert.deepEqual((await controller.sideControl.contacts.list()).items, []);

    // The right principal gets through on every route (so the refusals above were about the principal).
    for (const r of all) {
      const bearer = r.template.startsWith("/me") ? primary : sideControl;
      if (r.stream) {
        const res = await server.fetch(server.url + r.path, { headers: { authorization: `Bearer ${bearer}` } });
        assert.equal(res.status, r.ok, `${r.method} ${r.path}`);
        assert.match(res.headers.get("content-type") ?? "", /^text\/event-stream/);
        await res.body?.cancel();
        continue;
      }
      const res = await send(r, { bearer });
      assert.equal(res.status, r.ok, `${r.method} ${r.path}: ${JSON.stringify(res.body)}`);
    }

    // A day later both sessions have expired: 401 everywhere, for either bearer.
    clock.advance(DAY_MS);
    for (const r of all) {
      for (const bearer of [primary, sideControl]) expectError(await send(r, { bearer }), 401, "INVALID_SESSION", undefined, `${r.method} ${r.path} expired`);
    }
  });
});

// ---------------------------------------------------------------------------------------------

describe("validation of bodies and queries", () => {
  let server: TestNode;
  let device: PerchClient;
  let controller: PerchClient;
  before(async () => {
    server = await startTestNode();
    device = await newDevice(server);
    ({ controller } = await newController(server, device));
  });
  after(() => server.stop());

  test("400 INVALID_STATUS with details.field; the stored status is unchanged after each refusal", async () => {
    const put = (body: unknown) => call(server, "PUT", "/me/status", { bearer: device.accessToken!, json: body });
    // Nothing stored yet: a refused first PUT leaves GET at {}.
    expectError(await put({ volume: 101 }), 400, "INVALID_STATUS", { field: "volume" });
    assert.deepEqual(await device.status(), {});

    const stored = await device.putStatus({ volume: 40, muted: false, labels: { room: "kitchen" }, reported_at: "2024-05-01T10:00:00Z" });
    const labels65 = Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`k${i}`, "v"]));
    const cases: Array<[unknown, string]> = [
      [{ volume: 50, colour: "red" }, "colour"],
      [{ volume: 101 }, "volume"],
      [{ volume: -1 }, "volume"],
      [{ volume: 1.5 }, "volume"],
      [{ volume: "50" }, "volume"],
      [{ volume: null }, "volume"],
      [{ muted: "yes" }, "muted"],
      [{ muted: 0 }, "muted"],
      [{ battery_percent: -1 }, "battery_percent"],
      [{ battery_percent: 100.5 }, "battery_percent"],
      [{ battery_percent: 101 }, "battery_percent"],
      [{ charging: "true" }, "charging"],
      [{ gnss_latitude: 91 }, "gnss_latitude"],
      [{ gnss_latitude: -90.0001 }, "gnss_latitude"],
      [{ gnss_longitude: -181 }, "gnss_longitude"],
      [{ gnss_longitude: 180.5 }, "gnss_longitude"],
      [{ gnss_altitude_m: "high" }, "gnss_altitude_m"],
      [{ gnss_accuracy_m: -1 }, "gnss_accuracy_m"],
      [{ labels: labels65 }, "labels"],
      [{ labels: { room: 1 } }, "labels.room"],
      [{ labels: ["kitchen"] }, "labels"],
      [{ labels: "kitchen" }, "labels"],
      [{ details: { blob: "x".repeat(16 * KIB) } }, "details"],
      [{ details: "notes" }, "details"],
      [{ details: [1, 2] }, "details"],
      [{ reported_at: "yesterday" }, "reported_at"],
      [{ reported_at: "2024-05-01" }, "reported_at"],
      [{ reported_at: "2024-05-01T10:00:00" }, "reported_at"],
      [{ reported_at: "2024-13-01T10:00:00Z" }, "reported_at"],
      [{ reported_at: 1714557600000 }, "reported_at"],
    ];
    for (const [body, field] of cases) {
      expectError(await put(body), 400, "INVALID_STATUS", { field }, JSON.stringify(body).slice(0, 80));
      assert.deepEqual(await device.status(), stored, `unchanged after ${JSON.stringify(body).slice(0, 80)}`);
    }
    // Bodies that are JSON but not an object.
    for (const body of [[], "volume", 42, null]) {
      expectError(await put(body), 400, "INVALID_STATUS", undefined, JSON.stringify(body));
      assert.deepEqual(await device.status(), stored);
    }
    // The limits themselves are accepted.
    const edge = {
      volume: 100,
      battery_percent: 0,
      gnss_latitude: -90,
      gnss_longitude: 180,
      gnss_accuracy_m: 0,
      labels: Object.fromEntries(Array.from({ length: 64 }, (_, i) => [`k${i}`, "v"])),
      details: { s: "x".repeat(16 * KIB - '{"s":""}'.length) },
      reported_at: "2024-05-01T12:00:00+02:00",
    };
    assert.deepEqual(await device.putStatus(edge), edge);
  });

  test("400 INVALID_TELEMETRY_QUERY with details.field", async () => {
    const F = "battery.percent";
    const get = (path: string, query: Record<string, string | number>) => call(server, "GET", path, { bearer: controller.accessToken!, query });
    const range: Array<[Record<string, string | number>, string]> = [
      [{ field: F, start_time_ms: 5000, end_time_ms: 5000 }, "end_time_ms"],
      [{ field: F, start_time_ms: 5000, end_time_ms: 4000 }, "end_time_ms"],
      [{ field: "battery.level" }, "field"],
      [{}, "field"],
      [{ field: F, order: "random" }, "order"],
      [{ field: F, order: "ASC" }, "order"],
      [{ field: F, step_ms: -1 }, "step_ms"],
      [{ field: F, step_ms: "1.5" }, "step_ms"],
      [{ field: F, limit: 1001 }, "limit"],
      [{ field: F, limit: 0 }, "limit"],
      [{ field: F, limit: -5 }, "limit"],
      [{ field: F, limit: "10.0" }, "limit"],
      [{ field: F, limit: "ten" }, "limit"],
      [{ field: F, start_time_ms: "1e3" }, "start_time_ms"],
      [{ field: F, end_time_ms: "" }, "end_time_ms"],
      [{ field: F, end_time_ms: "0x10" }, "end_time_ms"],
      // Beyond 2^53 − 1 a double cannot hold every integer: 2^53 + 1 would be read as 2^53.
      [{ field: F, start_time_ms: 0, end_time_ms: "9007199254740993" }, "end_time_ms"],
      [{ field: F, start_time_ms: "-9999999999999999", end_time_ms: 0 }, "start_time_ms"],
      [{ field: F, start_time_ms: 0, end_time_ms: 1, step_ms: "9007199254740992" }, "step_ms"],
      [{ field: F, bucket_ms: 1000 }, "bucket_ms"],
      [{ field: F, fields: F }, "fields"],
    ];
    for (const [query, field] of range) {
      expectError(await get("/side-control/telemetry", query), 400, "INVALID_TELEMETRY_QUERY", { field }, `range ${JSON.stringify(query)}`);
    }
    const aggregate: Array<[Record<string, string | number>, string]> = [
      [{ field: F, start_time_ms: 0, end_time_ms: 1001, bucket_ms: 1, aggregate: "avg" }, "bucket_ms"],
      [{ field: F, bucket_ms: 60_000, aggregate: "avg" }, "bucket_ms"], // default window: a day, 1440 buckets
      [{ field: F, bucket_ms: 0, aggregate: "avg" }, "bucket_ms"],
      [{ field: F, bucket_ms: -60_000, aggregate: "avg" }, "bucket_ms"],
      [{ field: F, bucket_ms: "1.5", aggregate: "avg" }, "bucket_ms"],
      [{ field: F, start_time_ms: 0, end_time_ms: 1, bucket_ms: "9999999999999999", aggregate: "avg" }, "bucket_ms"],
      [{ field: F, aggregate: "avg" }, "bucket_ms"],
      [{ field: F, bucket_ms: 60_000, aggregate: "median" }, "aggregate"],
      [{ field: F, bucket_ms: 60_000 }, "aggregate"],
      [{ field: "nope", bucket_ms: 60_000, aggregate: "avg" }, "field"],
      [{ field: F, start_time_ms: 10, end_time_ms: 10, bucket_ms: 1, aggregate: "avg" }, "end_time_ms"],
      [{ field: F, bucket_ms: 3_600_000, aggregate: "avg", step_ms: 0 }, "step_ms"],
    ];
    for (const [query, field] of aggregate) {
      expectError(await get("/side-control/telemetry/aggregate", query), 400, "INVALID_TELEMETRY_QUERY", { field }, `aggregate ${JSON.stringify(query)}`);
    }
    const latest: Array<[Record<string, string | number>, string]> = [
      [{ fields: `${F},battery.level` }, "fields"],
      [{ field: F }, "field"],
    ];
    for (const [query, field] of latest) {
      expectError(await get("/side-control/telemetry/latest", query), 400, "INVALID_TELEMETRY_QUERY", { field }, `latest ${JSON.stringify(query)}`);
    }
    // The limits themselves are accepted.
    assert.equal((await get("/side-control/telemetry", { field: F, limit: 1000, step_ms: 0, order: "desc" })).status, 200);
    assert.equal((await get("/side-control/telemetry", { field: F, limit: 1 })).status, 200);
    assert.equal(
      (await get("/side-control/telemetry/aggregate", { field: F, start_time_ms: 0, end_time_ms: 1000, bucket_ms: 1, aggregate: "last" })).status,
      200,
    );
    assert.equal((await get("/side-control/telemetry/aggregate", { field: F, bucket_ms: 86_400, aggregate: "count" })).status, 200);
    const max = Number.MAX_SAFE_INTEGER;
    const widest = await get("/side-control/telemetry", { field: F, start_time_ms: -max, end_time_ms: max, step_ms: max });
    assert.equal(widest.status, 200);
    assert.deepEqual([widest.body.start_time_ms, widest.body.end_time_ms, widest.body.step_ms], [-max, max, max]);
  });

  test("400 INVALID_CONTACT with details.field; 404 CONTACT_NOT_FOUND; 409 CONTACT_EXISTS — nothing written", async () => {
    const bearer = controller.accessToken!;
    const post = (body: unknown) => call(server, "POST", "/side-control/contacts", { bearer, json: body });
    const put = (name: string, body: unknown) => call(server, "PUT", `/side-control/contacts/${encodeURIComponent(name)}`, { bearer, json: body });
    const alice = await controller.sideControl.contacts.create({ name: "alice", display_name: "Alice", phone_number: "+1 (555) 010-0001" });
    const bob = await controller.sideControl.contacts.create({ name: "bob", phone_number: "555 010 0002" });
    const snapshot = async () => (await controller.sideControl.contacts.list()).items;
    const before = await snapshot();
    assert.deepEqual(before, [alice, bob]);

    const creates: Array<[unknown, string]> = [
      [{ name: "", display_name: "Empty" }, "name"],
      [{ name: "n".repeat(65), display_name: "Long" }, "name"],
      [{ name: " carol", display_name: "Carol" }, "name"],
      [{ name: "carol ", display_name: "Carol" }, "name"],
      [{ name: "carol\n", display_name: "Carol" }, "name"],
      [{ display_name: "No name" }, "name"],
      [{ name: 7, display_name: "Seven" }, "name"],
      [{ name: "carol" }, "display_name"],
      [{ name: "carol", display_name: "   ", phone_number: " " }, "display_name"],
      [{ name: "carol", display_name: null, phone_number: null }, "display_name"],
      [{ name: "carol", phone_number: "call me" }, "phone_number"],
      [{ name: "carol", phone_number: "1+555" }, "phone_number"],
      [{ name: "carol", phone_number: "++1555" }, "phone_number"],
      [{ name: "carol", phone_number: "(-)" }, "phone_number"],
      [{ name: "carol", phone_number: 5550100 }, "phone_number"],
      [{ name: "carol", display_name: 5 }, "display_name"],
      [{ name: "carol", display_name: "Carol", email: "c@example.com" }, "email"],
    ];
    for (const [body, field] of creates) expectError(await post(body), 400, "INVALID_CONTACT", { field }, `POST ${JSON.stringify(body)}`);
    const updates: Array<[unknown, string]> = [
      [{ name: "alicia" }, "name"],
      [{ display_name: null, phone_number: null }, "display_name"],
      [{ phone_number: "nope" }, "phone_number"],
      [{ display_name: ["A"] }, "display_name"],
    ];
    for (const [body, field] of updates) expectError(await put("alice", body), 400, "INVALID_CONTACT", { field }, `PUT ${JSON.stringify(body)}`);
    // bob has no display name: clearing his phone number would leave nothing.
    expectError(await put("bob", { phone_number: "  " }), 400, "INVALID_CONTACT", { field: "display_name" }, "PUT clears the last field");
    const lists: Array<[Record<string, string | number>, string]> = [
      [{ cursor: "!!!" }, "cursor"],
      [{ cursor: "_w" }, "cursor"], // base64url of 0xff: not UTF-8
      [{ limit: 0 }, "limit"],
      [{ limit: 201 }, "limit"],
      [{ limit: "2.5" }, "limit"],
      [{ page: 2 }, "page"],
    ];
    for (const [query, field] of lists) {
      expectError(await call(server, "GET", "/side-control/contacts", { bearer, query }), 400, "INVALID_CONTACT", { field }, `list ${JSON.stringify(query)}`);
    }
    assert.deepEqual(await snapshot(), before, "no refused request changed the contacts");

    // 404 CONTACT_NOT_FOUND on get, put and delete; names are exact.
    for (const name of ["carol", "Alice", "alice ", "ali"]) {
      const path = `/side-control/contacts/${encodeURIComponent(name)}`;
      expectError(await call(server, "GET", path, { bearer }), 404, "CONTACT_NOT_FOUND", undefined, `GET ${name}`);
      expectError(await put(name, { display_name: "X" }), 404, "CONTACT_NOT_FOUND", undefined, `PUT ${name}`);
      expectError(await call(server, "DELETE", path, { bearer }), 404, "CONTACT_NOT_FOUND", undefined, `DELETE ${name}`);
    }
    // Another device's contacts are invisible.
    const { controller: otherController } = await newController(server, await newDevice(server));
    await rejectsWith(otherController.sideControl.contacts.get("alice"), 404, "CONTACT_NOT_FOUND", "another device's contact");
    await rejectsWith(otherController.sideControl.contacts.delete("alice"), 404, "CONTACT_NOT_FOUND", "another device's contact");

    // 409 CONTACT_EXISTS: same name; same phone digits with other separators; PUT onto another's number.
    const conflicts: Array<[string, unknown]> = [
      ["same name", { name: "alice", display_name: "Another Alice" }],
      ["same name, other phone", { name: "alice", phone_number: "+44 20 7946 0000" }],
      ["same digits, other separators", { name: "carol", phone_number: "1-555-010-0001" }],
      ["same digits, no separators", { name: "carol", phone_number: "+15550100001" }],
      ["same digits, spaces and parentheses", { name: "dave", phone_number: "(555) 010 0002" }],
    ];
    for (const [what, body] of conflicts) expectError(await post(body), 409, "CONTACT_EXISTS", undefined, what);
    expectError(await put("bob", { phone_number: "+1 555 010 0001" }), 409, "CONTACT_EXISTS", undefined, "PUT another contact's number");
    assert.deepEqual(await snapshot(), before, "no conflicting request changed the contacts");
    // The same number on another device is fine; so is a contact's own number on PUT.
    await otherController.sideControl.contacts.create({ name: "alice", phone_number: "+1 (555) 010-0001" });
    assert.equal((await put("alice", { phone_number: "15550100001" })).status, 200);
  });
});

// ---------------------------------------------------------------------------------------------

describe("bodies, media types and routing", () => {
  let server: TestNode;
  before(async () => {
    server = await startTestNode();
  });
  after(() => server.stop());

  test("400 INVALID_REQUEST for malformed JSON on every route that takes a body; nothing written", async () => {
    const device = await newDevice(server);
    const { controller } = await newController(server, device);
    await device.putStatus({ volume: 5 });
    const status = await device.status();
    const alice = await controller.sideControl.contacts.create({ name: "alice", display_name: "Alice" });
    const bad = ['{"volume": 7', "{'volume': 7}", "volume=7", "{}}", "\u0000"];
    for (const body of bad) {
      const what = JSON.stringify(body);
      expectError(
        await call(server, "PUT", "/me/status", { bearer: device.accessToken!, body, contentType: "application/json" }),
        400,
        "INVALID_REQUEST",
        undefined,
        what,
      );
      const postRes = await call(server, "POST", "/side-control/contacts", { bearer: controller.accessToken!, body, contentType: "application/json" });
      expectError(postRes, 400, "INVALID_REQUEST", undefined, `POST contact ${what}`);
      const putRes = await call(server, "PUT", "/side-control/contacts/alice", { bearer: controller.accessToken!, body, contentType: "application/json" });
      expectError(putRes, 400, "INVALID_REQUEST", undefined, `PUT contact ${what}`);
      const c = server.client();
      expectError(await loginCall(server, c, { body, contentType: "application/json" }), 400, "INVALID_REQUEST", undefined, `login ${what}`);
      assert.equal(await isRegistered(server, c.publicKey), false);
    }
    assert.deepEqual(await device.status(), status);
    assert.deepEqual((await controller.sideControl.contacts.list()).items, [alice]);
  });

  test("413 PAYLOAD_TOO_LARGE over 64 KiB on /login, /me/status and contacts; nothing written", async () => {
    const device = await newDevice(server);
    const { controller } = await newController(server, device);
    await device.putStatus({ volume: 5 });
    const status = await device.status();
    const alice = await controller.sideControl.contacts.create({ name: "alice", display_name: "Alice" });
    const big = (extra: Record<string, unknown>) => JSON.stringify({ ...extra, pad: "x".repeat(64 * KIB) });

    const c = server.client();
    const assertion = await c.assertion();
    expectError(
      await loginCall(server, c, { assertion, body: big({ grant_type: "primary" }), contentType: "application/json" }),
      413,
      "PAYLOAD_TOO_LARGE",
      undefined,
      "login",
    );
    assert.equal(await isRegistered(server, c.publicKey), false);
    expectLogin(await loginCall(server, c, { assertion }), "primary", "the assertion was not used up");

    const json = { contentType: "application/json" };
    expectError(
      await call(server, "PUT", "/me/status", { bearer: device.accessToken!, body: big({ volume: 9 }), ...json }),
      413,
      "PAYLOAD_TOO_LARGE",
      undefined,
      "status",
    );
    const postBody = big({ name: "bob", display_name: "Bob" });
    expectError(
      await call(server, "POST", "/side-control/contacts", { bearer: controller.accessToken!, body: postBody, ...json }),
      413,
      "PAYLOAD_TOO_LARGE",
      undefined,
      "POST contact",
    );
    const putBody = big({ display_name: "Alicia" });
    expectError(
      await call(server, "PUT", "/side-control/contacts/alice", { bearer: controller.accessToken!, body: putBody, ...json }),
      413,
      "PAYLOAD_TOO_LARGE",
      undefined,
      "PUT contact",
    );
    assert.deepEqual(await device.status(), status);
    assert.deepEqual((await controller.sideControl.contacts.list()).items, [alice]);
  });

  test("415 UNSUPPORTED_MEDIA_TYPE for JSON bodies sent as text/plain or without Content-Type; nothing written", async () => {
    const device = await newDevice(server);
    const { controller } = await newController(server, device);
    await device.putStatus({ volume: 5 });
    const status = await device.status();
    const alice = await controller.sideControl.contacts.create({ name: "alice", display_name: "Alice" });
    const bytes = (v: unknown) => new TextEncoder().encode(JSON.stringify(v));
    const routes: Array<[string, string, string, unknown]> = [
      ["PUT", "/me/status", device.accessToken!, { volume: 9 }],
      ["POST", "/side-control/contacts", controller.accessToken!, { name: "bob", display_name: "Bob" }],
      ["PUT", "/side-control/contacts/alice", controller.accessToken!, { display_name: "Alicia" }],
    ];
    for (const [method, path, bearer, body] of routes) {
      const what = `${method} ${path}`;
      expectError(await call(server, method, path, { bearer, body: JSON.stringify(body) }), 415, "UNSUPPORTED_MEDIA_TYPE", undefined, `${what} text/plain`);
      expectError(await call(server, method, path, { bearer, body: bytes(body) }), 415, "UNSUPPORTED_MEDIA_TYPE", undefined, `${what} no Content-Type`);
      expectError(await call(server, method, path, { bearer }), 415, "UNSUPPORTED_MEDIA_TYPE", undefined, `${what} no body at all`);
      const form = await call(server, method, path, { bearer, body: "volume=9", contentType: "application/x-www-form-urlencoded" });
      expectError(form, 415, "UNSUPPORTED_MEDIA_TYPE", undefined, `${what} form`);
    }
    assert.deepEqual(await device.status(), status);
    assert.deepEqual((await controller.sideControl.contacts.list()).items, [alice]);
    // application/json with parameters is JSON.
    const ok = await call(server, "PUT", "/me/status", {
      bearer: device.accessToken!,
      body: JSON.stringify({ volume: 9 }),
      contentType: "application/json; charset=utf-8",
    });
    assert.equal(ok.status, 200);
  });

  test("404 NOT_FOUND for unknown paths and 405 METHOD_NOT_ALLOWED with Allow for known ones", async () => {
    const device = await newDevice(server);
    for (const [method, path] of [
      ["GET", "/"],
      ["GET", "/nope"],
      ["POST", "/nope"],
      ["GET", "/me/nope"],
      ["GET", "/side-control/contacts/a/b"],
      ["GET", "/side-control/telemetry/raw"],
      ["GET", "/webrtc/v1/nope"],
    ] as const) {
      expectError(await call(server, method, path), 404, "NOT_FOUND", undefined, `${method} ${path}`);
      expectError(await call(server, method, path, { bearer: device.accessToken! }), 404, "NOT_FOUND", undefined, `${method} ${path} with a session`);
    }
    const cases: Array<[string, string, string[]]> = [
      ["GET", "/login", ["POST"]],
      ["PUT", "/login", ["POST"]],
      ["POST", "/server-info", ["GET"]],
      ["DELETE", "/me", ["GET"]],
      ["POST", "/me/status", ["GET", "PUT"]],
      ["PATCH", "/me/status", ["GET", "PUT"]],
      ["PUT", "/me/runtime", ["GET"]],
      ["GET", "/me/side-control/device-tokens", ["POST"]],
      ["GET", "/me/side-control/device-tokens/abc", ["DELETE"]],
      ["POST", "/me/side-control/sessions", ["GET"]],
      ["PUT", "/me/side-control/sessions/abc", ["DELETE"]],
      ["POST", "/side-control/status", ["GET"]],
      ["DELETE", "/side-control/telemetry", ["GET"]],
      ["PUT", "/side-control/contacts", ["GET", "POST"]],
      ["POST", "/side-control/contacts/alice", ["DELETE", "GET", "PUT"]],
      ["PATCH", "/side-control/contacts/alice", ["DELETE", "GET", "PUT"]],
    ];
    for (const [method, path, allowed] of cases) {
      for (const o of [{}, { bearer: device.accessToken! }]) {
        const res = await call(server, method, path, o);
        expectError(res, 405, "METHOD_NOT_ALLOWED", undefined, `${method} ${path}`);
        const allow = (res.headers.get("allow") ?? "")
          .split(",")
          .map((m) => m.trim())
          .filter(Boolean);
        assert.deepEqual([...allow].sort(), allowed, `${method} ${path}: Allow ${res.headers.get("allow")}`);
      }
    }
  });
});

// ---------------------------------------------------------------------------------------------

describe("429 RATE_LIMITED", () => {
  test("loginPerKey: only verified assertions count; over the limit 429 with Retry-After, nothing written", async () => {
    const clock = manualClock();
    const server = await startTestNode({ clock, config: { rate_limits: { ...NO_LIMITS, login_per_key: 3 } } });
    try {
      const k = server.client();
      // Somebody without K's private key sends many bad assertions for K: none of them counts.
      for (let i = 0; i < 6; i++) {
        const forged = craftAssertion(server, k, clock.now(), { secret: new Uint8Array(32).fill(i + 1) });
        expectError(await loginCall(server, k, { assertion: forged }), 401, "INVALID_ASSERTION", undefined, `forged ${i}`);
      }
      const expired = await k.assertion({ nowSeconds: Math.floor(clock.now() / 1000) - 120 });
      expectError(await loginCall(server, k, { assertion: expired }), 401, "INVALID_ASSERTION", undefined, "expired");
      expectError(await loginCall(server, k, { publicKey: "1111" }), 401, "INVALID_PUBLIC_KEY");
      // K itself still has its three logins a minute.
      for (let i = 0; i < 3; i++) expectLogin(await loginCall(server, k), "primary", `login ${i + 1}`);
      const sessions = (await server.domain.auth.liveSessions()).filter((s) => s.public_key === k.publicKey).length;
      const fourth = await k.assertion({ lifetimeSeconds: 300 });
      const limited = await loginCall(server, k, { assertion: fourth });
      expectError(limited, 429, "RATE_LIMITED", undefined, "fourth login");
      const retryAfter = Number(limited.headers.get("retry-after"));
      assert.ok(Number.isInteger(retryAfter) && retryAfter >= 1 && retryAfter <= 60, `Retry-After ${limited.headers.get("retry-after")}`);
      assert.equal((await server.domain.auth.liveSessions()).filter((s) => s.public_key === k.publicKey).length, sessions, "no session was created");
      // A forged assertion is still refused as such, not counted; other keys are not affected.
      expectError(await loginCall(server, k, { assertion: craftAssertion(server, k, clock.now(), { secret: new Uint8Array(32) }) }), 401, "INVALID_ASSERTION");
      expectLogin(await loginCall(server, server.client()), "primary", "another key");
      // After Retry-After the limited assertion (whose nonce was not claimed) logs in.
      clock.advance(retryAfter * 1000);
      expectLogin(await loginCall(server, k, { assertion: fourth }), "primary", "after Retry-After");
    } finally {
      await server.stop();
    }
  });

  test("loginPerKey: replays of an accepted assertion do not count, even in a burst; concurrent logins stop exactly at the limit", async () => {
    const clock = manualClock();
    const server = await startTestNode({ clock, config: { rate_limits: { ...NO_LIMITS, login_per_key: 2 } } });
    try {
      const k = server.client();
      const seen = await k.assertion();
      expectLogin(await loginCall(server, k, { assertion: seen }), "primary", "first login");
      // Whoever saw that assertion replays it: each replay is refused as such, and K keeps its second login.
      const burst = await Promise.all(Array.from({ length: 20 }, () => loginCall(server, k, { assertion: seen })));
      for (const r of burst) expectError(r, 401, "INVALID_ASSERTION", undefined, "concurrent replay");
      for (let i = 0; i < 5; i++) expectError(await loginCall(server, k, { assertion: seen }), 401, "INVALID_ASSERTION", undefined, `replay ${i}`);
      expectLogin(await loginCall(server, k), "primary", "second login");
      expectError(await loginCall(server, k), 429, "RATE_LIMITED", undefined, "third login");

      // Ten logins of one key at once: exactly two sessions, eight 429s.
      const l = server.client();
      const assertions = await Promise.all(Array.from({ length: 10 }, () => l.assertion()));
      const results = await Promise.all(assertions.map((assertion) => loginCall(server, l, { assertion })));
      assert.equal(results.filter((r) => r.status === 200).length, 2, `statuses: ${results.map((r) => r.status).join(",")}`);
      for (const r of results) if (r.status !== 200) expectError(r, 429, "RATE_LIMITED");
      assert.equal((await server.domain.auth.liveSessions()).filter((s) => s.public_key === l.publicKey).length, 2);
    } finally {
      await server.stop();
    }
  });

  test("loginPerAddress: every login from one address counts; 429 with Retry-After, nothing written", async () => {
    const clock = manualClock();
    const server = await startTestNode({ clock, config: { rate_limits: { ...NO_LIMITS, login_per_address: 3 } } });
    try {
      expectError(await call(server, "POST", "/login"), 401, "MISSING_ASSERTION");
      expectLogin(await loginCall(server, server.client()), "primary");
      expectLogin(await loginCall(server, server.client()), "primary");
      const c = server.client();
      const assertion = await c.assertion({ lifetimeSeconds: 300 });
      const limited = await loginCall(server, c, { assertion });
      expectError(limited, 429, "RATE_LIMITED", undefined, "fourth request from 127.0.0.1");
      const retryAfter = Number(limited.headers.get("retry-after"));
      assert.ok(Number.isInteger(retryAfter) && retryAfter >= 1 && retryAfter <= 60, `Retry-After ${limited.headers.get("retry-after")}`);
      assert.equal(await isRegistered(server, c.publicKey), false, "the limited login registered nobody");
      clock.advance(retryAfter * 1000);
      expectLogin(await loginCall(server, c, { assertion }), "primary", "after Retry-After, same assertion");
    } finally {
      await server.stop();
    }
  });

  test("deviceTokenPerDevice: 429 with Retry-After, nothing written, other devices unaffected", async () => {
    const clock = manualClock();
    const server = await startTestNode({ clock, config: { rate_limits: { ...NO_LIMITS, device_token_per_device: 2 } } });
    try {
      const device = await newDevice(server);
      await device.createDeviceToken();
      await device.createDeviceToken();
      const limited = await call(server, "POST", "/me/side-control/device-tokens", { bearer: device.accessToken! });
      expectError(limited, 429, "RATE_LIMITED");
      const retryAfter = Number(limited.headers.get("retry-after"));
      assert.ok(Number.isInteger(retryAfter) && retryAfter >= 1 && retryAfter <= 60, `Retry-After ${limited.headers.get("retry-after")}`);
      assert.equal(await server.store.read((r) => r.deviceTokens.countUsable(device.publicKey, clock.now())), 2);
      await (await newDevice(server)).createDeviceToken();
      clock.advance(retryAfter * 1000);
      await device.createDeviceToken();
      assert.equal(await server.store.read((r) => r.deviceTokens.countUsable(device.publicKey, clock.now())), 3);
    } finally {
      await server.stop();
    }
  });
});

// ---------------------------------------------------------------------------------------------
// Atomicity, on every store.

for (const store of STORES) {
  describe(`atomicity (${store.name})`, () => {
    let server: TestNode;
    let databaseUrl: string | undefined;
    const dataDir = tempDir();
    before(async () => {
      databaseUrl = await store.url();
      server = await startTestNode({ dataDir, config: { database_url: databaseUrl } });
    });
    after(async () => {
      await server.stop();
      rmSync(dataDir, { recursive: true, force: true });
    });

    test("50 concurrent Side Control logins with one device token: one 200, 49 × 401 INVALID_DEVICE_TOKEN", async () => {
      const device = await newDevice(server);
      const token = await device.createDeviceToken();
      const controllers = Array.from({ length: 50 }, () => server.client());
      const assertions = await Promise.all(controllers.map((c) => c.assertion()));
      const results = await Promise.all(
        controllers.map((c, i) => loginCall(server, c, { assertion: assertions[i]!, json: { grant_type: "side_control", device_token: token.token } })),
      );
      const winners = results.flatMap((r, i) => (r.status === 200 ? [i] : []));
      assert.equal(winners.length, 1, `statuses: ${results.map((r) => r.status).join(",")}`);
      for (const [i, r] of results.entries()) if (i !== winners[0]) expectError(r, 401, "INVALID_DEVICE_TOKEN", undefined, `controller ${i}`);
      const winner = controllers[winners[0]!]!;
      const sessions = await device.sideControlSessions();
      assert.deepEqual(
        sessions.items.map((s) => s.controller_public_key),
        [winner.publicKey],
      );
      assert.equal((await call(server, "GET", "/side-control/status", { bearer: results[winners[0]!]!.body.access_token })).status, 200);
      for (const c of controllers) assert.equal(await isRegistered(server, c.publicKey), false);
      // The losers' logins rolled back entirely: their assertions were not used up.
      const retries = await Promise.all(controllers.map((c, i) => (i === winners[0] ? undefined : loginCall(server, c, { assertion: assertions[i]! }))));
      for (const [i, r] of retries.entries()) if (r) expectLogin(r, "primary", `loser ${i} reuses its assertion`);
      expectError(await loginCall(server, winner, { assertion: assertions[winners[0]!]! }), 401, "INVALID_ASSERTION", undefined, "the winner's replay");
    });

    test("an accepted assertion is accepted once: replayed, concurrently, and after a restart", async () => {
      const c = server.client();
      const assertion = await c.assertion({ lifetimeSeconds: 300 });
      const results = await Promise.all(Array.from({ length: 20 }, () => loginCall(server, c, { assertion })));
      assert.equal(results.filter((r) => r.status === 200).length, 1, `statuses: ${results.map((r) => r.status).join(",")}`);
      for (const r of results) if (r.status !== 200) expectError(r, 401, "INVALID_ASSERTION");
      assert.equal((await server.domain.auth.liveSessions()).filter((s) => s.public_key === c.publicKey).length, 1, "one session");
      expectError(await loginCall(server, c, { assertion }), 401, "INVALID_ASSERTION", undefined, "replay");

      await server.stop();
      server = await startTestNode({ dataDir, config: { database_url: databaseUrl } });
      expectError(await loginCall(server, c, { assertion }), 401, "INVALID_ASSERTION", undefined, "replay after a restart");
      expectLogin(await loginCall(server, c), "primary", "a fresh assertion");
    });
  });
}
