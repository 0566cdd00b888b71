import assert from "node:assert/strict";
import { createHmac, randomBytes } from "node:crypto";
import { readFileSync, rmSync, statSync } from "node:fs";
import { connect } from "node:net";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import pino from "pino";
import { decodeKey, decodePrivateKey, encodeKey, keyPairFromPrivate } from "../src/crypto/keys.ts";
import { ManualClock } from "../src/domain/clock.ts";
import { type PerchApiError, PerchClient } from "../src/sdk/client.ts";
import { STORES, startTestServer, type TestServer, tempDir } from "./support/server.ts";

const REQUEST_ID = /^[A-Za-z0-9._-]{1,128}$/;
const LIMIT = 64 * 1024;
const enc = new TextEncoder();

/** `json` followed by spaces up to exactly `bytes` bytes: still valid JSON. */
function padded(json: string, bytes: number): string {
  const n = bytes - enc.encode(json).length;
  assert.ok(n >= 0);
  return json + " ".repeat(n);
}

/** A streamed body (sent chunked, without Content-Length). */
function chunked(text: string, chunkSize = 16 * 1024): ReadableStream<Uint8Array> {
  const bytes = enc.encode(text);
  let offset = 0;
  return new ReadableStream({
    pull(c) {
      if (offset >= bytes.length) return c.close();
      c.enqueue(bytes.slice(offset, offset + chunkSize));
      offset += chunkSize;
    },
  });
}

function send(url: string, init: RequestInit & { duplex?: "half" }): Promise<Response> {
  return fetch(url, init);
}

async function errorCode(res: Response): Promise<string> {
  const body = (await res.json()) as { error: { code: string; message: string } };
  assert.equal(typeof body.error.message, "string");
  return body.error.code;
}

function preflight(url: string, method: string, headers = "authorization,content-type,x-public-key"): Promise<Response> {
  return fetch(url, {
    method: "OPTIONS",
    headers: { origin: "https://app.example", "access-control-request-method": method, "access-control-request-headers": headers },
  });
}

function headerList(res: Response, name: string): string[] {
  return (res.headers.get(name) ?? "")
    .split(",")
    .map((s) => s.trim().toLowerCase())
    .filter(Boolean);
}

