/**
 * Voice conversations within bounds (issue 22 §2 and §3), end to end: a real server, devices on
 * real WebRTC peers, the embedded engines, and a real HTTP model server.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { engines, warmRecogniser } from "./support/engines.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { type EventLog, spoken, talkerConfig, voiceDevice } from "./support/voice.ts";

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

/**
 * What this process holds after a full collection: the heap and the buffers outside it. V8 frees
 * array buffers' memory on a sweeper thread after the collection, so a figure read at once may
 * still count buffers already dead (seen: 6 MB more, gone a moment later): collect, let the
 * sweeper finish, collect again.
 */
async function held(): Promise<number> {
  gc();
  await new Promise((r) => setTimeout(r, 50));
  gc();
  const m = process.memoryUsage();
  return m.heapUsed + m.arrayBuffers;
}

const MB = 1024 * 1024;
const MAX_TURN_MS = 5_000;

describe("voice conversations within bounds", { skip: engines().transcription ? false : "no transcription engine" }, () => {
  let upstream: FakeUpstream;
  let server: TestServer;
  const device = () => voiceDevice(server);

  const metricsOf = (log: EventLog, n: number) =>
    JSON.parse(log.all.find((s) => s.stream === `out-${n}` && s.label === "turn.metrics")!.text!) as Record<string, unknown>;

  before(async () => {
    await warmRecogniser();
    upstream = await startFakeUpstream();
    const config = talkerConfig(upstream.url);
    // Turns are cut at 5 s here (30 s by default): the cut is the same code at any length, and a test's utterance need not last 35 s.
    server = await startTestServer({
      config: {
        ...config,
        agents: [{ ...config.agents[0]!, max_tokens: 700 }],
        voice: { ...config.voice, turn: { ...config.voice.turn, max_ms: MAX_TURN_MS } },
      },
    });
  });

  after(async () => {
    await server?.stop();
    await upstream?.close();
  });

  test("a 1 MB reply: cut at max_reply_chars, synthesised only as it plays (memory per conversation bounded), the model call cancelled; another device's reply comes first", {
    timeout: 300_000,
  }, async (t) => {
    const a = await device();
    const b = await device();
    // Closed even when an assertion fails: the long reply would otherwise play on under the next tests.
    t.after(() => {
      a.conn.close();
      b.conn.close();
    });
    // A first turn on each side warms what every turn uses (the engines' buffers, the codecs, the resampler's memory).
    upstream.reply({ content: "Hello there, nice to meet you." });
    await (await a.conn.microphone()).say(await spoken("Hello, who are you?"));
    await a.log.wait((s) => s.stream === "out-1" && s.label === "turn.metrics", 60_000, "the first reply");
    const sentence = "This is one sentence of a reply that goes on and on without an end in sight. ";
    const huge = sentence.repeat(Math.ceil(MB / sentence.length));
    const pieces = huge.match(/[\s\S]{1,4096}/g)!;
    upstream.reply({ chunks: pieces, delayMs: 5 });
    await held();
    const baseline = await held();
    const question = await spoken("Tell me a very long story please.");
    await (await a.conn.microphone()).say(question);
    await a.log.wait((s) => s.stream === "out-2" && s.type === "BOS" && s.label === "assistant.audio", 60_000, "the long reply's audio");
    const cancelled = upstream.received.at(-1)!;
    assert.equal(cancelled.body.max_tokens, 700, "the agent's max_tokens went to the model");
    await cancelled.aborted; // the model call ends once the reply has its 2,000 characters
    // Another device asks while the long reply plays: its reply comes before the long one ends.
    upstream.reply({ content: "Four." });
    await (await b.conn.microphone()).say(await spoken("What is two plus two?"));
    await b.log.wait((s) => s.stream === "out-1" && s.label === "turn.metrics", 60_000, "the other device's reply");
    assert.equal(
      b.log.of("out-1").find((s) => s.type === "TEXT_DONE" && s.label === "assistant.text")?.text,
      "Four.",
      JSON.stringify(b.log.all.map((s) => [s.type, s.stream, s.label, s.text, s.error])),
    );
    assert.ok(!a.log.all.some((s) => s.stream === "out-2" && s.type === "EOS" && s.label === "assistant.audio"), "the long reply was still playing");
    // The long reply has been playing for a while (flite synthesises far faster than real time): what the process holds now.
    let peak = 0;
    const samples: number[] = [];
    for (let i = 0; i < 5; i++) {
      await new Promise((r) => setTimeout(r, 1_000));
      const growth = (await held()) - baseline;
      samples.push(Math.round((growth / MB) * 100) / 100);
      peak = Math.max(peak, growth);
    }
    console.log(JSON.stringify({ growth_mb: samples, ...process.memoryUsage() }));
    const text = a.log.all
      .filter((s) => s.stream === "out-2" && s.type === "TEXT_DELTA")
      .map((s) => s.text)
      .join("");
    assert.ok(text.length <= 2_000 && text.length > 1_900, `the reply's text was cut at 2,000 characters: ${text.length}`);
    console.log(JSON.stringify({ held_growth_mb: Math.round((peak / MB) * 100) / 100, reply_chars: text.length }));
    assert.ok(peak < 5 * MB, `memory per conversation: ${(peak / MB).toFixed(2)} MB`);
  });

  test("a device that stops sending after its question gets its reply", async () => {
    upstream.reply({ content: "It is ten o'clock." });
    const { conn, log } = await device();
    const mic = await conn.microphone();
    await mic.say(await spoken("What time is it now?"));
    // Not a packet more after the last word (push-to-talk, DTX, a muted microphone).
    mic.stop();
    await log.wait((s) => s.stream === "out-1" && s.label === "turn.metrics", 60_000, "the reply");
    const seen = JSON.stringify(log.all.map((s) => [s.type, s.stream, s.label, s.text]));
    assert.equal(log.of("out-1").find((s) => s.type === "TEXT_DONE" && s.label === "assistant.text")?.text, "It is ten o'clock.", seen);
    assert.ok(log.of("out-1").some((s) => s.type === "EOS" && s.label === "assistant.audio" && !s.error));
    conn.close();
  });

  test("an utterance past voice.turn.max_ms is cut there, transcribed and answered, its metrics saying it was cut", async () => {
    upstream.reply({ content: "That was a long question." });
    const { conn, log } = await device();
    const mic = await conn.microphone();
    const story =
      "A small robot lived in a kitchen and helped the family cook their dinner every evening. " +
      "It knew how to cut vegetables and how to boil water for the pasta.";
    const utterance = await spoken(story);
    // Speech goes on for seconds past the cut (which must not become a turn of its own).
    assert.ok(utterance.length / 48 > MAX_TURN_MS + 2_000, `the utterance lasts ${(utterance.length / 48_000).toFixed(1)} s`);
    await mic.say(utterance);
    await log.wait((s) => s.stream === "out-1" && s.label === "turn.metrics", 120_000, "the reply");
    const m = metricsOf(log, 1);
    assert.equal(m.turn_cut, true);
    const transcript = log.of("in-1").find((s) => s.type === "TEXT_DONE")!.text!;
    assert.match(transcript, /kitchen/i);
    assert.equal(log.of("out-1").find((s) => s.type === "TEXT_DONE" && s.label === "assistant.text")?.text, "That was a long question.");
    assert.ok(!log.all.some((s) => s.stream === "in-2"), "the speech after the cut is not a turn of its own");
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    assert.doesNotMatch(metrics, /perch_voice_turns_total\{result="empty"\} [1-9]/);
    conn.close();
  });
});
