import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { generateKeyPair } from "../src/crypto/keys.ts";
import { StayConnected } from "../src/sdk/reconnect.ts";
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
});
