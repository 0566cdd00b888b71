import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { generateKeyPair } from "../src/crypto/keys.ts";
import { StayConnected } from "../src/sdk/reconnect.ts";
import { OfferError, PerchConnection } from "../src/sdk/webrtc.ts";
import { engines } from "./support/engines.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { startTestServer, type TestServer, tempDir } from "./support/server.ts";
import { EventLog, spoken, talkerConfig } from "./support/voice.ts";
import { eventually, within } from "./support/webrtc.ts";

/**
 * fleet.md §3: with transcripts stored, the conversation a device had on a drained node goes on
 * where it comes back (here the same node restarted on its data, as a single SQLite node is).
 */
describe("a conversation continues on the next node", () => {
  let upstream: FakeUpstream;
  before(async () => {
    upstream = await startFakeUpstream();
    await engines().transcription?.start?.();
  });
  after(async () => {
    await upstream?.close();
  });

  const node = (dataDir: string, port = 0, store_transcripts = true): Promise<TestServer> =>
    startTestServer({
      dataDir,
      config: {
        ...talkerConfig(upstream.url),
        port,
        node_name: "voice-node",
        voice: { ...talkerConfig(upstream.url).voice, store_transcripts },
        fleet: { max_cpu: 0 },
      },
    });

  for (const storing of [true, false]) {
    test(
      storing ? "with voice.store_transcripts on, the next node's first reply is asked with the earlier turns" : "with it off, a new conversation starts",
      async () => {
        const dataDir = tempDir();
        const first = await node(dataDir, 0, storing);
        const port = first.port;
        const device = new StayConnected({ baseUrl: first.url, keyPair: generateKeyPair() });
        const conn = await device.connected();
        const log = new EventLog(conn);
        upstream.reply({ content: "The kettle is in the kitchen." });
        const asked = upstream.received.length;
        await (await conn.microphone()).say(await spoken("Where did I leave the kettle?"));
        await log.wait((e) => e.label === "turn.metrics", 60_000, "the first turn");
        await first.drain();
        await first.stop();
        const second = await node(dataDir, port, storing);
        try {
          const again = await within(
            eventually(async () => device.current !== conn && device.current, 20_000, "back"),
            25_000,
            "back",
          );
          const log2 = new EventLog(again);
          upstream.reply({ content: "Yes, next to the sink." });
          await (await again.microphone()).say(await spoken("Is it next to the sink?"));
          await log2.wait((e) => e.label === "turn.metrics", 60_000, "the turn on the next node");
          const messages = upstream.received.slice(asked).at(-1)!.body.messages as Array<{ role: string; content: string }>;
          const said = messages.filter((m) => m.role !== "system").map((m) => `${m.role}: ${m.content}`);
          if (storing) {
            assert.equal(said.length, 3, JSON.stringify(said));
            assert.match(said[0]!, /^user: .*kettle/i);
            assert.equal(said[1], "assistant: The kettle is in the kitchen.");
            assert.match(said[2]!, /^user: .*sink/i);
          } else {
            assert.equal(said.length, 1, JSON.stringify(said));
          }
        } finally {
          await device.close();
          await second.stop();
        }
      },
    );
  }

  test("fleet.max_conversations: a node with as many conversations is full, and the device already connected is still answered", async () => {
    const s = await startTestServer({ config: { ...talkerConfig(upstream.url), fleet: { max_conversations: 1, max_cpu: 0 } } });
    try {
      const device = new StayConnected({ baseUrl: s.url, keyPair: generateKeyPair() });
      const conn = await device.connected();
      await eventually(async () => (await s.request("/readyz")).status === 503, 5_000, "full with one conversation");
      assert.deepEqual(await (await s.request("/readyz")).json(), { status: "full" });
      const refused = await PerchConnection.connect({ baseUrl: s.url, keyPair: generateKeyPair() }).then(
        (c) => {
          c.close();
          return undefined;
        },
        (e: unknown) => e,
      );
      assert.ok(refused instanceof OfferError && refused.code === "NODE_FULL", String(refused));
      const log = new EventLog(conn);
      upstream.reply({ content: "Still here." });
      await (await conn.microphone()).say(await spoken("Are you still there?"));
      const metrics = await log.wait((e) => e.label === "turn.metrics", 60_000, "the turn on a full node");
      assert.equal(JSON.parse(metrics.text!).interrupted, false);
      assert.ok(log.all.some((e) => e.type === "TEXT_DONE" && e.label === "assistant.text" && e.text === "Still here."));
      await device.close();
    } finally {
      await s.stop();
    }
  });

  test("fleet.drain_timeout_s: a reply still going at the timeout is handed over anyway", async () => {
    const s = await startTestServer({ config: { ...talkerConfig(upstream.url), fleet: { drain_timeout_s: 1, max_cpu: 0 } } });
    try {
      const device = new StayConnected({ baseUrl: s.url, keyPair: generateKeyPair(), livenessMs: 0 });
      const conn = await device.connected();
      const log = new EventLog(conn);
      upstream.reply({ content: LONG });
      await (await conn.microphone()).say(await spoken("Tell me everything."));
      await log.wait((e) => e.label === "assistant.audio" && e.type === "BOS", 60_000, "the reply's audio");
      const started = performance.now();
      await s.drain();
      const took = performance.now() - started;
      assert.ok(
        log.all.some((e) => e.label === "node.reconnect"),
        "handed over at the timeout",
      );
      assert.ok(!log.all.some((e) => e.label === "turn.metrics"), "the long reply had not ended");
      assert.ok(took >= 900 && took < 10_000, `drained in ${took} ms`);
      await device.close();
    } finally {
      await s.stop();
    }
  });
});

const LONG =
  "The first thing to know is that the sky is blue. The second thing is that grass is green. The third thing is that snow is white. The fourth thing is that coal is black. The fifth thing is that the sea is deep.";
