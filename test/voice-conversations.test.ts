import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import { encodeKey, generateKeyPair } from "../src/crypto/keys.ts";
import { PerchClient } from "../src/sdk/client.ts";
import { storedRows } from "./support/conversations.ts";
import { engines } from "./support/engines.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { freshPostgresDatabase, startTestServer, TEST_DATABASE_URL, type TestServer, tempDir } from "./support/server.ts";
import { EventStream } from "./support/sse.ts";
import { heardFor, spoken, talkerConfig, voiceDevice } from "./support/voice.ts";
import { eventually } from "./support/webrtc.ts";

type Entry = { conversation_id: string; turn: number; role: string; text: string; at_unix_ms: number; interrupted?: boolean };

const LONG =
  "The first thing to know is that the sky is blue. The second thing is that grass is green. The third thing is that snow is white. The fourth thing is that coal is black.";

/**
 * A device converses over real WebRTC with node A while its phone watches from node B; both nodes
 * share one PostgreSQL database, transcripts are stored.
 */
describe("a device's conversation reaches its phone on another node", { skip: TEST_DATABASE_URL ? false : "PERCH_TEST_DATABASE_URL is not set" }, () => {
  let upstream: FakeUpstream;
  let databaseUrl: string;
  const dataDir = tempDir();
  let a: TestServer;
  let b: TestServer;
  const keyPair = generateKeyPair();
  const deviceKey = encodeKey(keyPair.publicKey);
  let phone: PerchClient;
  let stream: EventStream;

  const node = async (nodeName: string) =>
    startTestServer({
      dataDir,
      config: {
        ...talkerConfig(upstream.url),
        database_url: databaseUrl,
        node_name: nodeName,
        voice: { ...talkerConfig(upstream.url).voice, store_transcripts: true },
      },
    });

  const device = (server: TestServer) => voiceDevice(server, { keyPair });

  const entries = () => stream.events("conversation").map((e) => e.data as Entry);

  before(async () => {
    upstream = await startFakeUpstream();
    // The recogniser's and the voice detector's models loaded before the first turn (a loaded machine takes long).
    await engines().transcription?.start?.();
    databaseUrl = await freshPostgresDatabase();
    a = await node("node-a");
    b = await node("node-b");
    const owner = new PerchClient({ baseUrl: a.url, keyPair });
    await owner.login();
    phone = b.client();
    await phone.login({ deviceToken: (await owner.createDeviceToken()).token });
    stream = await EventStream.must(b.url, phone.accessToken);
  });
  after(async () => {
    stream?.close();
    await a?.stop();
    await b?.stop();
    await upstream?.close();
    rmSync(dataDir, { recursive: true, force: true });
  });

  test("the user's and the device's words arrive in order; a barge-in's reply carries only what was spoken, interrupted", async () => {
    upstream.reply({ chunks: LONG.split(/(?<=\. )/) });
    const { conn, log } = await device(a);
    const mic = await conn.microphone();
    await mic.say(await spoken("Play some music in the living room."));
    await log.wait((s) => s.stream === "out-1" && s.type === "BOS" && s.label === "assistant.audio", 30_000, "the reply's audio");
    // Interrupted once the device has heard some of it: on a loaded machine the audio can start late.
    await heardFor(conn, 1_500);
    upstream.reply({ content: "Alright." });
    await mic.say(await spoken("Call my mother tomorrow morning."));
    await log.wait((s) => s.stream === "out-2" && s.label === "turn.metrics", 30_000, "turn 2");
    const got = await stream.until((s) => s.events("conversation").length >= 4 && entries(), "four entries");
    const said = (stream: string, label: string) => log.all.find((s) => s.stream === stream && s.type === "TEXT_DONE" && s.label === label)!.text!;
    assert.deepEqual(
      got.map((e) => [e.turn, e.role, e.text, e.interrupted]),
      [
        [1, "user", said("in-1", "user.transcript"), undefined],
        [1, "assistant", said("out-1", "assistant.text"), true],
        [2, "user", said("in-2", "user.transcript"), undefined],
        [2, "assistant", "Alright.", undefined],
      ],
    );
    const spokenText = got[1]!.text;
    assert.ok(spokenText.length > 0 && spokenText.length < LONG.length, `spoken: ${spokenText}`);
    assert.match(got[2]!.text, /mother|morning/i);
    assert.equal(new Set(got.map((e) => e.conversation_id)).size, 1, "one connection, one conversation");
    for (let i = 1; i < got.length; i++) assert.ok(got[i]!.at_unix_ms >= got[i - 1]!.at_unix_ms);
    conn.close();
  });

  test("stored: the list and the entries after a reconnect and after a node restart", async () => {
    const first = entries();
    // The device comes back, this time to node B, and says one more thing.
    upstream.reply({ content: "It is noon." });
    const { conn, log } = await device(b);
    const mic = await conn.microphone();
    await mic.say(await spoken("What time is it?"));
    await log.wait((s) => s.stream === "out-1" && s.label === "turn.metrics", 30_000, "the turn");
    const all = await stream.until((s) => s.events("conversation").length >= 6 && entries(), "the second conversation's entries");
    const second = all.slice(4);
    assert.deepEqual(
      second.map((e) => [e.turn, e.role]),
      [
        [1, "user"],
        [1, "assistant"],
      ],
    );
    assert.notEqual(second[0]!.conversation_id, first[0]!.conversation_id, "a new connection is a new conversation");
    conn.close();

    const check = async (server: TestServer) => {
      const c = new PerchClient({ baseUrl: server.url, keyPair: phone.keyPair });
      c.accessToken = phone.accessToken;
      const page = await c.request<{ stored: boolean; items: Array<{ id: string; turns: number; last_text: string; ended_at_unix_ms?: number }> }>(
        "GET",
        "/side-control/conversations",
      );
      assert.equal(page.stored, true);
      assert.deepEqual(
        page.items.map((i) => [i.id, i.turns, i.last_text]),
        [
          [second[0]!.conversation_id, 1, "It is noon."],
          [first[0]!.conversation_id, 2, "Alright."],
        ],
      );
      assert.ok(page.items[1]!.ended_at_unix_ms, "the first connection's end is recorded");
      for (const [id, live] of [
        [first[0]!.conversation_id, first.slice(0, 4)],
        [second[0]!.conversation_id, second],
      ] as const) {
        const stored = await c.request<{ items: Array<Entry & { metrics?: { interrupted?: boolean; transcription?: number } }> }>(
          "GET",
          `/side-control/conversations/${id}`,
        );
        assert.deepEqual(
          stored.items.map(({ metrics: _, ...e }) => e),
          live,
          "stored as they went live",
        );
        // Each stored entry carries its turn's metrics (voice.md §8): the interrupted reply's say so.
        for (const e of stored.items) {
          assert.equal(typeof e.metrics?.transcription, "number", `turn ${e.turn} ${e.role}: ${JSON.stringify(e.metrics)}`);
          if (e.interrupted) assert.equal(e.metrics?.interrupted, true);
        }
      }
    };
    // The entries are written in the background: read once they are all there.
    await eventually(async () => ((await storedRows(a, databaseUrl, deviceKey))[1] === 6 ? true : undefined), 10_000, "six stored entries");
    await check(a);
    // Node A restarts on the same database.
    await a.stop();
    a = await node("node-a");
    await check(a);
    assert.deepEqual(await storedRows(a, databaseUrl, phone.publicKey), [0, 0], "nothing stored for the phone's own key");
    assert.deepEqual(await storedRows(a, databaseUrl, deviceKey), [2, 6]);
  });
});
