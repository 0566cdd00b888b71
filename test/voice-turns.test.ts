/**
 * The turn logic of a conversation, fast: fake engines, a fake clock, no WebRTC and no sleeps
 * (test/support/fake-voice.ts). The end-to-end tests (voice.test.ts, voice-bounds.test.ts) prove
 * the same paths with a real device, real engines and a real model server.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { AudioRecognition } from "../src/voice/recognition.ts";
import { AHEAD_S } from "../src/voice/reply.ts";
import { FakeClock, pieces, type Rig, rig, settle } from "./support/fake-voice.ts";

/** A question: 600 ms of speech, then the silence that ends the turn. */
async function ask(r: Rig, speechMs = 600): Promise<void> {
  await r.talk(speechMs);
  await r.talk(600, false);
}

/** Moves the clock until turn `n`'s metrics are out (at most `ms` of conversation time). */
async function untilTurn(r: Rig, n: number, ms = 60_000): Promise<Record<string, unknown>> {
  for (let t = 0; t < ms && !r.turnMetrics(n); t += 100) await r.wait(100);
  const m = r.turnMetrics(n);
  assert.ok(m, `turn ${n} finished within ${ms} ms of conversation time; events: ${JSON.stringify(r.events.map((e) => [e.type, e.stream, e.label]))}`);
  return m;
}

