/**
 * End to end with a real browser: headless Chromium is the device. The page runs
 * `support/browser-device.ts`, written from the transport contract alone (WebCrypto for X25519 and
 * HKDF, @noble/ciphers for ChaCha20-Poly1305, the browser's own RTCPeerConnection), bundled here
 * with esbuild and served from the server's origin through Playwright's request interception.
 *
 * Chromium is the system's (Debian's `chromium`, or `PERCH_TEST_CHROMIUM`): nothing is downloaded.
 * Without it the test fails rather than skips, so that CI cannot pass without having run it.
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { test } from "node:test";
import { build } from "esbuild";
import pino from "pino";
import { type Browser, chromium, type Page } from "playwright-core";
import type { PageApi } from "./support/browser-device.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import vectors from "./support/vectors.json" with { type: "json" };
import { eventually } from "./support/webrtc.ts";

const CHROMIUM = process.env.PERCH_TEST_CHROMIUM || "/usr/bin/chromium";

const CHROMIUM_ARGS = [
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  // ICE candidates. Without a media permission Chromium offers one host candidate, the address of
  // its default route hidden behind an mDNS name; the server then learns the page's address from
  // its STUN checks (peer-reflexive), but a machine without a default route (a network-less CI
  // container) gets no candidate at all and gathering never completes. With the microphone
  // granted Chromium offers every interface by its address, and with this flag loopback as well,
  // where the test server listens.
  "--allow-loopback-in-peer-connection",
  // The microphone: granted without a prompt, and a synthetic one (CI has no audio hardware).
  // It is the device's uplink, as the contract has it.
  "--use-fake-ui-for-media-stream",
  "--use-fake-device-for-media-stream",
];

// The contract's vectors: "keys" and "sealed_offer".
const V = { ...vectors.keys, ...vectors.sealed_offer };

/** The page's module: the browser device and its dependencies in one ES module. */
async function bundleDevice(): Promise<string> {
  const result = await build({
    entryPoints: [new URL("./support/browser-device.ts", import.meta.url).pathname],
    bundle: true,
    write: false,
    format: "esm",
    platform: "browser",
    target: "chrome120",
    logLevel: "silent",
  });
  return result.outputFiles[0]!.text;
}

function devicePage(script: string): string {
  // Inline: a `</script` inside the bundle would end the element early.
  return `<!doctype html><meta charset="utf-8"><title>perch device</title><script type="module">${script.replace(/<\/script/gi, "<\\/script")}</script>`;
}

/** Calls a method of the page's device API (`globalThis.perchDevice`): arguments and result cross as JSON-like values. */
function call<K extends keyof PageApi>(page: Page, method: K, ...args: Parameters<PageApi[K]>): Promise<Awaited<ReturnType<PageApi[K]>>> {
  return page.evaluate(({ method, args }) => (globalThis as any).perchDevice[method](...args), { method, args: args as unknown[] });
}

