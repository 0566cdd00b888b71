/**
 * The web app's Conversations region in headless Debian Chromium (a 360 px phone): a device
 * converses over real WebRTC with a scripted model while the page shows the conversation live;
 * stored conversations page in and are deleted after a confirmation. Screenshots go to
 * `test-artifacts/` (the README's docs/app-conversation.png is one of them).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { create, toBinary } from "@bufbuild/protobuf";
import type { Browser, Page } from "playwright-core";
import type { FliteSpeechEngine } from "../src/ai/speech/index.ts";
import { RpcMethod, ServerPutInfoRequestSchema } from "../src/protocol/gen/rpc_pb.ts";
import { PerchClient } from "../src/sdk/client.ts";
import type { PerchConnection } from "../src/sdk/webrtc.ts";
import { ARTIFACTS, launchChromium, phoneApp } from "./support/browser.ts";
import { storedRows } from "./support/conversations.ts";
import { engines } from "./support/engines.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { EventLog, heardFor, resample, talkerConfig } from "./support/voice.ts";
import { connect } from "./support/webrtc.ts";

const LONG = "Here is a story about a small bird. It lived in a tall tree by the river. Every morning it sang to the fish. One day the fish sang back.";

describe("the web app's conversations in headless Chromium", { timeout: 240_000 }, () => {
  let upstream: FakeUpstream;
  let server: TestServer;
  let browser: Browser;
  let page: Page;
  let conn: PerchConnection;
  let device: PerchClient;

  before(async () => {
    upstream = await startFakeUpstream();
    // The recogniser's and the voice detector's models loaded before the first turn (a loaded machine takes long).
    await engines().transcription?.start?.();
    server = await startTestServer({ config: { ...talkerConfig(upstream.url), voice: { ...talkerConfig(upstream.url).voice, store_transcripts: true } } });
    browser = await launchChromium();
    conn = await connect(server);
    device = new PerchClient({ baseUrl: server.url, keyPair: conn.keyPair });
    await device.login();
    await conn.call(RpcMethod.SERVER_INFO_PUT, toBinary(ServerPutInfoRequestSchema, create(ServerPutInfoRequestSchema, { value: { name: "Bedtime bear" } })));
    page = await phoneApp(browser, server.url, device);
  });
  after(async () => {
    conn?.close();
    await browser?.close().catch(() => {});
    await server?.stop();
    await upstream?.close();
  });

  test("the live conversation appears while the device talks, the interrupted reply marked", async () => {
    const region = page.getByRole("region", { name: "Conversations", exact: true });
    await region.getByText("Nothing said yet.").waitFor();
    const log = new EventLog(conn);
    const mic = await conn.microphone();
    const say = async (text: string) => {
      const { samples, sampleRate } = await (engines().speech as FliteSpeechEngine).speak(text, "nova");
      await mic.say(await resample(samples, sampleRate, 48_000));
    };
    upstream.reply({ chunks: LONG.split(/(?<=\. )/) });
    await say("Tell me a story about a bird.");
    await log.wait((s) => s.stream === "out-1" && s.type === "BOS" && s.label === "assistant.audio", 30_000, "the story's audio");
    await heardFor(conn, 1_500);
    upstream.reply({ content: "Good night. Sleep well." });
    await say("Say good night please.");
    await log.wait((s) => s.stream === "out-2" && s.label === "turn.metrics", 30_000, "turn 2");

    const live = region.getByRole("list", { name: "Live conversation" });
    await live.getByText("Good night. Sleep well.").waitFor({ timeout: 5_000 });
    const items = await live.getByRole("listitem").allInnerTexts();
    assert.equal(items.length, 4, items.join(" | "));
    assert.match(items[0]!, /^Heard\n.*bird/is);
    assert.match(items[1]!, /^Bedtime bear said\nHere is a story.*interrupted$/s);
    assert.match(items[2]!, /^Heard\n.*night/is);
    assert.match(items[3]!, /^Bedtime bear said\nGood night\. Sleep well\.$/);
    assert.ok((await page.evaluate(() => document.documentElement.scrollWidth)) <= 360, "no horizontal scrolling at 360 px");
    await region.screenshot({ path: join(ARTIFACTS, "webapp-conversation.png") });
  });

  test("stored conversations page in, open, and are deleted after a confirmation; delete all asks too", async () => {
    const key = device.publicKey;
    // Twelve earlier conversations of the device (the voice path is tested above and in voice-conversations.test.ts).
    for (let i = 0; i < 12; i++) {
      const rec = server.domain.conversations.open(key, (err) => assert.fail(String(err)));
      rec.add({ turn: 1, role: "user", text: `Question number ${i}` });
      rec.add({ turn: 1, role: "assistant", text: `Answer number ${i}` });
      rec.close();
      await rec.settled();
      await sleep(2);
    }
    await page.reload();
    await page.getByText("Live", { exact: true }).waitFor();
    const region = page.getByRole("region", { name: "Conversations", exact: true });
    const earlier = region.getByRole("list", { name: "Earlier" });
    // Summarised by what was asked (issue 39), in quotes.
    await earlier.getByText("“Question number 11”").waitFor();
    assert.equal(await earlier.getByRole("listitem").count(), 10, "a page of ten, newest first");
    await region.getByRole("button", { name: "Older" }).click();
    await earlier.getByText("“Question number 0”").waitFor();
    // Page 2: the two oldest stored here and the live conversation of the first test, started before them.
    assert.equal(await earlier.getByRole("listitem").count(), 3);

    // Open one with the keyboard; then delete it, which asks first.
    const zero = earlier.locator("li.conversation").filter({ hasText: "“Question number 0”" });
    await zero.getByRole("button", { name: /^Show conversation of / }).focus();
    await page.keyboard.press("Enter");
    await zero
      .getByRole("list", { name: /^Conversation of / })
      .getByText("Question number 0")
      .waitFor();
    await zero.getByRole("button", { name: /^Delete conversation of / }).click();
    await zero.getByRole("button", { name: "Keep" }).waitFor();
    assert.deepEqual(await storedRows(server, undefined, key), [13, 28], "nothing deleted before the confirmation");
    await zero.getByRole("button", { name: /^Delete conversation of / }).click();
    await zero.waitFor({ state: "detached" });
    assert.deepEqual(await storedRows(server, undefined, key), [12, 26]);

    await region.getByRole("button", { name: "Delete all…" }).click();
    await region.getByRole("group", { name: "Delete every stored conversation?" }).waitFor();
    assert.deepEqual(await storedRows(server, undefined, key), [12, 26]);
    await page.screenshot({ path: join(ARTIFACTS, "webapp-conversations-delete-all.png"), fullPage: true });
    await region.getByRole("button", { name: "Delete all conversations" }).click();
    await region.getByText("No stored conversations.").waitFor();
    assert.deepEqual(await storedRows(server, undefined, key), [0, 0]);
  });

  test("a server that stores no transcripts says so", async () => {
    const plain = await startTestServer();
    try {
      const owner = plain.client();
      await owner.login();
      const p = await phoneApp(browser, plain.url, owner);
      await p
        .getByRole("region", { name: "Conversations", exact: true })
        .getByText("This server does not keep conversations: they appear here only while you watch.")
        .waitFor();
      await p.context().close();
    } finally {
      await plain.stop();
    }
  });
});