describe("voice turns (fake engines, fake clock)", () => {
  test("a question is transcribed, answered and spoken; the events come in the contract's order; metrics name the engines", async () => {
    const r = await rig();
    await ask(r);
    const m = await untilTurn(r, 1);
    assert.deepEqual(
      r.events.map((e) => `${e.type} ${e.stream} ${e.label}`),
      [
        "BOS in-1 user.audio",
        "EOS in-1 user.audio",
        "TEXT_DONE in-1 user.transcript",
        "BOS out-1 assistant.text",
        "TEXT_DELTA out-1 assistant.text",
        // The first sentence is complete with the first delta: its audio starts before the rest of the text.
        "BOS out-1 assistant.audio",
        "TEXT_DELTA out-1 assistant.text",
        "TEXT_DONE out-1 assistant.text",
        "EOS out-1 assistant.audio",
        "TEXT_DONE out-1 turn.metrics",
      ],
    );
    assert.deepEqual(m.engines, { transcription: "fake-stt", speech: "fake-tts" });
    assert.equal(m.interrupted, false);
    assert.equal(m.turn_cut, false);
    assert.equal(m.reply_cut, false);
    for (const stage of ["end_of_speech", "transcription", "first_token", "first_audio", "speech_to_audio"]) assert.equal(typeof m[stage], "number", stage);
    assert.ok(r.stt.turns[0]!.samples > 0.6 * 16_000, "the transcription heard the whole question, from its onset");
    assert.ok(r.stt.turns[0]!.pauses >= 1, "the transcription was told of the pause before the end of the turn");
    assert.deepEqual(
      r.observed.map((e) => e.role),
      ["user", "assistant"],
    );
    const text = await r.metrics.getSingleMetricAsString("perch_voice_stage_seconds");
    assert.match(text, /stage="transcription",engine="fake-stt"/);
    assert.match(text, /stage="first_audio",engine="fake-tts"/);
    r.close();
  });

  test("a device that stops sending after its question (push-to-talk, DTX, a muted microphone) gets its reply", async () => {
    const r = await rig();
    await r.talk(600);
    // Not a packet more: the end of turn comes from the conversation's clock.
    await r.wait(1_000);
    assert.ok(
      r.of("in-1").some((e) => e.type === "EOS"),
      "the turn ended without packets",
    );
    const m = await untilTurn(r, 1);
    assert.equal(m.turn_cut, false);
    assert.ok(r.of("out-1").some((e) => e.label === "assistant.audio" && e.type === "EOS" && !e.error));
    // The next question, after the device resumes, is a turn of its own.
    await ask(r);
    await untilTurn(r, 2);
    r.close();
  });

  test("a turn longer than max_ms is cut there, transcribed and answered; the speech going on after the cut is not a turn", async () => {
    const r = await rig({ turn: { max_ms: 5_000 } });
    await r.talk(7_000);
    await r.talk(600, false);
    const m = await untilTurn(r, 1);
    assert.equal(m.turn_cut, true);
    assert.ok(
      r.of("out-1").some((e) => e.label === "assistant.audio" && e.type === "EOS" && !e.error),
      "the cut turn was answered",
    );
    assert.equal(r.stt.turns.length, 1, "no second turn for the speech after the cut");
    assert.ok(Math.abs(r.stt.turns[0]!.samples - 5 * 16_000) <= 0.1 * 16_000, `the first 5 s transcribed: ${r.stt.turns[0]!.samples}`);
    const counted = await r.metrics.getSingleMetricAsString("perch_voice_turns_total");
    assert.match(counted, /result="answered"\} 1/);
    r.close();
  });

  test("a reply longer than max_reply_chars is cut: the rest is not spoken, the model call ends, the history keeps what was said", async () => {
    const r = await rig({ max_reply_chars: 300 });
    const sentence = "This sentence is one of very many in a reply that does not end. ";
    let first = true;
    r.model.script = () => {
      if (!first) return pieces(["Fine."]);
      first = false;
      return (async function* () {
        for (let i = 0; i < 100_000; i++) yield sentence; // about 6 MB if it were all read
      })();
    };
    await ask(r);
    const m = await untilTurn(r, 1, 120_000);
    assert.equal(m.reply_cut, true);
    const call = r.model.calls[0]!;
    assert.ok(call.signal.aborted, "the model call was cancelled");
    assert.ok(call.pieces < 10, `the model's text was not read on: ${call.pieces} pieces`);
    const said = r.of("out-1").find((e) => e.type === "TEXT_DONE" && e.label === "assistant.text")!.text!;
    assert.ok(said.length <= 300 && said.length > 250, `what was said: ${said.length} characters`);
    const deltas = r
      .of("out-1")
      .filter((e) => e.type === "TEXT_DELTA")
      .map((e) => e.text)
      .join("");
    assert.ok(deltas.length <= 300, "no text beyond the limit went out");
    assert.equal(r.tts.requests.map((q) => q.text).join(" ").length <= 300, true, "nothing beyond the limit was synthesised");
    await ask(r);
    await untilTurn(r, 2);
    const history = r.model.calls[1]!.messages;
    assert.equal(history[1]!.role, "assistant");
    assert.equal(history[1]!.content, said, "the history keeps what was said");
    r.close();
  });

  test("synthesis runs at most a few seconds ahead of playback, however long the reply", async () => {
    const r = await rig({ max_reply_chars: 20_000 });
    const sentence = "Here is one more sentence of a long story told slowly. ";
    r.model.script = () => pieces(Array.from({ length: 300 }, () => sentence)); // 16,500 characters: about 16 minutes of audio
    await ask(r);
    let worst = 0;
    for (let t = 0; t < 60_000; t += 100) {
      await r.wait(100);
      const played = (r.frames * 20) / 1000;
      if (played > 0) worst = Math.max(worst, r.tts.pulledSeconds - played);
    }
    assert.ok(r.frames > 2_000, `the reply plays: ${r.frames} frames`);
    // Pulled ahead of what was sent: at most AHEAD_S, a chunk, the sentence gap and the playout's lead.
    assert.ok(worst <= AHEAD_S + 0.5, `synthesis ran ${worst.toFixed(2)} s ahead of playback`);
    assert.ok(r.tts.requests.length < 40, `sentences are requested as playback goes (at most one ahead): ${r.tts.requests.length}`);
    r.close();
  });

  test("barge-in stops the reply, aborts the synthesis and the model call, and keeps only what was heard", async () => {
    const r = await rig();
    const long = Array.from({ length: 20 }, (_, i) => `Sentence number ${i + 1} of a long reply. `);
    let first = true;
    r.model.script = () => {
      if (!first) return pieces(["Sure."]);
      first = false;
      return (async function* () {
        yield* long;
        await new Promise(() => {}); // the model writes on for ever
      })();
    };
    await ask(r);
    // Into its first sentence (2.04 s): what was heard then is no edge between two sentences.
    for (let t = 0; t < 30_000 && r.frames < 80; t += 100) await r.wait(100);
    assert.ok(r.frames >= 80, "the reply is playing");
    const inFlight = r.tts.requests.at(-1)!;
    // The question over it: the reply ends on its first words, while it is spoken (voice.md §7).
    await r.talk(600);
    const frames = r.frames;
    await r.talk(600, false);
    await untilTurn(r, 1);
    const end = r.of("out-1").find((e) => e.type === "EOS" && e.label === "assistant.audio")!;
    assert.equal(end.error?.code, "interrupted");
    assert.equal(r.turnMetrics(1)!.interrupted, true);
    assert.ok(r.model.calls[0]!.signal.aborted, "the model call was aborted");
    assert.ok(inFlight.signal.aborted, "the synthesis in flight was aborted");
    await untilTurn(r, 2);
    const heard = r.model.calls[1]!.messages[1]!.content as string;
    // What played: every sentence whose audio played whole, then words of the one playing; never a
    // sentence synthesised ahead and queued whose audio had not begun. 60 ms a character at 24 kHz,
    // played at 48 kHz; a frame's slack either way for the resampler's edges.
    const played = frames * 960;
    const slack = 960;
    const whole: string[] = [];
    const begun: string[] = [];
    let at = 0;
    for (const { text } of r.tts.requests.filter((q) => q.text.startsWith("Sentence"))) {
      const samples = Math.round((text.length * 60 * 24_000) / 1000) * 2;
      if (played - slack >= at + samples) whole.push(text);
      if (played + slack > at) begun.push(text);
      at += samples;
    }
    assert.ok(r.tts.requests.length > begun.length, "sentences were queued beyond what played");
    assert.ok(heard.startsWith(whole.join(" ")), `heard ${JSON.stringify(heard)}: the sentences played whole`);
    assert.ok(begun.join(" ").startsWith(heard), `heard ${JSON.stringify(heard)}: nothing beyond the sentence playing`);
    const assistant = r.observed.find((e) => e.role === "assistant" && e.turn === 1);
    assert.deepEqual(assistant?.role === "assistant" && { interrupted: assistant.interrupted, text: assistant.text }, { interrupted: true, text: heard });
    r.close();
  });

  test("with barge-in off, speech during a reply is ignored until it ends", async () => {
    const r = await rig({ barge_in: false });
    r.model.script = () => pieces(Array.from({ length: 10 }, (_, i) => `Sentence ${i + 1} of a reply. `));
    await ask(r);
    for (let t = 0; t < 30_000 && r.frames < 50; t += 100) await r.wait(100);
    await ask(r);
    const m = await untilTurn(r, 1);
    assert.equal(m.interrupted, false);
    assert.equal(r.stt.turns.length, 1, "the speech during the reply was no turn");
    r.close();
  });

  test("failures end the turn with the contract's events; the next turn is answered", async () => {
    const r = await rig();
    r.stt.answer = () => Promise.reject(new Error("recogniser down"));
    await ask(r);
    assert.equal((await untilTurn(r, 1)).interrupted, false);
    assert.match(r.of("out-1").find((e) => e.type === "EOS" && e.label === "assistant.text")!.error!.message, /recognition failed: recogniser down/);
    r.stt.answer = () => "What time is it?";
    r.tts.fail = () => new Error("speech provider down");
    await ask(r);
    await untilTurn(r, 2);
    const failed = r.of("out-2").filter((e) => e.type === "EOS");
    assert.ok(
      failed.some((e) => e.error?.code === "failed" && /speech provider down/.test(e.error.message)),
      JSON.stringify(failed),
    );
    r.tts.fail = () => undefined;
    r.tts.sampleRate = 96_000;
    await ask(r);
    await untilTurn(r, 3);
    assert.ok(
      r.of("out-3").some((e) => e.type === "EOS" && /96000 Hz/.test(e.error?.message ?? "")),
      "an impossible sample rate fails the reply",
    );
    r.tts.sampleRate = 24_000;
    await ask(r);
    await untilTurn(r, 4);
    assert.ok(r.of("out-4").some((e) => e.type === "EOS" && e.label === "assistant.audio" && !e.error));
    const counted = await r.metrics.getSingleMetricAsString("perch_voice_turns_total");
    assert.match(counted, /result="failed"\} 3/);
    r.close();
  });

  test("a transcription that cannot open a turn: that speech is not heard, the next one is", async () => {
    const r = await rig();
    r.stt.refuse = new Error("no capacity");
    await ask(r);
    await r.wait(2_000);
    assert.deepEqual(r.events, [], "no turn began");
    r.stt.refuse = undefined;
    await ask(r);
    await untilTurn(r, 1);
    r.close();
  });

  test("closing the conversation aborts the turn in flight and sends nothing more", async () => {
    const r = await rig();
    let release: (text: string) => void = () => {};
    r.stt.answer = () => new Promise((resolve) => (release = resolve));
    await ask(r);
    r.close();
    assert.ok(r.stt.turns[0]!.o.signal.aborted, "the transcription was aborted");
    const before = r.events.length;
    release("too late");
    await r.wait(5_000);
    assert.equal(r.events.length, before);
  });
});

