/**
 * The companion web app (`/app/`) end to end: headless Debian Chromium (through playwright-core,
 * nothing downloaded) is the phone; a device SDK client on WebRTC is the device. Screenshots are
 * written to `test-artifacts/` (git-ignored) as the test goes.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { create, toBinary } from "@bufbuild/protobuf";
import { x25519 } from "@noble/curves/ed25519.js";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { encodeKey, generateKeyPair } from "../src/crypto/keys.ts";
import { RpcMethod, ServerPutInfoRequestSchema } from "../src/protocol/gen/rpc_pb.ts";
import { PerchClient } from "../src/sdk/client.ts";
import type { PerchConnection } from "../src/sdk/webrtc.ts";
import { ARTIFACTS, CHROMIUM_ARGS, launchChromium, phoneContext } from "./support/browser.ts";
import { freeUdpPort, startTestServer, type TestServer, tempDir } from "./support/server.ts";
import { connect } from "./support/webrtc.ts";

/**
 * The phone reaches the server by a LAN-style name, as on a home network: Chromium resolves it to
 * the loopback address itself, so no traffic leaves this machine, and the page is what a phone at
 * `http://<lan name>:<port>/app/` gets: not a secure context (no `crypto.subtle`).
 */
const LAN_NAME = "perch-box.lan";
const ARGS = [...CHROMIUM_ARGS, `--host-resolver-rules=MAP ${LAN_NAME} 127.0.0.1`];

/** Reports battery (and GNSS, when given) as the device's telemetry. */
function report(conn: PerchConnection, battery: number, position?: [number, number]): void {
  const observations: Parameters<PerchConnection["sendTelemetry"]>[0]["observations"] = [
    { observedAtDeltaMs: 0, body: { case: "battery", value: { percent: battery, charging: false } } },
    { observedAtDeltaMs: 0, body: { case: "system", value: { temperatureC: 30 + battery / 10 } } },
  ];
  if (position) observations.push({ observedAtDeltaMs: 0, body: { case: "gnss", value: { latitude: position[0], longitude: position[1], accuracyM: 5 } } });
  conn.sendTelemetry({ observedAtUnixMs: BigInt(Date.now()), observations });
}

async function shot(page: Page, name: string): Promise<void> {
  await page.screenshot({ path: join(ARTIFACTS, `webapp-${name}.png`), fullPage: true });
}

/**
 * The contrast ratio of every visible text element against the background it sits on (WCAG 2
 * formula): the texts below AA. A string, so that the test runner's transform adds nothing the page lacks.
 */
/** The controller key as the app keeps it (IndexedDB `perch`, store `keys`). */
const STORED_KEY = `(async () => {
  const db = await new Promise((resolve, reject) => { const r = indexedDB.open("perch"); r.onsuccess = () => resolve(r.result); r.onerror = () => reject(r.error); });
  const v = await new Promise((resolve, reject) => { const r = db.transaction("keys").objectStore("keys").get("controller"); r.onsuccess = () => resolve(r.result); r.onerror = () => reject(r.error); });
  db.close();
  return v ? { kind: v.kind, secret: Array.from(v.secret) } : null;
})()`;
/** The public key (base58) of the controller key the page keeps. */
async function storedPublicKey(page: Page): Promise<string> {
  const stored = (await page.evaluate(STORED_KEY)) as { kind: string; secret: number[] } | null;
  assert.equal(stored?.kind, "noble");
  return encodeKey(x25519.getPublicKey(Uint8Array.from(stored.secret)));
}

const LOW_CONTRAST = `(() => {
  const rgb = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => {
    const f = (v) => { const s = v / 255; return s <= 0.03928 ? s / 12.92 : ((s + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const background = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c.length === 3 || c[3] > 0.5) return c;
    }
    return [255, 255, 255];
  };
  const bad = [];
  for (const el of document.querySelectorAll("body *")) {
    const own = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
    if (!own || el.offsetParent === null || el.disabled) continue;
    const style = getComputedStyle(el);
    const [a, b] = [lum(rgb(style.color)), lum(background(el))];
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    const size = parseFloat(style.fontSize);
    const large = size >= 24 || (size >= 18.66 && Number(style.fontWeight) >= 700);
    if (ratio < (large ? 3 : 4.5)) bad.push(el.tagName + " " + JSON.stringify(el.textContent.trim().slice(0, 30)) + " " + ratio.toFixed(2));
  }
  return bad;
})()`;

