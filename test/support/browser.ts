/**
 * The system's headless Chromium for the web app's and the browser device's tests (Debian's
 * `chromium`, or `PERCH_TEST_CHROMIUM`: nothing is downloaded), and the phone-sized page of the app.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { type Browser, type BrowserContext, chromium, type Page } from "playwright-core";
import type { PerchClient } from "../../src/sdk/client.ts";
import { ROOT, type TestServer } from "./server.ts";

export const CHROMIUM = process.env.PERCH_TEST_CHROMIUM || "/usr/bin/chromium";
/** Where the tests' screenshots go (docs/app-*.png are some of them). */
export const ARTIFACTS = join(ROOT, "test-artifacts");
/** Quiet: no sandbox (containers), no GPU, nothing fetched in the background. */
export const CHROMIUM_ARGS = [
  "--no-sandbox",
  "--disable-gpu",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

/** Launches headless Chromium with `args` (the quiet ones by default); fails naming how to install it when it is missing. */
export async function launchChromium(args: string[] = CHROMIUM_ARGS): Promise<Browser> {
  assert.ok(
    existsSync(CHROMIUM),
    `Chromium is required for this test and was not found at ${CHROMIUM} (install Debian's chromium, or set PERCH_TEST_CHROMIUM)`,
  );
  mkdirSync(ARTIFACTS, { recursive: true });
  return chromium.launch({ executablePath: CHROMIUM, headless: true, args, timeout: 20_000 });
}

/** A phone's screen: 360 CSS pixels wide, touch. */
export function phoneContext(browser: Browser): Promise<BrowserContext> {
  return browser.newContext({ viewport: { width: 360, height: 780 }, deviceScaleFactor: 2, isMobile: true, hasTouch: true });
}

/** Chromium with the web app of `server` open on a phone, paired with a new device (logged in). Close `browser` when done. */
export async function appOfNewDevice(server: TestServer): Promise<{ browser: Browser; device: PerchClient; page: Page }> {
  const browser = await launchChromium();
  const device = server.client();
  await device.login();
  return { browser, device, page: await phoneApp(browser, server.url, device) };
}

/** The web app at `baseUrl` on a phone, paired with `device` (a device token in the link), once it shows Live. */
export async function phoneApp(browser: Browser, baseUrl: string, device: PerchClient): Promise<Page> {
  const page = await (await phoneContext(browser)).newPage();
  await page.goto(`${baseUrl}/app/#token=${(await device.createDeviceToken()).token}`);
  await page.getByText("Live", { exact: true }).waitFor();
  return page;
}