describe("recognition: a detector that falls behind", () => {
  test("audio beyond 4 s waiting for the detector is dropped (counted), not queued; the detector then gets what was kept in one push", async () => {
    const clock = new FakeClock();
    const pushes: number[] = [];
    let release: () => void = () => {};
    const vad = {
      push: async (pcm: Int16Array) => {
        pushes.push(pcm.length);
        if (pushes.length === 1) await new Promise<void>((resolve) => (release = resolve));
        return [];
      },
      flush: () => [],
    };
    const recognition = new AudioRecognition({
      vad,
      turn: { silence_ms: 400, finished_silence_ms: 250, preemptive_after_ms: 150, max_ms: 30_000 },
      clock,
      hooks: { speechStarted: () => undefined, silenceNeeded: () => 400, paused: () => {}, resumed: () => {}, speechEnded: () => {} },
      warn: (what) => assert.fail(what),
    });
    // 6 s of speech in 20 ms pieces while the detector is stuck on the first.
    const piece = () => new Int16Array(320).fill(3000);
    for (let i = 0; i < 300; i++) recognition.hear(piece());
    // The first piece is with the detector; 4 s (200 pieces) wait; the other 99 are dropped.
    assert.equal(recognition.takeDropped(), 99 * 320);
    assert.equal(recognition.takeDropped(), 0);
    release();
    await settle();
    assert.deepEqual(pushes, [320, 200 * 320]);
    recognition.close();
  });
});