function lowContrast(page: Page): Promise<string[]> {
  return page.evaluate(LOW_CONTRAST) as Promise<string[]>;
}

describe("the companion web app in headless Chromium", { timeout: 120_000 }, () => {
  let server: TestServer;
  let browser: Browser;
  let context: BrowserContext;
  let page: Page;
  let conn: PerchConnection;
  let device: PerchClient;
  const dataDir = tempDir();
  const pageLog: string[] = [];
  /** The app as the phone opens it: at the LAN-style name. */
  const app = (path = "") => `http://${LAN_NAME}:${server.port}/app/${path}`;
  const bearerOf = (p: Page) => p.evaluate(() => JSON.parse(localStorage.getItem("perch.session") ?? "{}").access_token) as Promise<string | undefined>;

  before(async () => {
    server = await startTestServer({ dataDir, config: { node_name: "webapp-node" } });
    browser = await launchChromium(ARGS);
    // A phone's screen: 360 CSS pixels wide.
    context = await phoneContext(browser);
    page = await context.newPage();
    page.on("console", (m) => pageLog.push(`${m.type()}: ${m.text()}`));
    page.on("pageerror", (e) => pageLog.push(`pageerror: ${e.message}`));
    conn = await connect(server);
    device = new PerchClient({ baseUrl: server.url, keyPair: conn.keyPair });
    await device.login();
    await conn.call(
      RpcMethod.SERVER_INFO_PUT,
      toBinary(ServerPutInfoRequestSchema, create(ServerPutInfoRequestSchema, { value: { name: "Kitchen speaker", emoji: "★" } })),
    );
    report(conn, 80, [48.137, 11.575]);
  });
  after(async () => {
    conn?.close();
    await browser?.close().catch(() => {});
    await server?.stop();
    if (pageLog.some((l) => l.startsWith("pageerror"))) console.log(pageLog.join("\n"));
  });

  test("the page and its assets: revalidated page, immutable hashed assets, at most 300 KiB of JavaScript", async () => {
    const res = await fetch(`${server.url}/app/`);
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("cache-control"), "no-cache");
    const etag = res.headers.get("etag");
    assert.ok(etag);
    assert.match(res.headers.get("content-security-policy") ?? "", /script-src 'self'/);
    const html = await res.text();
    assert.equal((await fetch(`${server.url}/app/`, { headers: { "if-none-match": etag } })).status, 304);
    assert.equal((await fetch(`${server.url}/app`, { redirect: "manual" })).headers.get("location"), "/app/");
    const assets = [...html.matchAll(/(?:src|href)="assets\/([^"]+)"/g)].map((m) => m[1] as string);
    assert.ok(assets.some((a) => /^main-[A-Z0-9]{8}\.js$/.test(a)) && assets.some((a) => a.endsWith(".css")), html);
    let js = 0;
    for (const a of assets) {
      const r = await fetch(`${server.url}/app/assets/${a}`);
      assert.equal(r.status, 200);
      assert.equal(r.headers.get("cache-control"), "public, max-age=31536000, immutable");
      if (a.endsWith(".js")) js += (await r.arrayBuffer()).byteLength;
    }
    assert.ok(js <= 300 * 1024, `${js} bytes of JavaScript on the page`);
    assert.equal((await fetch(`${server.url}/app/assets/main-AAAAAAAA.js`)).status, 404);
  });

  test("pairs from a token link at a LAN name over plain HTTP (no secure context); the device live; a chart and a track; contacts with a 409 beside the field", async () => {
    await page.goto(app());
    await page.getByLabel("Device token").waitFor();
    assert.deepEqual(
      await page.evaluate(() => ({ secure: window.isSecureContext, subtle: typeof crypto.subtle, host: location.hostname })),
      { secure: false, subtle: "undefined", host: LAN_NAME },
      "the page is where a phone on the LAN gets it: no secure context, no WebCrypto",
    );
    await page.goto("about:blank");
    const token = await device.createDeviceToken();
    await page.goto(app(`#token=${token.token}`));
    const deviceRegion = page.getByRole("region", { name: "Device", exact: true });
    await deviceRegion.waitFor();
    assert.equal(new URL(page.url()).hash, "", "the token is taken out of the address");
    await page.getByText("Live", { exact: true }).waitFor();
    await deviceRegion.getByText("Kitchen speaker").waitFor();
    await page.locator("#connection").getByText("Online").waitFor();
    await page.locator("#battery").getByText("80 %").waitFor();
    for (const name of ["Telemetry", "Contacts"]) await page.getByRole("region", { name, exact: true }).waitFor();

    // A report from the device changes the battery on the page, without reloading it.
    await page.evaluate("globalThis.__sameDocument = true");
    report(conn, 64, [48.138, 11.576]);
    await page.locator("#battery").getByText("64 %").waitFor({ timeout: 5_000 });
    report(conn, 63, [48.139, 11.578]);
    assert.equal(await page.evaluate("globalThis.__sameDocument"), true, "the page was not reloaded");

    // A chart per field with points, and the track through the positions.
    const chart = page.locator('figure.chart[data-field="battery.percent"]');
    await chart.locator("canvas").first().waitFor();
    await page.waitForFunction(() => Number(document.querySelector('figure.chart[data-field="battery.percent"]')?.getAttribute("data-points")) >= 2);
    await page.waitForFunction(() => (document.querySelector(".track polyline")?.getAttribute("points")?.split(" ").length ?? 0) >= 3);
    assert.match((await page.locator(".track svg").getAttribute("aria-label")) ?? "", /GNSS track: \d+ positions/);
    await shot(page, "device");
    await page.screenshot({ path: join(ARTIFACTS, "webapp-phone.png") });

    // Fits a 360 px screen: nothing wider than the viewport.
    assert.ok((await page.evaluate(() => document.documentElement.scrollWidth)) <= 360, "no horizontal scrolling at 360 px");
    assert.deepEqual(await lowContrast(page), [], "every text passes WCAG AA contrast");

    // Contacts: add one; the same again is a 409 shown beside the field; delete it.
    const contacts = page.getByRole("region", { name: "Contacts", exact: true });
    await contacts.getByLabel("Name", { exact: true }).fill("mom");
    await contacts.getByLabel("Phone number").fill("+1 555 0100");
    await contacts.getByRole("button", { name: "Add contact" }).click();
    await contacts.getByRole("list").getByText("mom").waitFor();
    await contacts.getByLabel("Name", { exact: true }).fill("mom");
    await contacts.getByLabel("Phone number").fill("+1 555 0199");
    await contacts.getByRole("button", { name: "Add contact" }).click();
    await page.locator("#contact-name-error").getByText("already exists").waitFor();
    assert.equal(await contacts.getByLabel("Name", { exact: true }).getAttribute("aria-invalid"), "true");
    await shot(page, "contact-409");
    // The device's own list has it, through the API.
    const phoneView = await fetch(`${server.url}/side-control/contacts`, {
      headers: { authorization: `Bearer ${await page.evaluate(() => JSON.parse(localStorage.getItem("perch.session") ?? "{}").access_token)}` },
    });
    assert.deepEqual(
      ((await phoneView.json()) as { items: Array<{ name: string }> }).items.map((c) => c.name),
      ["mom"],
    );
    await contacts.getByRole("button", { name: "Delete mom" }).click();
    await contacts.getByRole("button", { name: "Delete mom" }).click();
    await contacts.getByText("No contacts yet.").waitFor();
  });

  test("a used or wrong link opened on a paired phone says why it was not used and keeps the pairing; a new link pairs anew", async () => {
    const bearer = await bearerOf(page);
    assert.ok(bearer);
    const [used] = (await device.sideControlSessions()).items;
    assert.ok(used);
    // A link already used (by another phone), and one that never was a token.
    const consumed = await device.createDeviceToken();
    const otherPhone = generateKeyPair();
    await new PerchClient({ baseUrl: server.url, keyPair: otherPhone }).login({ deviceToken: consumed.token });
    for (const token of [consumed.token, "not-a-real-token"]) {
      await page.goto("about:blank");
      await page.goto(app(`#token=${token}`));
      await page.getByText("The pairing link was not used").waitFor();
      await page.getByText("This phone stays paired with its device.").waitFor();
      await page.getByRole("region", { name: "Device", exact: true }).getByText("Kitchen speaker").waitFor();
      await page.getByText("Live", { exact: true }).waitFor();
      assert.equal(await bearerOf(page), bearer, "the pairing is kept");
      assert.equal(new URL(page.url()).hash, "", "the token is taken out of the address");
    }
    await shot(page, "link-not-used");
    assert.equal((await fetch(`${server.url}/side-control/status`, { headers: { authorization: `Bearer ${bearer}` } })).status, 200);

    // A fresh link pairs anew; the pairing it replaces ends on the server. Its stream says so
    // before the page has let go of it (the page's timers held, as a busy phone may): the new
    // pairing goes on. The login is held until the old pairing's stream is live.
    let releaseLogin = () => {};
    const loginHeld = new Promise<void>((resolve) => (releaseLogin = resolve));
    await page.route("**/login", async (route) => {
      await loginHeld;
      await route.continue();
    });
    await page.clock.install();
    await page.goto("about:blank");
    await page.goto(app(`#token=${(await device.createDeviceToken()).token}`));
    await page.getByText("Live", { exact: true }).waitFor();
    await page.clock.pauseAt(Date.now() + 60_000);
    releaseLogin();
    await page.waitForFunction((old) => {
      const now = JSON.parse(localStorage.getItem("perch.session") ?? "{}").access_token;
      return now && now !== old;
    }, bearer);
    // The old pairing's stream has ended (its loop waits to retry) or its end was taken for the new one's.
    await page.getByText(/Reconnecting in \d+ s|The device ended this pairing/).waitFor();
    await page.clock.resume();
    await page.unroute("**/login");
    await page.getByText("Live", { exact: true }).waitFor();
    assert.equal(await page.getByText("The device ended this pairing").count(), 0, "the new pairing was not ended");
    assert.equal(await page.getByText("The pairing link was not used").count(), 0);
    const sessions = (await device.sideControlSessions()).items;
    assert.ok(!sessions.some((s) => s.id === used.id), "the replaced pairing ended on the server");
    assert.equal((await fetch(`${server.url}/side-control/status`, { headers: { authorization: `Bearer ${bearer}` } })).status, 401);
    for (const s of sessions) if (s.controller_public_key === encodeKey(otherPhone.publicKey)) await device.revokeSideControlSession(s.id);
  });

  test("the server restarting: the page says so, reconnects with back-off and reads the state again", async () => {
    const port = server.port;
    conn.close();
    await server.stop();
    await page.getByText(/Reconnecting in \d+ s/).waitFor({ timeout: 10_000 });
    await shot(page, "reconnecting");
    // The same HTTP port (the page's origin). The WebRTC port is the HTTP port's number by
    // default; another process may have taken that UDP port meanwhile, so then any free one is used.
    try {
      server = await startTestServer({ dataDir, config: { node_name: "webapp-node", port } });
    } catch (err) {
      if (!/EADDRINUSE/.test(String(err))) throw err;
      server = await startTestServer({ dataDir, config: { node_name: "webapp-node", port, webrtc: { udp_port: await freeUdpPort() } } });
    }
    conn = await connect(server, { keyPair: conn.keyPair });
    await page.getByText("Live", { exact: true }).waitFor({ timeout: 40_000 });
    report(conn, 55);
    await page.locator("#battery").getByText("55 %").waitFor({ timeout: 5_000 });
    await page.locator("#connection").getByText("Online").waitFor();
  });

  test("a revoked pairing says so and offers to pair again; a wrong token says so", async () => {
    const [session] = (await device.sideControlSessions()).items;
    assert.ok(session);
    await device.revokeSideControlSession(session.id);
    await page.getByText("The device ended this pairing").waitFor({ timeout: 5_000 });
    const field = page.getByLabel("Device token");
    await field.waitFor();
    assert.equal(await page.evaluate(() => localStorage.getItem("perch.session")), null, "the bearer is forgotten");
    await shot(page, "revoked");

    // A wrong token, typed and sent with the keyboard.
    await field.focus();
    await page.keyboard.type("not-a-real-token");
    await page.keyboard.press("Enter");
    await page.getByText("That device token is not valid").waitFor();
    assert.equal(await field.getAttribute("aria-invalid"), "true");
    await shot(page, "wrong-token");

    // Pairing again with a fresh token works (the controller key kept in IndexedDB).
    const key = await storedPublicKey(page);
    await field.fill((await device.createDeviceToken()).token);
    await page.keyboard.press("Enter");
    await page.getByRole("region", { name: "Device", exact: true }).waitFor();
    await page.getByText("Live", { exact: true }).waitFor();
    assert.equal(await storedPublicKey(page), key);
    const sessions = (await device.sideControlSessions()).items;
    assert.deepEqual(
      sessions.map((s) => s.controller_public_key),
      [session.controller_public_key],
      `the same controller key paired again; page: ${await page.locator("main").innerText()}`,
    );
  });

  test("Forget this device ends the session on the server (kept, with a notice, while the server cannot be reached); the key stays in IndexedDB", async () => {
    const [paired] = (await device.sideControlSessions()).items;
    assert.ok(paired, "paired by the test before");
    const bearer = (await page.evaluate(() => JSON.parse(localStorage.getItem("perch.session") ?? "{}").access_token)) as string;
    const forget = page.getByRole("button", { name: "Forget this device" });

    // The server out of reach: nothing is forgotten, the page says so.
    await page.route("**/side-control/session", (route) => route.abort("connectionrefused"));
    await forget.click();
    await page.getByText("the pairing was not ended").waitFor();
    assert.equal((await device.sideControlSessions()).items.length, 1);
    assert.equal(await page.evaluate(() => JSON.parse(localStorage.getItem("perch.session") ?? "{}").access_token), bearer);
    await page.unroute("**/side-control/session");

    await forget.click();
    await page.getByLabel("Device token").waitFor();
    assert.deepEqual((await device.sideControlSessions()).items, [], "no live session on the server");
    const res = await fetch(`${server.url}/side-control/status`, { headers: { authorization: `Bearer ${bearer}` } });
    assert.equal(res.status, 401, "the bearer is refused");
    assert.equal(await page.evaluate(() => localStorage.getItem("perch.session")), null);

    assert.equal(await storedPublicKey(page), paired.controller_public_key, "the key kept is the one that paired");
    assert.deepEqual(await page.evaluate(() => Object.keys(localStorage).filter((k) => k.includes("key"))), [], "no key in local storage");
  });
});

describe("the web app with map tiles configured", () => {
  test("the page names the tile server to the app and lets images come from it, and nothing else", async () => {
    const server = await startTestServer({ config: { app: { tile_url: "https://tiles.example.org/{z}/{x}/{y}.png?key=a&b=c" } } });
    try {
      const res = await fetch(`${server.url}/app/`);
      const html = await res.text();
      assert.ok(html.includes('<meta name="perch-tile-url" content="https://tiles.example.org/{z}/{x}/{y}.png?key=a&amp;b=c">'), html);
      const csp = res.headers.get("content-security-policy") ?? "";
      assert.match(csp, /img-src 'self' data: https:\/\/tiles\.example\.org(;|$)/);
      assert.match(csp, /connect-src 'self'(;|$)/);
      // The turns' recordings play from the page's own object URLs, and from nothing else.
      assert.match(csp, /media-src blob:(;|$)/);
    } finally {
      await server.stop();
    }
  });
});
