/**
 * The web app's Memory region in headless Debian Chromium (a 360 px phone): a device converses over
 * real WebRTC with a scripted model that remembers; after it leaves, the page shows the memory
 * (through the `memory` event); it is edited and forgotten with the keyboard, remembering is turned
 * off, and a device whose agent does not remember says so. The screenshot goes to `test-artifacts/`
 * (docs/app-memory.png is one of them).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { Browser, Page } from "playwright-core";
import type { PerchClient } from "../src/sdk/client.ts";
import { ARTIFACTS, appOfNewDevice } from "./support/browser.ts";
import { engines } from "./support/engines.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { memoryConfig, scriptMemoryModel } from "./support/memory.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { spoken, voiceDevice } from "./support/voice.ts";

describe("the web app's memory in headless Chromium", { timeout: 240_000 }, () => {
  let upstream: FakeUpstream;
  let server: TestServer;
  let browser: Browser;
  let page: Page;
  let device: PerchClient;

  before(async () => {
    upstream = await startFakeUpstream();
    scriptMemoryModel(upstream);
    await engines().transcription?.start?.();
    server = await startTestServer({ config: memoryConfig(upstream.url) });
    ({ browser, device, page } = await appOfNewDevice(server));
  });
  after(async () => {
    await browser?.close().catch(() => {});
    await server?.stop();
    await upstream?.close();
  });

  test("the memory appears after a conversation; edit and forget (after a confirmation) work with the keyboard; the switch turns it off", async () => {
    const region = page.getByRole("region", { name: "Memory", exact: true });
    await region.getByText("Nothing remembered yet.", { exact: false }).waitFor();
    const toggle = region.getByRole("switch", { name: "Remember between conversations" });
    assert.equal(await toggle.isChecked(), true);

    const { conn, log } = await voiceDevice(server, { keyPair: device.keyPair });
    const mic = await conn.microphone();
    await mic.say(await spoken("My name is Peter and I love playing football."));
    await log.wait((s) => s.stream === "out-1" && s.label === "turn.metrics", 60_000, "the turn");
    const heard = log.all.find((s) => s.stream === "in-1" && s.label === "user.transcript" && s.type === "TEXT_DONE")!.text!;
    conn.close();
    const remembered = `Heard: ${heard.trim().replace(/[.!?]*$/, "")}.`;
    await region.getByText(remembered).waitFor({ timeout: 30_000 });
    await region.getByText(/^Changed /).waitFor();
    assert.ok((await page.evaluate(() => document.documentElement.scrollWidth)) <= 360, "no horizontal scrolling at 360 px");
    await region.screenshot({ path: join(ARTIFACTS, "webapp-memory.png") });

    // Edit with the keyboard.
    await region.getByRole("button", { name: "Edit" }).focus();
    await page.keyboard.press("Enter");
    const box = region.getByRole("textbox", { name: "What the device remembers" });
    await box.fill("Peter prefers Celsius.");
    await region.getByText("22 of 2000 characters").waitFor();
    await box.focus();
    await page.keyboard.press("Tab");
    await page.keyboard.press("Enter");
    await region.getByText("Peter prefers Celsius.").waitFor();
    assert.equal((await server.domain.memory.view(device.publicKey)).text, "Peter prefers Celsius.");

    // Too long: the count says so and Save is disabled.
    await region.getByRole("button", { name: "Edit" }).click();
    await box.fill("a".repeat(2_001));
    assert.equal(await region.getByRole("button", { name: "Save" }).isDisabled(), true);
    await region.getByRole("button", { name: "Cancel" }).click();

    // Forget asks first; "Keep it" keeps it.
    await region.getByRole("button", { name: "Forget…" }).click();
    const confirm = region.getByRole("group", { name: "Forget what the device remembers?" });
    await confirm.getByRole("button", { name: "Keep it" }).click();
    assert.equal((await server.domain.memory.view(device.publicKey)).text, "Peter prefers Celsius.");
    await region.getByRole("button", { name: "Forget…" }).click();
    await confirm.getByRole("button", { name: "Forget it" }).focus();
    await page.keyboard.press("Enter");
    await region.getByText("Nothing remembered yet.", { exact: false }).waitFor();
    assert.equal((await server.domain.memory.view(device.publicKey)).text, "");

    // The switch, with the keyboard.
    await toggle.focus();
    await page.keyboard.press("Space");
    await region.getByText("Remembering is off", { exact: false }).waitFor();
    assert.equal(await toggle.isChecked(), false);
    assert.equal((await server.domain.memory.view(device.publicKey)).enabled, false);
    await toggle.click();
    await region.getByText("Remembering is off", { exact: false }).waitFor({ state: "detached" });
    assert.equal((await server.domain.memory.view(device.publicKey)).enabled, true);
  });

  test("a device whose agent does not remember: a clear line, no switch, no edit", async () => {
    await server.domain.peers.setVoiceAgent(device.publicKey, "plain");
    await page.reload();
    const region = page.getByRole("region", { name: "Memory", exact: true });
    await region.getByText("This device's assistant does not remember anything between conversations.").waitFor();
    assert.equal(await region.getByRole("switch").count(), 0);
    assert.equal(await region.getByRole("button", { name: "Edit" }).count(), 0);
  });
});