/** Prometheus text → samples. */
function parseMetrics(text: string): Array<{ name: string; labels: Record<string, string>; value: number }> {
  const out: Array<{ name: string; labels: Record<string, string>; value: number }> = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    assert.ok(m, `unparsable metrics line: ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]!] = l[2]!;
    out.push({ name: m[1]!, labels, value: Number(m[3]) });
  }
  return out;
}

/** The value of the sample with exactly these labels (undefined when there is none). */
function sample(samples: ReturnType<typeof parseMetrics>, name: string, labels: Record<string, string> = {}): number | undefined {
  const want = Object.entries(labels);
  const hit = samples.find((s) => s.name === name && Object.keys(s.labels).length === want.length && want.every(([k, v]) => s.labels[k] === v));
  return hit?.value;
}

async function metrics(server: TestServer): Promise<{ text: string; samples: ReturnType<typeof parseMetrics> }> {
  const res = await fetch(`${server.url}/metrics`);
  assert.equal(res.status, 200);
  assert.match(res.headers.get("content-type") ?? "", /^text\/plain/);
  const text = await res.text();
  return { text, samples: parseMetrics(text) };
}

/** Resolves with the error code of a new TCP connection to the port ("connected" if it was accepted). */
function tcpConnect(port: number): Promise<string> {
  return new Promise((resolve) => {
    const socket = connect(port, "127.0.0.1");
    socket.once("connect", () => {
      socket.destroy();
      resolve("connected");
    });
    socket.once("error", (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
  });
}

/** A login bearer with its MAC altered: well-formed, but does not verify. */
function tamper(assertion: string): string {
  const last = assertion.at(-2) === "A" ? "B" : "A";
  return `${assertion.slice(0, -2)}${last}${assertion.at(-1)}`;
}

/** Every route of the Public API contract table (OpenAPI path syntax). */
const CONTRACT_ROUTES: Array<{ method: string; path: string; bearer: boolean; success: number }> = [
  { method: "get", path: "/server-info", bearer: false, success: 200 },
  { method: "post", path: "/login", bearer: false, success: 200 },
  { method: "post", path: "/webrtc/v1/offer", bearer: false, success: 200 },
  { method: "get", path: "/me", bearer: true, success: 200 },
  { method: "get", path: "/me/status", bearer: true, success: 200 },
  { method: "put", path: "/me/status", bearer: true, success: 200 },
  { method: "get", path: "/me/runtime", bearer: true, success: 200 },
  { method: "post", path: "/me/side-control/device-tokens", bearer: true, success: 201 },
  { method: "delete", path: "/me/side-control/device-tokens/{tokenId}", bearer: true, success: 204 },
  { method: "get", path: "/me/side-control/sessions", bearer: true, success: 200 },
  { method: "delete", path: "/me/side-control/sessions/{sessionId}", bearer: true, success: 204 },
  { method: "get", path: "/side-control/info", bearer: true, success: 200 },
  { method: "get", path: "/side-control/runtime", bearer: true, success: 200 },
  { method: "get", path: "/side-control/status", bearer: true, success: 200 },
  { method: "get", path: "/side-control/telemetry/latest", bearer: true, success: 200 },
  { method: "get", path: "/side-control/telemetry", bearer: true, success: 200 },
  { method: "get", path: "/side-control/telemetry/aggregate", bearer: true, success: 200 },
  { method: "get", path: "/side-control/contacts", bearer: true, success: 200 },
  { method: "post", path: "/side-control/contacts", bearer: true, success: 201 },
  { method: "get", path: "/side-control/contacts/{name}", bearer: true, success: 200 },
  { method: "put", path: "/side-control/contacts/{name}", bearer: true, success: 200 },
  { method: "delete", path: "/side-control/contacts/{name}", bearer: true, success: 200 },
  { method: "get", path: "/healthz", bearer: false, success: 200 },
  { method: "get", path: "/readyz", bearer: false, success: 200 },
  { method: "get", path: "/metrics", bearer: false, success: 200 },
];

for (const store of STORES) {
  describe(`HTTP behaviour (${store.name})`, () => {
    let server: TestServer;
    let device: PerchClient;
    before(async () => {
      server = await startTestServer({ config: { database_url: await store.url() } });
      device = server.client();
      await device.login();
    });
    after(() => server.stop());

    const auth = () => ({ authorization: `Bearer ${device.accessToken}` });

    test("X-Request-ID is echoed when well-formed, replaced otherwise, on every kind of response", async () => {
      const cases: Array<{ name: string; status: number; code?: string; send: (h: Record<string, string>) => Promise<Response> }> = [
        { name: "200 server-info", status: 200, send: (h) => fetch(`${server.url}/server-info`, { headers: h }) },
        {
          name: "201 device token",
          status: 201,
          send: (h) => fetch(`${server.url}/me/side-control/device-tokens`, { method: "POST", headers: { ...h, ...auth() } }),
        },
        {
          name: "204 revoke device token",
          status: 204,
          send: async (h) => {
            const token = await device.createDeviceToken();
            return fetch(`${server.url}/me/side-control/device-tokens/${token.id}`, { method: "DELETE", headers: { ...h, ...auth() } });
          },
        },
        { name: "401 no bearer", status: 401, code: "INVALID_SESSION", send: (h) => fetch(`${server.url}/me`, { headers: h }) },
        { name: "404 unknown route", status: 404, code: "NOT_FOUND", send: (h) => fetch(`${server.url}/no-such-route`, { headers: h }) },
        {
          name: "405 wrong method",
          status: 405,
          code: "METHOD_NOT_ALLOWED",
          send: (h) => fetch(`${server.url}/server-info`, { method: "DELETE", headers: h }),
        },
        {
          name: "413 body too large",
          status: 413,
          code: "PAYLOAD_TOO_LARGE",
          send: (h) =>
            fetch(`${server.url}/me/status`, {
              method: "PUT",
              headers: { ...h, ...auth(), "content-type": "application/json" },
              body: padded("{}", LIMIT + 1),
            }),
        },
        {
          name: "400 malformed JSON",
          status: 400,
          code: "INVALID_REQUEST",
          send: (h) =>
            fetch(`${server.url}/login`, {
              method: "POST",
              headers: { ...h, "content-type": "application/json", "x-public-key": device.publicKey },
              body: '{"grant_type":',
            }),
        },
        {
          name: "204 preflight",
          status: 204,
          send: (h) =>
            fetch(`${server.url}/me/status`, {
              method: "OPTIONS",
              headers: { ...h, origin: "https://app.example", "access-control-request-method": "PUT" },
            }),
        },
      ];
      const invalid = ["x".repeat(129), "has space", "a/b", "<script>", "semi;colon", 'quote"d', "tab\tbed", "plus+sign", "@"];
      const generated = new Set<string>();
      let i = 0;
      for (const c of cases) {
        const valid = `req-${i}.${"A_z-9".repeat(i)}`;
        const echoed = await c.send({ "x-request-id": valid });
        assert.equal(echoed.status, c.status, c.name);
        assert.equal(echoed.headers.get("x-request-id"), valid, `${c.name}: echoed`);
        assert.equal(echoed.headers.get("access-control-allow-origin"), "*", `${c.name}: CORS`);
        if (c.code) assert.equal(await errorCode(echoed), c.code, c.name);
        else await echoed.arrayBuffer();

        const bad = invalid[i % invalid.length]!;
        const replaced = await c.send({ "x-request-id": bad });
        assert.equal(replaced.status, c.status, c.name);
        const id = replaced.headers.get("x-request-id");
        assert.ok(id && REQUEST_ID.test(id) && id !== bad, `${c.name}: ${JSON.stringify(bad)} replaced by ${id}`);
        generated.add(id);
        await replaced.arrayBuffer();

        const none = await c.send({});
        assert.equal(none.status, c.status, c.name);
        const fresh = none.headers.get("x-request-id");
        assert.ok(fresh && REQUEST_ID.test(fresh), `${c.name}: generated ${fresh}`);
        assert.equal(none.headers.get("access-control-allow-origin"), "*", `${c.name}: CORS`);
        generated.add(fresh);
        await none.arrayBuffer();
        i++;
      }
      assert.equal(generated.size, cases.length * 2, "generated ids are unique");

      // The limits of the pattern itself: 128 characters pass, 129 do not; every allowed character passes.
      for (const value of ["a".repeat(128), "ABCxyz019._-", "-", "."]) {
        const res = await fetch(`${server.url}/healthz`, { headers: { "x-request-id": value } });
        assert.equal(res.headers.get("x-request-id"), value);
        await res.arrayBuffer();
      }
      for (const value of invalid) {
        const res = await fetch(`${server.url}/healthz`, { headers: { "x-request-id": value } });
        assert.notEqual(res.headers.get("x-request-id"), value);
        assert.match(res.headers.get("x-request-id") ?? "", REQUEST_ID);
        await res.arrayBuffer();
      }
    });

    test("CORS: Allow-Origin * everywhere; preflight answers 204 without authentication", async () => {
      for (const [path, init] of [
        ["/server-info", {}],
        ["/healthz", {}],
        ["/me", {}],
        ["/me", { headers: { authorization: "Bearer nope" } }],
        ["/side-control/status", { headers: auth() }],
        ["/nothing-here", {}],
      ] as const) {
        for (const origin of [undefined, "https://app.example"]) {
          const headers = { ...("headers" in init ? init.headers : {}), ...(origin ? { origin } : {}) };
          const res = await fetch(`${server.url}${path}`, { headers });
          assert.equal(res.headers.get("access-control-allow-origin"), "*", `${path} (${res.status})`);
          await res.arrayBuffer();
        }
      }

      const statusBefore = await device.status();
      for (const [path, method] of [
        ["/server-info", "GET"],
        ["/login", "POST"],
        ["/me", "GET"],
        ["/me/status", "PUT"],
        ["/me/side-control/device-tokens", "POST"],
        ["/me/side-control/device-tokens/some-id", "DELETE"],
        ["/me/side-control/sessions/some-id", "DELETE"],
        ["/side-control/status", "GET"],
        ["/side-control/contacts", "POST"],
        ["/side-control/contacts/bob", "PUT"],
      ] as const) {
        const res = await preflight(`${server.url}${path}`, method);
        assert.equal(res.status, 204, `OPTIONS ${path}`);
        assert.equal(await res.text(), "");
        assert.equal(res.headers.get("access-control-allow-origin"), "*", path);
        assert.match(res.headers.get("x-request-id") ?? "", REQUEST_ID);
        const methods = headerList(res, "access-control-allow-methods");
        assert.ok(methods.includes(method.toLowerCase()), `${path}: allow-methods ${methods}`);
        const allowed = headerList(res, "access-control-allow-headers");
        for (const h of ["authorization", "content-type", "x-public-key"]) assert.ok(allowed.includes(h), `${path}: allow-headers ${allowed} lacks ${h}`);
      }
      // Preflights ran no handler: nothing changed.
      assert.deepEqual(await device.status(), statusBefore);
      assert.deepEqual((await device.sideControlSessions()).items, []);
    });

    test("body limit: 64 KiB passes, one byte more is 413, with or without Content-Length", async () => {
      const put = (body: string | ReadableStream<Uint8Array>) =>
        send(`${server.url}/me/status`, {
          method: "PUT",
          headers: { ...auth(), "content-type": "application/json" },
          body,
          ...(typeof body === "string" ? {} : { duplex: "half" as const }),
        });

      let res = await put(padded('{"volume":11}', LIMIT));
      assert.equal(res.status, 200);
      assert.equal(((await res.json()) as { volume: number }).volume, 11);
      const stored = await device.status();
      assert.equal(stored.volume, 11);

      res = await put(padded('{"volume":12}', LIMIT + 1));
      assert.equal(res.status, 413);
      assert.equal(await errorCode(res), "PAYLOAD_TOO_LARGE");
      assert.deepEqual(await device.status(), stored, "a refused body writes nothing");

      res = await put(padded('{"volume":12}', 16 * LIMIT));
      assert.equal(res.status, 413);
      assert.equal(await errorCode(res), "PAYLOAD_TOO_LARGE");

      // The limit counts bytes, not characters.
      const multibyte = `{"volume":12,"labels":{"x":"${"é".repeat(LIMIT / 2)}"}}`;
      assert.ok(multibyte.length < LIMIT && enc.encode(multibyte).length > LIMIT);
      res = await put(multibyte);
      assert.equal(res.status, 413);
      assert.equal(await errorCode(res), "PAYLOAD_TOO_LARGE");
      assert.deepEqual(await device.status(), stored);

      // Chunked transfer: no Content-Length to check up front.
      res = await put(chunked(padded('{"volume":13}', LIMIT)));
      assert.equal(res.status, 200);
      assert.equal(((await res.json()) as { volume: number }).volume, 13);
      const streamed = await device.status();
      assert.equal(streamed.volume, 13);

      res = await put(chunked(padded('{"volume":14}', LIMIT + 1)));
      assert.equal(res.status, 413);
      assert.equal(await errorCode(res), "PAYLOAD_TOO_LARGE");
      res = await put(chunked(padded('{"volume":14}', 4 * LIMIT), 1000));
      assert.equal(res.status, 413);
      assert.equal(await errorCode(res), "PAYLOAD_TOO_LARGE");
      assert.deepEqual(await device.status(), streamed);

      // On /login too: the refused request consumed nothing, so its assertion still logs in.
      const caller = server.client();
      const assertion = await caller.assertion();
      const loginHeaders = { authorization: `Bearer ${assertion}`, "x-public-key": caller.publicKey, "content-type": "application/json" };
      for (const body of [padded('{"grant_type":"primary"}', LIMIT + 1), chunked(padded('{"grant_type":"primary"}', LIMIT + 1))]) {
        res = await send(`${server.url}/login`, {
          method: "POST",
          headers: loginHeaders,
          body,
          ...(typeof body === "string" ? {} : { duplex: "half" as const }),
        });
        assert.equal(res.status, 413);
        assert.equal(await errorCode(res), "PAYLOAD_TOO_LARGE");
      }
      await assert.rejects(caller.me(), (e: PerchApiError) => e.status === 401);
      res = await send(`${server.url}/login`, {
        method: "POST",
        headers: loginHeaders,
        body: chunked(padded('{"grant_type":"primary"}', LIMIT)),
        duplex: "half",
      });
      assert.equal(res.status, 200);
      assert.equal(((await res.json()) as { grant_type: string }).grant_type, "primary");
    });

    test("GET /openapi.json describes every route of the contract", async () => {
      const res = await fetch(`${server.url}/openapi.json`);
      assert.equal(res.status, 200);
      assert.match(res.headers.get("content-type") ?? "", /^application\/json/);
      const doc = (await res.json()) as {
        openapi: string;
        info: { title: string; version: string };
        paths: Record<string, Record<string, { security?: Array<Record<string, string[]>>; responses: Record<string, unknown> }>>;
        components: { schemas: Record<string, unknown>; securitySchemes: Record<string, { type: string; scheme: string }> };
      };
      assert.ok(doc.openapi.startsWith("3.1"), doc.openapi);
      assert.equal(typeof doc.info.title, "string");

      for (const r of CONTRACT_ROUTES) {
        const op = doc.paths[r.path]?.[r.method];
        assert.ok(op, `${r.method.toUpperCase()} ${r.path} is missing`);
        assert.ok(op.responses[String(r.success)], `${r.method.toUpperCase()} ${r.path}: no ${r.success} response`);
        const bearer = (op.security ?? []).some((s) => "bearerAuth" in s);
        assert.equal(bearer, r.bearer, `${r.method.toUpperCase()} ${r.path}: bearer security`);
      }
      // No path of the table offers a method the contract does not list.
      for (const path of new Set(CONTRACT_ROUTES.map((r) => r.path))) {
        const methods = Object.keys(doc.paths[path]!).filter((k) => ["get", "put", "post", "delete", "patch", "head", "options"].includes(k));
        const expected = CONTRACT_ROUTES.filter((r) => r.path === path).map((r) => r.method);
        assert.deepEqual(methods.sort(), expected.sort(), path);
      }

      const bearerScheme = doc.components.securitySchemes.bearerAuth;
      assert.equal(bearerScheme?.type, "http");
      assert.equal(bearerScheme?.scheme, "bearer");
      for (const name of [
        "ErrorResponse",
        "ServerInfo",
        "LoginRequest",
        "LoginResult",
        "PeerSelf",
        "DeviceInfo",
        "PeerStatus",
        "Runtime",
        "DeviceToken",
        "SideControlSessionList",
        "TelemetryLatest",
        "TelemetryRange",
        "TelemetryAggregate",
        "Contact",
        "ContactList",
      ]) {
        assert.ok(doc.components.schemas[name], `components.schemas.${name} is missing`);
      }
      // Errors are described with the shared ErrorResponse schema.
      const unauthorized = JSON.stringify(doc.paths["/me"]!.get!.responses["401"]);
      assert.match(unauthorized, /#\/components\/schemas\/ErrorResponse/);
      const loginErrors = doc.paths["/login"]!.post!.responses;
      for (const status of ["400", "401", "403", "413", "429"]) {
        assert.match(JSON.stringify(loginErrors[status]), /#\/components\/schemas\/ErrorResponse/, `/login ${status}`);
      }
    });

    test("GET /healthz and GET /readyz", async () => {
      for (const path of ["/healthz", "/readyz"]) {
        const res = await fetch(`${server.url}${path}`);
        assert.equal(res.status, 200, path);
        assert.match(res.headers.get("content-type") ?? "", /^application\/json/);
        assert.deepEqual(await res.json(), { status: "ok" });
      }
    });

    test("GET /metrics: requests by route pattern and status, latency buckets, live sessions", async () => {
      const s = await startTestServer({ config: { database_url: await store.url() } });
      try {
        let m = await metrics(s);
        assert.equal(sample(m.samples, "perch_active_sessions"), 0);

        const dev = s.client();
        const devLogin = await dev.login();
        const token = await dev.createDeviceToken();
        const phone = s.client();
        const sc = await phone.login({ deviceToken: token.token });
        const other = s.client();
        const otherLogin = await other.login();
        await phone.sideControl.contacts.create({ name: "bob", phone_number: "+1 555 0100" });
        for (let i = 0; i < 3; i++) await phone.sideControl.contacts.get("bob");
        await assert.rejects(phone.sideControl.contacts.get("nobody"), (e: PerchApiError) => e.code === "CONTACT_NOT_FOUND");
        await (await fetch(`${s.url}/no-such-route-xyz`)).arrayBuffer();

        m = await metrics(s);
        const contact = { method: "GET", route: "/side-control/contacts/:name" };
        assert.equal(sample(m.samples, "perch_http_requests_total", { ...contact, status: "200" }), 3);
        assert.equal(sample(m.samples, "perch_http_requests_total", { ...contact, status: "404" }), 1);
        assert.equal(sample(m.samples, "perch_http_requests_total", { method: "POST", route: "/side-control/contacts", status: "201" }), 1);
        assert.equal(sample(m.samples, "perch_http_requests_total", { method: "POST", route: "/login", status: "200" }), 3);
        assert.equal(sample(m.samples, "perch_http_requests_total", { method: "POST", route: "/me/side-control/device-tokens", status: "201" }), 1);
        assert.ok(!m.text.includes("bob") && !m.text.includes("nobody"), "labels carry route patterns, not concrete names");
        assert.ok(!m.text.includes("no-such-route-xyz"), "unknown paths do not become labels");

        const buckets = m.samples.filter(
          (x) => x.name === "perch_http_request_duration_seconds_bucket" && x.labels.route === contact.route && x.labels.status === "200",
        );
        assert.ok(buckets.length >= 2, "latency buckets exist");
        assert.equal(buckets.find((b) => b.labels.le === "+Inf")?.value, 3);
        for (let i = 1; i < buckets.length; i++) assert.ok(buckets[i]!.value >= buckets[i - 1]!.value, "buckets are cumulative");
        assert.equal(sample(m.samples, "perch_http_request_duration_seconds_count", { ...contact, status: "200" }), 3);
        assert.ok((sample(m.samples, "perch_http_request_duration_seconds_sum", { ...contact, status: "200" }) ?? -1) >= 0);

        assert.equal(sample(m.samples, "perch_active_sessions"), 3);
        assert.equal(await s.domain.auth.revokeSession(sc.session_id), true);
        assert.equal(sample((await metrics(s)).samples, "perch_active_sessions"), 2);
        assert.equal(await s.domain.auth.revokeSession(otherLogin.session_id), true);
        assert.equal(sample((await metrics(s)).samples, "perch_active_sessions"), 1);
        assert.notEqual(devLogin.session_id, otherLogin.session_id);
      } finally {
        await s.stop();
      }
    });

    test("logs hold request lines and never a secret", async () => {
      let log = "";
      const logger = pino(
        { level: "trace" },
        {
          write: (line: string) => {
            log += line;
          },
        },
      );
      const s = await startTestServer({ config: { database_url: await store.url() }, logger });
      const secrets: Record<string, string> = {};
      try {
        const dev = s.client();
        const assertion = await dev.assertion();
        secrets.assertion = assertion;
        secrets.assertionMac = assertion.split(".")[2]!;
        const login = await dev.login({ assertion });
        secrets.deviceAccessToken = login.access_token;
        await dev.putStatus({ volume: 3 });
        const token = await dev.createDeviceToken();
        secrets.deviceToken = token.token;

        const phone = s.client();
        const phoneAssertion = await phone.assertion();
        secrets.phoneAssertion = phoneAssertion;
        const sc = await phone.login({ deviceToken: token.token, assertion: phoneAssertion });
        secrets.sideControlAccessToken = sc.access_token;
        await phone.sideControl.contacts.create({ name: "mom", display_name: "Mom" });
        await phone.sideControl.contacts.get("mom");
        await phone.sideControl.contacts.list();

        // Refused requests carry secrets too.
        const stranger = s.client();
        const bad = tamper(await stranger.assertion());
        secrets.badAssertion = bad;
        await assert.rejects(stranger.login({ assertion: bad }), (e: PerchApiError) => e.code === "INVALID_ASSERTION");
        await assert.rejects(dev.login({ assertion }), (e: PerchApiError) => e.code === "INVALID_ASSERTION", "replay");
        const unknownToken = randomBytes(32).toString("base64url");
        secrets.unknownDeviceToken = unknownToken;
        await assert.rejects(stranger.login({ deviceToken: unknownToken }), (e: PerchApiError) => e.code === "INVALID_DEVICE_TOKEN");
        const fakeBearer = randomBytes(32).toString("base64url");
        secrets.fakeBearer = fakeBearer;
        await assert.rejects(dev.request("GET", "/me", { bearer: fakeBearer }), (e: PerchApiError) => e.code === "INVALID_SESSION");
        const querySecret = randomBytes(24).toString("base64url");
        secrets.querySecret = querySecret;
        const traced = await fetch(`${s.url}/side-control/status?access_token=${querySecret}`, {
          headers: { authorization: `Bearer ${sc.access_token}`, "x-request-id": "trace-me.1" },
        });
        assert.equal(traced.status, 200);
        await traced.arrayBuffer();

        // A 500: the store goes away under the server.
        const lateAssertion = await stranger.assertion();
        secrets.lateAssertion = lateAssertion;
        await s.store.close();
        await assert.rejects(stranger.login({ assertion: lateAssertion }), (e: PerchApiError) => {
          assert.equal(e.status, 500);
          assert.equal(e.code, "INTERNAL");
          assert.match(e.headers?.get("x-request-id") ?? "", REQUEST_ID, "a 500 carries X-Request-ID");
          assert.equal(e.headers?.get("access-control-allow-origin"), "*");
          return true;
        });
        await assert.rejects(dev.me(), (e: PerchApiError) => e.status === 500 && e.code === "INTERNAL");

        const keyFile = JSON.parse(readFileSync(join(s.dataDir, "server.key"), "utf8")) as { private_key: string };
        secrets.serverPrivateKey = keyFile.private_key;
      } finally {
        await s.stop();
      }

      for (const [name, secret] of Object.entries(secrets)) {
        assert.ok(secret.length >= 16, name);
        assert.ok(!log.includes(secret), `the log holds the ${name}`);
      }
      const lines = log
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l) as Record<string, unknown>);
      const requests = lines.filter((l) => l.msg === "request");
      const has = (method: string, route: string, status: number) =>
        assert.ok(
          requests.some((l) => l.method === method && l.route === route && l.status === status),
          `no request line for ${method} ${route} ${status}`,
        );
      has("POST", "/login", 200);
      has("POST", "/login", 401);
      has("POST", "/login", 500);
      has("GET", "/me", 401);
      has("GET", "/me", 500);
      has("PUT", "/me/status", 200);
      has("POST", "/me/side-control/device-tokens", 201);
      has("POST", "/side-control/contacts", 201);
      has("GET", "/side-control/contacts/:name", 200);
      for (const l of requests) assert.match(String(l.req_id), REQUEST_ID);
      const tracedLine = requests.find((l) => l.req_id === "trace-me.1");
      assert.ok(tracedLine, "the request line carries the request id");
      assert.equal(tracedLine.path, "/side-control/status", "no query string in the log");
      assert.equal(tracedLine.route, "/side-control/status");
      assert.equal(tracedLine.status, 200);
      assert.ok(
        lines.some((l) => l.msg === "request failed" && l.level === 50),
        "a 500 is logged as an error",
      );
    });

    test("graceful shutdown: in-flight requests finish, new connections are refused", async () => {
      const databaseUrl = await store.url();
      const dataDir = tempDir();
      try {
        const s = await startTestServer({ dataDir, config: { database_url: databaseUrl } });
        const dev = s.client();
        await dev.login();
        const caller = s.client();
        const callerAssertion = await caller.assertion();

        // Two uploads that stay open until released.
        let release!: () => void;
        const released = new Promise<void>((r) => (release = r));
        const started: Array<Promise<void>> = [];
        const slow = (first: string, rest: string) => {
          let step = 0;
          let began!: () => void;
          started.push(new Promise<void>((r) => (began = r)));
          return new ReadableStream<Uint8Array>({
            async pull(c) {
              if (step === 0) c.enqueue(enc.encode(first));
              else if (step === 1) {
                began();
                await released;
                c.enqueue(enc.encode(rest));
              } else c.close();
              step++;
            },
          });
        };
        const status = send(`${s.url}/me/status`, {
          method: "PUT",
          headers: { authorization: `Bearer ${dev.accessToken}`, "content-type": "application/json" },
          body: slow('{"volume":', "77}"),
          duplex: "half",
        });
        const login = send(`${s.url}/login`, {
          method: "POST",
          headers: { authorization: `Bearer ${callerAssertion}`, "x-public-key": caller.publicKey, "content-type": "application/json" },
          body: slow('{"grant_type"', ':"primary"}'),
          duplex: "half",
        });
        await Promise.all(started);
        // A later connection that got answered means the server has taken up both uploads' connections.
        assert.equal((await fetch(`${s.url}/healthz`, { headers: { connection: "close" } })).status, 200);

        let closed = false;
        const closing = s.close().then(() => (closed = true));
        assert.equal(await tcpConnect(s.port), "ECONNREFUSED", "no new connections once closing");
        assert.equal(closed, false, "close waits for in-flight requests");

        release();
        const statusRes = await status;
        assert.equal(statusRes.status, 200);
        assert.equal(((await statusRes.json()) as { volume: number }).volume, 77);
        const loginRes = await login;
        assert.equal(loginRes.status, 200);
        const session = (await loginRes.json()) as { access_token: string; grant_type: string };
        assert.equal(session.grant_type, "primary");
        await closing;
        assert.equal(await tcpConnect(s.port), "ECONNREFUSED");

        // What the in-flight requests wrote is in the store.
        const again = await startTestServer({ dataDir, config: { database_url: databaseUrl } });
        try {
          const devAgain = new PerchClient({ baseUrl: again.url, keyPair: dev.keyPair });
          await devAgain.login();
          assert.equal((await devAgain.status()).volume, 77);
          const callerAgain = new PerchClient({ baseUrl: again.url, keyPair: caller.keyPair });
          callerAgain.accessToken = session.access_token;
          assert.equal((await callerAgain.me()).public_key, caller.publicKey, "the session created while closing is valid");
        } finally {
          await again.stop();
        }
      } finally {
        rmSync(dataDir, { recursive: true, force: true });
      }
    });

    test("server key: mode 0600, stable across restarts, new for a new data directory", async () => {
      const databaseUrl = await store.url();
      const dataDir = tempDir();
      try {
        const keyPath = join(dataDir, "server.key");
        const first = await startTestServer({ dataDir, config: { database_url: databaseUrl } });
        const key1 = (await first.client().serverInfo()).public_key;
        await first.stop();
        assert.equal(statSync(keyPath).mode & 0o777, 0o600);
        const file = JSON.parse(readFileSync(keyPath, "utf8")) as { private_key: string };
        assert.equal(encodeKey(keyPairFromPrivate(decodePrivateKey(file.private_key)).publicKey), key1, "server.key holds the published key's private half");

        const second = await startTestServer({ dataDir, config: { database_url: databaseUrl } });
        try {
          assert.equal((await second.client().serverInfo()).public_key, key1);
          assert.equal(statSync(keyPath).mode & 0o777, 0o600);
        } finally {
          await second.stop();
        }

        const other = await startTestServer({ config: { database_url: await store.url() } });
        try {
          const key3 = (await other.client().serverInfo()).public_key;
          assert.notEqual(key3, key1);
          assert.equal(statSync(join(other.dataDir, "server.key")).mode & 0o777, 0o600);
        } finally {
          await other.stop();
        }
      } finally {
        rmSync(dataDir, { recursive: true, force: true });
      }
    });

    test("GET /server-info: protocol, time, endpoint and minted TURN credentials", async () => {
      const clock = new ManualClock(1_800_000_000_123);
      const s = await startTestServer({
        clock,
        config: {
          database_url: await store.url(),
          public_endpoint: "perch.example:443",
          ice: { servers: [{ urls: ["turn:turn.example:3478"], secret: "s3cret", name: "alice" }, { urls: ["stun:stun.example:3478"] }] },
        },
      });
      try {
        type Info = Awaited<ReturnType<PerchClient["serverInfo"]>>;
        const get = async () => {
          const res = await fetch(`${s.url}/server-info`);
          assert.equal(res.status, 200);
          const text = await res.text();
          assert.ok(!text.includes("s3cret"), "the TURN secret is never served");
          return JSON.parse(text) as Info;
        };
        let info = await get();
        assert.equal(info.protocol, "gizclaw-webrtc");
        assert.equal(info.signaling_path, "/webrtc/v1/offer");
        assert.equal(info.server_time, clock.now());
        assert.equal(info.endpoint, "perch.example:443");
        assert.equal(typeof info.version, "string");
        assert.equal(typeof info.build_commit, "string");
        assert.equal(typeof info.ice.udp, "boolean");
        assert.equal(typeof info.ice.tcp, "boolean");
        assert.equal(decodeKey(info.public_key).length, 32);

        const minted = (nowMs: number) => {
          const username = `${Math.floor(nowMs / 1000) + 600}:alice`;
          return { urls: ["turn:turn.example:3478"], username, credential: createHmac("sha1", "s3cret").update(username).digest("base64") };
        };
        assert.deepEqual(info.ice_servers, [minted(clock.now()), { urls: ["stun:stun.example:3478"] }]);
        assert.equal(info.ice_servers![0]!.username, "1800000600:alice");

        clock.advance(90_000);
        info = await get();
        assert.equal(info.server_time, clock.now());
        assert.deepEqual(info.ice_servers, [minted(clock.now()), { urls: ["stun:stun.example:3478"] }], "minted per response");
      } finally {
        await s.stop();
      }

      // Defaults: the listen address as endpoint; no ice_servers; a TURN secret without a name; static credentials.
      const plain = await startTestServer({ clock, config: { database_url: await store.url() } });
      try {
        const info = await plain.client().serverInfo();
        assert.equal(info.endpoint, `127.0.0.1:${plain.port}`);
        assert.equal(info.ice_servers, undefined);
      } finally {
        await plain.stop();
      }
      const unnamed = await startTestServer({
        clock,
        config: {
          database_url: await store.url(),
          ice: {
            servers: [
              { urls: ["turns:t.example:5349"], secret: "k" },
              { urls: ["turn:static.example"], username: "u", credential: "c" },
            ],
          },
        },
      });
      try {
        const info = await unnamed.client().serverInfo();
        const username = String(Math.floor(clock.now() / 1000) + 600);
        assert.deepEqual(info.ice_servers, [
          { urls: ["turns:t.example:5349"], username, credential: createHmac("sha1", "k").update(username).digest("base64") },
          { urls: ["turn:static.example"], username: "u", credential: "c" },
        ]);
      } finally {
        await unnamed.stop();
      }
    });
  });
}
