import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { wavFile } from "../src/audio/samples.ts";
import { encodeKey, generateKeyPair, type KeyPair } from "../src/crypto/keys.ts";
import { assertFails, perch } from "./support/cli.ts";
import { engines, warmRecogniser } from "./support/engines.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { startTestServer, type TestServer, tempDir } from "./support/server.ts";
import { wordErrorRate } from "./support/speech.ts";
import { heardFor, resample, spoken, talkerConfig, voiceDevice } from "./support/voice.ts";

const ANSWER = "It is sunny and warm today. Is there anything else you would like to know?";
const QUESTION = "What is the weather like today?";

describe("voice conversations", () => {
  let upstream: FakeUpstream;
  let server: TestServer;
  const device = (o: { keyPair?: KeyPair } = {}) => voiceDevice(server, o);

  /** The words of what the device heard, recognised by the server's own recogniser. */
  async function recognise(pcm48: Int16Array): Promise<string> {
    const pcm16 = await resample(pcm48, 48_000, 16_000);
    const transcript = await engines().transcription!.transcribe({ audio: wavFile(pcm16, 16_000) });
    return transcript.text;
  }

  before(async () => {
    await warmRecogniser();
    upstream = await startFakeUpstream();
    server = await startTestServer({
      config: talkerConfig(upstream.url),
    });
  });

  after(async () => {
    await server?.stop();
    await upstream?.close();
  });

  test("a spoken question gets an audible reply that says the model's answer; the events come in order; history carries across turns", async () => {
    upstream.reply({ chunks: ["It is sunny ", "and warm today. Is there anything ", "else you would like to know?"] });
    const { conn, log } = await device();
    conn.speaker.record();
    const mic = await conn.microphone();
    await mic.say(await spoken(QUESTION));
    const metrics = await log.wait((s) => s.stream === "out-1" && s.label === "turn.metrics", 30_000, "turn 1's metrics");
    // The reply's audio, as the device heard it, says the scripted answer.
    await sleep(300);
    const heard = await recognise(conn.speaker.take());
    assert.ok(wordErrorRate(ANSWER, heard) < 0.5, `heard: ${heard}`);

    const sequences = log.all.map((s) => s.sequence);
    assert.deepEqual(
      sequences,
      sequences.map((_, i) => i + 1),
      "sequence numbers count up from 1",
    );
    const shape = log.all.filter((s) => s.type !== "TEXT_DELTA").map((s) => `${s.type} ${s.stream} ${s.label}${s.kind ? ` ${s.kind}` : ""}`);
    assert.deepEqual(shape, [
      "BOS in-1 user.audio AUDIO",
      "EOS in-1 user.audio AUDIO",
      "TEXT_DONE in-1 user.transcript",
      "BOS out-1 assistant.text TEXT",
      "BOS out-1 assistant.audio AUDIO",
      "TEXT_DONE out-1 assistant.text",
      "EOS out-1 assistant.audio AUDIO",
      "TEXT_DONE out-1 turn.metrics",
    ]);
    const transcript = log.all.find((s) => s.label === "user.transcript" && s.type === "TEXT_DONE")!.text!;
    assert.ok(wordErrorRate(QUESTION, transcript) <= 0.4, `transcript: ${transcript}`);
    const deltas = log.all.filter((s) => s.type === "TEXT_DELTA" && s.label === "assistant.text").map((s) => s.text);
    assert.equal(deltas.join(""), ANSWER);
    assert.equal(log.all.find((s) => s.type === "TEXT_DONE" && s.label === "assistant.text")!.text, ANSWER);
    assert.equal(log.all.find((s) => s.type === "BOS" && s.label === "assistant.audio")!.mime, "audio/opus");
    assert.equal(log.all.find((s) => s.type === "EOS" && s.label === "assistant.audio")!.error, undefined);
    const m = JSON.parse(metrics.text!) as Record<string, unknown>;
    for (const k of ["end_of_speech", "transcription", "first_token", "first_audio", "speech_to_audio"]) assert.equal(typeof m[k], "number", k);
    assert.equal(m.interrupted, false);
    assert.deepEqual(m.engines, { transcription: "embedded", speech: "embedded" });
    // The agent ran with its instructions and the transcript, the device as its caller.
    const first = upstream.received.at(-1)!.body;
    assert.deepEqual(first.messages, [
      { role: "system", content: "You speak briefly." },
      { role: "user", content: transcript },
    ]);

    // Turn 2 sees turn 1 in its history.
    upstream.reply({ content: "Done." });
    await mic.say(await spoken("Set a timer for ten minutes."));
    await log.wait((s) => s.stream === "out-2" && s.label === "turn.metrics", 30_000, "turn 2's metrics");
    const second = upstream.received.at(-1)!.body.messages as Array<{ role: string; content: string }>;
    assert.deepEqual(
      second.slice(0, 3).map((m) => [m.role, m.content]),
      [
        ["system", "You speak briefly."],
        ["user", transcript],
        ["assistant", ANSWER],
      ],
    );
    // Turn 2's question is what the server heard in turn 2 (how well it heard is the recogniser's
    // test, and a busy machine may cost words: the history is what is checked here).
    const heard2 = log.all.find((s) => s.stream === "in-2" && s.label === "user.transcript" && s.type === "TEXT_DONE")!.text!;
    assert.deepEqual(second[3], { role: "user", content: heard2 });
    assert.notEqual(heard2, transcript);
    // Metrics of the turns.
    const text = await (await fetch(`${server.url}/metrics`)).text();
    assert.match(text, /perch_voice_turns_total\{result="answered"\} 2/);
    assert.match(text, /perch_voice_stage_seconds_count\{stage="speech_to_audio",engine="embedded"\} 2/);
    assert.match(text, /perch_voice_stage_seconds_count\{stage="transcription",engine="embedded"\} 2/);
    assert.match(text, /perch_voice_conversations 1/);
    conn.close();
  });

  test("a burst of speech shorter than 200 ms starts no turn; a longer one does", async () => {
    const { conn, log } = await device();
    const mic = await conn.microphone();
    const question = await spoken(QUESTION);
    // The loudest 120 ms of the question.
    const window = 48_000 * 0.12;
    let best = 0;
    let bestEnergy = 0;
    for (let at = 0; at + window < question.length; at += 480) {
      let e = 0;
      for (let i = at; i < at + window; i++) e += question[i]! * question[i]!;
      if (e > bestEnergy) [best, bestEnergy] = [at, e];
    }
    const before = upstream.received.length;
    upstream.reply({ content: "Yes." });
    await mic.say(question.slice(best, best + window));
    // A second of the device's own silence keeps the noise and the question apart.
    await mic.say(new Int16Array(48_000));
    await mic.say(question);
    await log.wait((s) => s.stream === "out-1" && s.label === "turn.metrics", 30_000, "the first turn's metrics");
    // The first turn is the question: had the noise started one, the question would be turn 2.
    const transcript = log.all.find((s) => s.stream === "in-1" && s.type === "TEXT_DONE")?.text ?? "";
    assert.ok(wordErrorRate(QUESTION, transcript) <= 0.4, `turn 1 heard: ${transcript}`);
    assert.equal(upstream.received.length, before + 1, "one model request: the question's");
    assert.deepEqual(log.of("in-2"), []);
    conn.close();
  });

  test("barge-in stops the reply, keeps only what was heard in the history, and the new speech is the next turn", async () => {
    // Long enough (about a minute of speech) that it is still playing whenever the barge-in comes.
    const long = Array.from(
      { length: 6 },
      () =>
        "The first thing to know is that the sky is blue. The second thing is that grass is green. The third thing is that snow is white. The fourth thing is that coal is black.",
    ).join(" ");
    upstream.reply({ chunks: long.split(/(?<=\. )/) });
    const { conn, log } = await device();
    const mic = await conn.microphone();
    await mic.say(await spoken("Play some music in the living room."));
    await log.wait((s) => s.stream === "out-1" && s.type === "BOS" && s.label === "assistant.audio", 30_000, "the reply's audio");
    await heardFor(conn, 1_500);
    upstream.reply({ content: "Alright." });
    await mic.say(await spoken("Call my mother tomorrow morning."));
    // The barge-in is decided on the speech's transcript (voice.md §7): a loaded machine's recogniser takes its time.
    const end = await log.wait((s) => s.stream === "out-1" && s.type === "EOS" && s.label === "assistant.audio", 60_000, "the reply's end");
    assert.deepEqual(end.error, { code: "interrupted", message: "" });
    const heardText = log.all.find((s) => s.stream === "out-1" && s.type === "TEXT_DONE" && s.label === "assistant.text")!.text!;
    assert.ok(heardText.length > 0 && heardText.length < long.length, `heard: ${heardText}`);
    assert.ok(long.startsWith(heardText.replace(/\s+/g, " ")) || long.replace(/\s+/g, " ").startsWith(heardText), `heard: ${heardText}`);
    const m1 = JSON.parse((await log.wait((s) => s.stream === "out-1" && s.label === "turn.metrics", 15_000, "turn 1's metrics")).text!) as {
      interrupted: boolean;
    };
    assert.equal(m1.interrupted, true);
    // The barge-in is turn 2, whose request carries the truncated assistant turn.
    await log.wait((s) => s.stream === "out-2" && s.label === "turn.metrics", 30_000, "turn 2");
    const messages = upstream.received.at(-1)!.body.messages as Array<{ role: string; content: string }>;
    assert.deepEqual(messages[2], { role: "assistant", content: heardText });
    assert.match(messages[3]!.content, /mother|morning/i);
    conn.close();
  });

  test("a model failure ends the turn with error events; the next turn works", async () => {
    upstream.reply({ status: 500, error: { message: "the model fell over" } });
    const { conn, log } = await device();
    const mic = await conn.microphone();
    await mic.say(await spoken(QUESTION));
    await log.wait((s) => s.stream === "out-1" && s.label === "turn.metrics", 30_000, "turn 1");
    const out1 = log.of("out-1").map((s) => `${s.type} ${s.label}${s.error ? ` ${s.error.code}` : ""}`);
    assert.deepEqual(out1, ["EOS assistant.text failed", "TEXT_DONE turn.metrics"]);
    upstream.reply({ content: "Four." });
    await mic.say(await spoken(QUESTION));
    await log.wait((s) => s.stream === "out-2" && s.label === "turn.metrics", 30_000, "turn 2");
    assert.equal(log.of("out-2").find((s) => s.type === "TEXT_DONE" && s.label === "assistant.text")?.text, "Four.");
    const text = await (await fetch(`${server.url}/metrics`)).text();
    assert.match(text, /perch_voice_turns_total\{result="failed"\} 1/);
    conn.close();
  });

  test("perch device connect --say speaks a question, prints the conversation and saves the reply it heard", async () => {
    upstream.reply({ chunks: ["It is sunny ", "and warm today. Is there anything ", "else you would like to know?"] });
    const pair = generateKeyPair();
    const dir = tempDir();
    const keyFile = join(dir, "device.json");
    const wav = join(dir, "reply.wav");
    writeFileSync(keyFile, JSON.stringify({ public_key: encodeKey(pair.publicKey), private_key: encodeKey(pair.privateKey) }));
    const r = await perch(
      ["device", "--server", server.url, "--key-file", keyFile, "connect", "--telemetry-interval", "0", "--say", QUESTION, "--reply-wav", wav],
      {},
    );
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /event TEXT_DONE \{"stream":"in-1","label":"user.transcript","text":"[^"]*weather/i);
    assert.match(r.stdout, /event TEXT_DONE \{"stream":"out-1","label":"assistant.text","text":"It is sunny and warm today\./);
    assert.match(r.stdout, /event TEXT_DONE \{"stream":"out-1","label":"turn.metrics","text":\{"end_of_speech":/);
    assert.match(r.stdout, /reply saved/);
    const file = readFileSync(wav);
    assert.equal(file.subarray(0, 4).toString(), "RIFF");
    const rate = file.readUInt32LE(24);
    const samples = new Int16Array(file.buffer.slice(file.byteOffset + 44, file.byteOffset + file.length));
    const heard = await recognise(await resample(samples, rate, 48_000));
    assert.ok(wordErrorRate(ANSWER, heard) < 0.5, `heard: ${heard}`);
    assertFails(await perch(["device", "--server", server.url, "--key-file", keyFile, "connect", "--reply-wav", wav], {}), /--reply-wav needs --say/);
  });

  test("a device whose voice is off gets no reply; switched on mid-connection, its next question is answered and nothing from before", async () => {
    const keyPair = generateKeyPair();
    const key = encodeKey(keyPair.publicKey);
    await server.domain.peers.add(key);
    assert.equal(await server.domain.peers.setVoiceAgent(key, "off"), true);
    const before = upstream.received.length;
    const { conn, log } = await device({ keyPair });
    const mic = await conn.microphone();
    // Voice off: a question, then half a second of the device's own silence so that all of it has arrived.
    await mic.say(await spoken("Play some music in the living room."));
    await mic.say(new Int16Array(24_000));
    // Switched on (the message reaches the live conversation at once in this process; other nodes by the bus).
    assert.equal(await server.domain.peers.setVoiceAgent(key, null), true);
    upstream.reply({ content: "Sunny." });
    await mic.say(await spoken(QUESTION));
    await log.wait((s) => s.stream === "out-1" && s.label === "turn.metrics", 30_000, "the reply after the switch");
    // The first turn is the question after the switch, the only one the model was asked: the one before it was not heard.
    const transcript = log.of("in-1").find((s) => s.type === "TEXT_DONE")?.text ?? "";
    assert.ok(wordErrorRate(QUESTION, transcript) <= 0.4, `turn 1 heard: ${transcript}`);
    assert.equal(log.of("out-1").find((s) => s.type === "TEXT_DONE" && s.label === "assistant.text")?.text, "Sunny.");
    assert.equal(upstream.received.length, before + 1);
    assert.deepEqual(log.of("in-2"), []);
    conn.close();
  });
});
