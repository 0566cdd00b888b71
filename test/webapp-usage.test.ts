/**
 * The web app's Today region in headless Debian Chromium (a 360 px phone): the device's use against
 * its daily limits, and, once a limit refuses it (the `usage` event), the clear line that says it is
 * resting. The screenshot goes to `test-artifacts/` (docs/app-usage.png is one of them).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import OpenAI from "openai";
import type { Browser, Page } from "playwright-core";
import type { PerchClient } from "../src/sdk/client.ts";
import { ARTIFACTS, appOfNewDevice } from "./support/browser.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { ROOT, startTestServer, type TestServer } from "./support/server.ts";

describe("the web app's Today in headless Chromium", { timeout: 120_000 }, () => {
  let upstream: FakeUpstream;
  let server: TestServer;
  let browser: Browser;
  let page: Page;
  let device: PerchClient;

  before(async () => {
    upstream = await startFakeUpstream();
    server = await startTestServer({
      config: {
        providers: [{ id: "up", kind: "openai-compatible", base_url: upstream.url, max_retries: 0 }],
        models: [{ id: "chat", kind: "chat", provider: "up", upstream_model: "m" }],
        usage: { limits: [{ scope: "device", per: "day", requests: 3, tokens: 1_000 }] },
      },
    });
    ({ browser, device, page } = await appOfNewDevice(server));
  });
  after(async () => {
    await browser?.close().catch(() => {});
    await server?.stop();
    await upstream?.close();
  });

  test("today's use against each limit; a clear line while a limit stops the device", async () => {
    const region = page.getByRole("region", { name: "Today", exact: true });
    const requests = region.getByRole("progressbar", { name: /^Conversations and requests: 0 of 3/ });
    await requests.waitFor();
    await region.getByRole("progressbar", { name: /^Words the assistant read and wrote \(tokens\): 0 of 1,000/ }).waitFor();
    assert.equal(await region.getByRole("alert").count(), 0, "not resting");

    const chat = new OpenAI({ apiKey: device.accessToken!, baseURL: `${server.url}/openai/v1`, maxRetries: 0 });
    for (let i = 0; i < 3; i++) await chat.chat.completions.create({ model: "chat", messages: [{ role: "user", content: "hi" }] });
    await assert.rejects(chat.chat.completions.create({ model: "chat", messages: [{ role: "user", content: "hi" }] }), OpenAI.RateLimitError);
    // The refusal is the `usage` event: the page says so, and shows the use as it is now.
    await region
      .getByRole("alert")
      .getByText(/Resting: the device reached its conversations and requests limit/)
      .waitFor({ timeout: 10_000 });
    await region.getByRole("progressbar", { name: /^Conversations and requests: 3 of 3/ }).waitFor();
    await region.getByRole("progressbar", { name: /^Words the assistant read and wrote \(tokens\): 30 of 1,000/ }).waitFor();
    assert.ok((await page.evaluate(() => document.documentElement.scrollWidth)) <= 360, "no horizontal scrolling at 360 px");
    await region.screenshot({ path: join(ARTIFACTS, "webapp-usage.png") });
    await region.screenshot({ path: join(ROOT, "docs", "app-usage.png") });
  });
});