test("headless Chromium as a device: sealed offer, event stream, HTTP on stream 1, the server's audio, runtime online", { timeout: 60_000 }, async (t) => {
  assert.ok(
    existsSync(CHROMIUM),
    `Chromium is required for this test and was not found at ${CHROMIUM} (install Debian's chromium, or set PERCH_TEST_CHROMIUM)`,
  );
  const started = performance.now();
  let server: TestServer | undefined;
  let browser: Browser | undefined;
  let closing: Promise<void> | undefined;
  const cleanup = () =>
    (closing ??= (async () => {
      await browser?.close().catch(() => {});
      await server?.stop();
    })());
  // A timed-out test is abandoned, not unwound: close the browser and the server all the same.
  t.signal.addEventListener("abort", () => void cleanup());
  const pageLog: string[] = [];
  const serverLog: Array<{ level: number; msg: string; method?: number; err?: string }> = [];
  const logger = pino({ level: "debug" }, { write: (line: string) => void serverLog.push(JSON.parse(line)) });
  try {
    const [script, s] = await Promise.all([bundleDevice(), startTestServer({ config: { node_name: "browser-test-node" }, logger })]);
    server = s;
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS, timeout: 20_000 });
    const page = await browser.newPage();
    page.on("console", (m) => pageLog.push(`${m.type()}: ${m.text()}`));
    page.on("pageerror", (e) => pageLog.push(`pageerror: ${e.message}`));
    // Same origin as the API: the page's fetches of /server-info and the offer need no CORS.
    const pageUrl = `${server.url}/__device.html`;
    await page.route(pageUrl, (route) => route.fulfill({ status: 200, contentType: "text/html; charset=utf-8", body: devicePage(script) }));
    await page.goto(pageUrl);
    await page.waitForFunction(() => (globalThis as any).perchDevice !== undefined);

    // The page's crypto against the contract's vectors, before it talks to the server.
    const vector = await call(page, "vector", {
      privateHex: V.client_private_hex,
      serverKey: V.server_public_base58,
      timestamp: V.timestamp,
      nonceHex: V.nonce_hex,
      offer: V.offer_plaintext,
      answerBodyHex: V.answer_body_hex,
    });
    assert.equal(vector.publicKey, V.client_public_base58);
    assert.equal(vector.sharedHex, V.shared_secret_hex);
    assert.deepEqual(vector.derived, {
      requestKey: V.request_key_hex,
      requestNonce: V.request_nonce_hex,
      responseKey: V.response_key_hex,
      responseNonce: V.response_nonce_hex,
    });
    assert.equal(vector.headers["X-Giznet-Nonce"], V.nonce_header);
    assert.equal(vector.bodyHex, V.offer_body_hex);
    assert.equal(vector.answer, V.answer_plaintext);

    // Connect: the offer carries the audio transceiver, packet channel and event stream.
    const conn = await call(page, "connect", { timeoutMs: 10_000, microphone: true });
    t.diagnostic(`connected after ${Math.round(performance.now() - started)} ms (server: ${conn.serverTiming})`);
    assert.equal(conn.events, "open");
    assert.equal(conn.packets, "open");
    const audioSection = conn.offer.split(/\r\n(?=m=)/).find((m) => m.startsWith("m=audio"));
    assert.match(audioSection ?? "", /^a=sendrecv$/m);
    assert.match(audioSection ?? "", /^a=rtpmap:\d+ opus\/48000\/2$/m);
    assert.match(conn.offer, /^m=application \d+ UDP\/DTLS\/SCTP webrtc-datachannel$/m);
    assert.match(conn.serverTiming, /verify;dur=[\d.]+, answer;dur=[\d.]+, seal;dur=[\d.]+, total;dur=[\d.]+/);
    const candidates = new Set(Array.from(conn.offer.matchAll(/^a=candidate:\S+ \d+ (\w+) \d+ (\S+) /gm), (m) => `${m[1]} ${m[2]}`));
    t.diagnostic(`offer candidates: ${[...candidates].join(", ")}`);
    t.diagnostic(`selected pair: ${JSON.stringify(await call(page, "selectedPair"))}`);

    // Peer RPC from the server: client.info.get (3) and client.identifiers.get (4), which the page
    // answers −32601 (not provided), as the contract asks of such a device.
    const unavailable = await eventually(
      () => {
        const lines = serverLog.filter((l) => l.msg === "device info not available");
        return lines.length === 2 ? lines : undefined;
      },
      5000,
      "the server's client.* calls",
    );
    // The server read the page's RpcResponse: its id matched the call, its error is the page's.
    assert.deepEqual(
      unavailable.map((l) => [l.method, l.level, l.err]),
      [
        [3, pino.levels.values.debug, "method not found"],
        [4, pino.levels.values.debug, "method not found"],
      ],
      JSON.stringify(unavailable),
    );

    // HTTP/1.1 on stream 1: the caller is the connection's key.
    const me = await call(page, "http", 1, "GET", "/me");
    assert.equal(me.status, 200, me.body);
    assert.equal(me.headers.connection, "close");
    assert.match(me.headers["content-type"] ?? "", /^application\/json/);
    const self = JSON.parse(me.body) as { public_key: string; role: string; registration_status: string };
    assert.deepEqual([self.public_key, self.role, self.registration_status], [conn.publicKey, "client", "active"]);

    const tone = await call(page, "http", 1, "POST", "/me/audio/tone", { body: JSON.stringify({ frequency_hz: 440, duration_ms: 1000 }) });
    assert.equal(tone.status, 202, tone.body);
    assert.deepEqual(JSON.parse(tone.body), { frames: 50 });

    // The tone arrives as Opus RTP on the audio transceiver (50 frames of 20 ms).
    const audio = await eventually(
      async () => {
        const a = await call(page, "inboundAudio");
        return a && a.packetsReceived >= 40 ? a : undefined;
      },
      10_000,
      "inbound audio packets",
    );
    t.diagnostic(`inbound audio: ${JSON.stringify(audio)}`);
    assert.ok(audio.packetsReceived > 0);
    assert.equal(audio.codec, "audio/opus");

    // A body the route refuses is an ErrorResponse, over the stream as over TCP.
    const bad = await call(page, "http", 1, "POST", "/me/audio/tone", { body: JSON.stringify({ frequency_hz: 5 }) });
    assert.equal(bad.status, 400, bad.body);
    assert.equal((JSON.parse(bad.body) as { error: { code: string } }).error.code, "INVALID_REQUEST");

    // From the Node side, as a companion app: a device token made by the browser device over
    // stream 1, a Side Control login with it over TCP, and the device's runtime.
    const token = await call(page, "http", 1, "POST", "/me/side-control/device-tokens");
    assert.equal(token.status, 201, token.body);
    const phone = server.client();
    await phone.login({ deviceToken: (JSON.parse(token.body) as { token: string }).token });
    const online = await phone.sideControl.runtime();
    assert.equal(online.online, true);
    assert.equal(online.node, "browser-test-node");
    assert.ok(server.transport?.connection(conn.publicKey)?.active);
    // The uplink: the page's microphone arrives as RTP (the ops interface's counter).
    const metricsUrl = `${server.url}/metrics`;
    await eventually(
      async () => Number(/^perch_webrtc_rtp_received_packets_total (\d+)/m.exec(await (await fetch(metricsUrl)).text())?.[1] ?? 0) > 10,
      5000,
      "uplink RTP at the server",
    );

    // Closing the page ends the connection: offline within 2 s (the contract), last_seen_at kept.
    const closedAt = performance.now();
    await call(page, "close");
    await page.close();
    const offline = await eventually(
      async () => {
        const r = await phone.sideControl.runtime();
        return r.online ? undefined : r;
      },
      2000,
      "runtime offline",
    );
    t.diagnostic(`offline ${Math.round(performance.now() - closedAt)} ms after the close`);
    assert.ok(offline.last_seen_at);
    assert.equal(server.transport?.size, 0);
    t.diagnostic(`whole test ${Math.round(performance.now() - started)} ms`);
  } catch (err) {
    if (pageLog.length > 0) t.diagnostic(`page console:\n${pageLog.join("\n")}`);
    throw err;
  } finally {
    await cleanup();
  }
});
