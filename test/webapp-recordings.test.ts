/**
 * The web app's stored conversation in headless Debian Chromium (a 360 px phone): each turn's two
 * sides play from the server (fetched with the bearer, played from an object URL) and the turn's
 * timeline shows its metrics and tool calls. The screenshot goes to `test-artifacts/`
 * (docs/app-recordings.png is one of them).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { Browser, Page } from "playwright-core";
import type { PerchClient } from "../src/sdk/client.ts";
import { ARTIFACTS, launchChromium, phoneApp } from "./support/browser.ts";
import { recordingConfig, recordTurn, sides } from "./support/recordings.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { eventually } from "./support/webrtc.ts";

const METRICS = { end_of_speech: 412.5, transcription: 180.2, first_token: 655, first_audio: 140, speech_to_audio: 1520, interrupted: false };

describe("the web app plays a stored turn's two sides and shows its timeline (headless Chromium)", { timeout: 120_000 }, () => {
  let server: TestServer;
  let browser: Browser;
  let page: Page;
  let device: PerchClient;

  before(async () => {
    server = await startTestServer({ config: recordingConfig(undefined, 7) });
    browser = await launchChromium();
    device = server.client();
    await device.login();
    await recordTurn(server, device.publicKey, await sides(), { metrics: METRICS, tool: { name: "home.lights", is_error: false } });
    page = await phoneApp(browser, server.url, device);
  });
  after(async () => {
    await browser?.close().catch(() => {});
    await server?.stop();
  });

  test("the timeline from the metrics, the tool call, and both sides played", async () => {
    const region = page.getByRole("region", { name: "Conversations", exact: true });
    await region.getByRole("button", { name: /^Show conversation of/ }).click();
    const timeline = region.getByRole("list", { name: "Timeline of turn 1" });
    await timeline.waitFor();
    assert.deepEqual(
      (await timeline.getByRole("listitem").allInnerTexts()).map((t) => t.replace(/\s+/g, " ").trim()),
      // First audio: what speech to audio leaves after the stages before it (1520 − 412.5 − 180.2 − 655).
      ["End of speech 413 ms", "Transcript 180 ms", "First text 655 ms", "First audio 272 ms"],
    );
    await region.getByText("Speech to audio 1.52 s").waitFor();
    assert.deepEqual(await region.getByRole("list", { name: "Tool calls of turn 1" }).getByRole("listitem").allInnerTexts(), ["Tool home.lights"]);

    for (const side of ["Heard", "Reply"]) {
      await region.getByRole("button", { name: `Play ${side.toLowerCase()}, turn 1` }).click();
      const audio = region.locator(`audio[aria-label="${side}, turn 1"]`);
      await audio.waitFor();
      // Decoded by the browser and playing: its duration known, its time moving on.
      const played = await eventually(
        async () => {
          const s = await audio.evaluate((a: HTMLAudioElement) => {
            if (a.paused && a.currentTime === 0) void a.play().catch(() => {});
            return { duration: a.duration, time: a.currentTime, error: a.error?.code ?? 0, src: a.src };
          });
          assert.equal(s.error, 0, `${side}: the browser could not decode the recording`);
          return s.time > 0.2 && Number.isFinite(s.duration) ? s : undefined;
        },
        15_000,
        `${side} playing`,
      );
      assert.ok(played.src.startsWith("blob:"), "played from an object URL (the bearer never in a URL)");
      assert.ok(played.duration > 1.5 && played.duration < 8, `${side}: ${played.duration} s`);
    }
    assert.ok((await page.evaluate(() => document.documentElement.scrollWidth)) <= 360, "no horizontal scrolling at 360 px");
    await region.screenshot({ path: join(ARTIFACTS, "webapp-recordings.png") });
  });
});
