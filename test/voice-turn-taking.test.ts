/**
 * Turn-taking (voice.md §7), fast: fake engines on a fake clock (test/support/fake-voice.ts). The
 * end of a turn follows its words; the model is asked in the pause and its reply used only when
 * the words stayed the same; speech over a reply pauses it and is a barge-in only with length and
 * words. voice-turn-taking-e2e.test.ts proves the same over WebRTC with real engines.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { ConfigError, loadConfig } from "../src/config/config.ts";
import { PreparedReply } from "../src/voice/preemptive.ts";
import { FakeClock, type FakeTurnTranscription, pieces, type Rig, rig, settle } from "./support/fake-voice.ts";

const MS = 16; // samples of 16 kHz audio in a millisecond

/** Moves the clock until turn `n`'s metrics are out (at most `ms` of conversation time). */
async function untilTurn(r: Rig, n: number, ms = 60_000): Promise<Record<string, unknown>> {
  for (let t = 0; t < ms && !r.turnMetrics(n); t += 20) await r.wait(20);
  const m = r.turnMetrics(n);
  assert.ok(m, `turn ${n} finished; events: ${JSON.stringify(r.events.map((e) => [e.type, e.stream, e.label]))}`);
  return m;
}

/** When (conversation clock) the first event matching was seen; events carry the clock as their timestamp. */
function eventCount(r: Rig, stream: string, label: string, type: string): number {
  return r.events.filter((e) => e.stream === stream && e.label === label && e.type === type).length;
}

/** A model that takes `ms` of the conversation's clock to its first text. */
function slowModel(r: Rig, ms: number, text = ["It is ten o'clock. ", "Anything else?"]): void {
  r.model.script = (call) =>
    (async function* () {
      await new Promise<void>((resolve, reject) => {
        const stop = r.clock.after(ms, resolve);
        call.signal.addEventListener("abort", () => {
          stop();
          reject(call.signal.reason);
        });
      });
      yield* text;
    })();
}

/** Words by how much speech the transcription heard: `parts[i]` once more than `i` × `stepMs` of speech was heard. */
function wordsBySpeech(r: Rig, stepMs: number, parts: string[]): void {
  r.stt.words = (t: FakeTurnTranscription) => parts[Math.min(parts.length - 1, Math.floor(t.loud / (stepMs * MS)))]!;
  r.stt.answer = r.stt.words;
}

describe("end of turn by the words (voice.md §7)", () => {
  test('"set a timer for" + 700 ms + "twenty minutes" is one turn, answered once, for the whole command', async () => {
    const r = await rig();
    wordsBySpeech(r, 900, ["Set a timer for", "Set a timer for twenty minutes."]);
    await r.talk(800);
    await r.talk(700, false);
    assert.equal(r.model.calls.length, 1, "asked in the pause");
    await r.talk(300);
    assert.ok(r.model.calls[0]!.signal.aborted, "the request was aborted as the speech went on");
    await r.talk(500);
    await r.talk(400, false);
    const m = await untilTurn(r, 1);
    assert.equal(r.stt.turns.length, 1, "one turn");
    assert.equal(eventCount(r, "in-2", "user.audio", "BOS"), 0, "no second turn");
    assert.equal(r.of("in-1").find((e) => e.type === "TEXT_DONE")!.text, "Set a timer for twenty minutes.");
    assert.equal(m.preemptive, "used", "the reply prepared in the last pause was used");
    // The model was asked in the first pause with the words so far; more speech aborted that request.
    const [first, last] = [r.model.calls[0]!, r.model.calls.at(-1)!];
    assert.equal(first.messages.at(-1)!.content, "Set a timer for");
    assert.ok(first.signal.aborted, "the request of the first pause was aborted");
    assert.ok(first.at >= 780 + 150 && first.at < 780 + 700, `asked in the pause: at ${first.at} ms`);
    assert.equal(last.messages.at(-1)!.content, "Set a timer for twenty minutes.");
    assert.equal(r.of("out-1").filter((e) => e.label === "turn.metrics").length, 1);
    const text = await r.metrics.getSingleMetricAsString("perch_voice_preemptive_total");
    assert.match(text, /result="discarded"\} 1/);
    assert.match(text, /result="used"\} 1/);
    r.close();
  });

  test("with the fixed rule (another language), the same pause ends the turn: two turns", async () => {
    const r = await rig({ language: "fr" });
    wordsBySpeech(r, 900, ["Set a timer for", "Set a timer for twenty minutes."]);
    await r.talk(800);
    await r.talk(700, false);
    await r.talk(800);
    await r.talk(400, false);
    await untilTurn(r, 2);
    assert.equal(r.stt.turns.length, 2);
    r.close();
  });

  for (const [words, wanted, key] of [
    ["What time is it?", 250, "finished_silence_ms"],
    ["The weather is nice today.", 400, "silence_ms"],
    ["Tell me about", 1200, "unfinished_silence_ms"],
  ] as const) {
    test(`"${words}" + silence: the turn ends after ${key} (${wanted} ms)`, async () => {
      const r = await rig();
      r.stt.answer = () => words;
      await r.talk(600);
      await r.talk(2_000, false);
      const m = await untilTurn(r, 1);
      const eou = m.end_of_utterance_delay as number;
      assert.ok(eou >= wanted && eou <= wanted + 20, `end_of_utterance_delay ${eou}, want ${wanted}`);
      assert.equal(m.end_of_speech, eou);
      r.close();
    });
  }

  test("the silences are settings: finished_silence_ms 300, unfinished 2000", async () => {
    const r = await rig({ turn: { finished_silence_ms: 300, unfinished_silence_ms: 2_000 } });
    r.stt.answer = () => "Set a timer for";
    await r.talk(600);
    await r.talk(3_000, false);
    const eou = (await untilTurn(r, 1)).end_of_utterance_delay as number;
    assert.ok(eou >= 2_000 && eou <= 2_020, `${eou}`);
    r.close();
  });

  test("a device that stops sending after finished words: the turn ends at finished_silence_ms all the same", async () => {
    const r = await rig();
    await r.talk(600);
    await r.wait(1_000);
    const m = await untilTurn(r, 1);
    assert.ok((m.end_of_utterance_delay as number) <= 270, `${m.end_of_utterance_delay}`);
    r.close();
  });
});

describe("preemptive reply (voice.md §7)", () => {
  test("the model is asked at the first pause; nothing is sent or spoken before the turn ends; its reply is used", async () => {
    const r = await rig();
    // The final transcript takes 100 ms: the prepared reply's text was ready before it (ttft 0).
    r.stt.words = () => "What time is it?";
    r.stt.answer = () => new Promise<string>((resolve) => r.clock.after(100, () => resolve("What time is it?")));
    await r.talk(600);
    await r.talk(200, false);
    assert.equal(r.model.calls.length, 1, "asked in the pause");
    // The rig's audio pushed at t covers (t - 20, t]: the speech ended at 580.
    assert.ok(r.model.calls[0]!.at >= 580 + 150, `after preemptive_after_ms: ${r.model.calls[0]!.at}`);
    assert.equal(r.frames, 0, "nothing spoken before the end of the turn");
    assert.equal(eventCount(r, "out-1", "assistant.text", "BOS"), 0, "no reply event before the end of the turn");
    const m = await untilTurn(r, 1);
    assert.equal(r.model.calls.length, 1, "the prepared reply was the reply");
    assert.equal(m.preemptive, "used");
    assert.equal(m.ttft, 0, "its text was ready when the turn ended");
    r.close();
  });

  test("with a model 300 ms to its first token, the reply starts 300 ms after the pause's start, not after the end of turn", async () => {
    const results: Record<string, number> = {};
    for (const preemptive of [true, false]) {
      const r = await rig({ turn: { preemptive } });
      slowModel(r, 300);
      await r.talk(600);
      await r.talk(1_000, false);
      const m = await untilTurn(r, 1);
      results[String(preemptive)] = m.speech_to_audio as number;
      assert.equal(m.preemptive, preemptive ? "used" : "off");
      r.close();
    }
    // Asked at preemptive_after_ms (150) into the pause: the first token comes at 450 ms, the end of turn at 250 ms.
    assert.ok(results.true! <= 150 + 300 + 30, `speech → audio with the preemptive reply: ${results.true} ms`);
    assert.ok(results.false! >= 250 + 300, `speech → audio without: ${results.false} ms`);
    assert.ok(results.false! - results.true! >= 90, `the preemptive reply gains the pause: ${JSON.stringify(results)}`);
  });

  test("with preemptive_after_ms 50 and that model, the reply starts within finished_silence_ms + 150 ms of the end of speech", async () => {
    const r = await rig({ turn: { preemptive_after_ms: 50 } });
    slowModel(r, 300);
    await r.talk(600);
    await r.talk(1_000, false);
    const m = await untilTurn(r, 1);
    assert.ok((m.speech_to_audio as number) <= 250 + 150, `speech → audio ${m.speech_to_audio} ms`);
    r.close();
  });

  test("a discarded reply leaves no trace: no event, no entry, its tool never released; the words that ended the turn are answered", async () => {
    const r = await rig();
    wordsBySpeech(r, 900, ["Turn the volume down to", "Turn the volume down to three."]);
    const tools: string[] = [];
    r.model.script = (call) =>
      (async function* () {
        const words = call.messages.at(-1)!.content as string;
        yield `Setting it for "${words}". `;
        // As the agent does before a tool runs.
        await call.release?.();
        call.signal.throwIfAborted();
        tools.push(words);
        yield "Done.";
      })();
    await r.talk(800);
    await r.talk(700, false);
    await r.talk(800);
    await r.talk(400, false);
    await untilTurn(r, 1);
    assert.deepEqual(tools, ["Turn the volume down to three."], "only the used reply's tool ran");
    const said = r.events.filter((e) => e.stream.startsWith("out-") && e.label === "assistant.text").map((e) => e.text ?? "");
    assert.ok(!said.some((t) => t.includes('"Turn the volume down to"')), `nothing of the discarded reply went out: ${JSON.stringify(said)}`);
    assert.deepEqual(
      r.observed.map((e) => [e.role, e.text]),
      [
        ["user", "Turn the volume down to three."],
        ["assistant", 'Setting it for "Turn the volume down to three.". Done.'],
      ],
    );
    r.close();
  });

  test("a reply prepared with other words than the turn ended with is discarded and the model asked again", async () => {
    const r = await rig();
    r.stt.words = () => "What time is it";
    r.stt.answer = () => "What time is it in Tokyo?";
    await r.talk(600);
    await r.talk(1_000, false);
    const m = await untilTurn(r, 1);
    assert.equal(m.preemptive, "discarded");
    assert.equal(r.model.calls.length, 2);
    assert.ok(r.model.calls[0]!.signal.aborted);
    assert.equal(r.model.calls[1]!.messages.at(-1)!.content, "What time is it in Tokyo?");
    r.close();
  });

  test("preemptive off: the model is asked only after the end of the turn", async () => {
    const r = await rig({ turn: { preemptive: false } });
    await r.talk(600);
    await r.talk(200, false);
    assert.equal(r.model.calls.length, 0);
    const m = await untilTurn(r, 1);
    assert.equal(m.preemptive, "off");
    assert.equal(r.model.calls.length, 1);
    r.close();
  });
});

describe("false interruptions (voice.md §7)", () => {
  /** A reply of many sentences playing; the user says `words` over it for `ms`. */
  async function over(voice: Record<string, unknown>, words: string, ms: number) {
    const r = await rig(voice);
    const long = Array.from({ length: 12 }, (_, i) => `Sentence number ${i + 1} of the reply. `);
    r.model.script = (call) => pieces(call.messages.length === 1 ? long : ["Sure."]);
    r.stt.answer = (t) => (r.stt.turns.indexOf(t) === 0 ? "Tell me a story." : words);
    r.stt.words = r.stt.answer;
    await r.talk(600);
    await r.talk(400, false);
    for (let t = 0; t < 30_000 && r.frames < 100; t += 20) await r.wait(20);
    assert.ok(r.frames >= 100, "the reply plays");
    const before = r.frames;
    await r.talk(ms);
    const during = r.frames;
    return { r, long, before, during };
  }

  test('"Hm" over a reply: its audio pauses at once, resumes within resume_ms, the reply ends whole, no turn, the history as if nothing happened', async () => {
    const { r, long, before, during } = await over({}, "Hm.", 500);
    // The audio stops at voice activity's first block (frames already sent ahead aside).
    assert.ok(during - before <= 1, `frames sent while the user spoke: ${during - before}`);
    await r.talk(250, false);
    const paused = r.frames;
    await r.talk(350, false);
    assert.ok(r.frames > paused, "resumed within resume_ms (600 ms) of the sound's end");
    const m = await untilTurn(r, 1);
    assert.equal(m.interrupted, false);
    assert.equal(m.false_interruptions, 1);
    assert.equal(r.of("out-1").find((e) => e.type === "EOS" && e.label === "assistant.audio")!.error, undefined);
    assert.equal(r.of("out-1").find((e) => e.type === "TEXT_DONE" && e.label === "assistant.text")!.text, long.join("").trim());
    assert.equal(r.events.filter((e) => e.stream === "in-2").length, 0, "no events for the sound");
    assert.deepEqual(
      r.observed.map((e) => e.role),
      ["user", "assistant"],
    );
    assert.match(await r.metrics.getSingleMetricAsString("perch_voice_false_interruptions_total"), / 1$/m);
    // The next real turn sees the whole reply in its history, and nothing of the "Hm".
    r.stt.answer = () => "Thanks.";
    r.stt.words = r.stt.answer;
    await r.talk(600);
    await r.talk(600, false);
    await untilTurn(r, 2);
    const history = r.model.calls.at(-1)!.messages.map((x) => [x.role, x.content]);
    assert.deepEqual(history, [
      ["user", "Tell me a story."],
      ["assistant", long.join("").trim()],
      ["user", "Thanks."],
    ]);
    r.close();
  });

  test("a long filler (1.5 s of 'hmm yeah okay') and a sound with no words are never a barge-in", async () => {
    for (const words of ["Hmm, yeah, okay.", ""]) {
      const { r } = await over({}, words, 1_500);
      const m = await untilTurn(r, 1);
      assert.equal(m.interrupted, false, JSON.stringify(words));
      assert.equal(m.false_interruptions, 1);
      r.close();
    }
  });

  test("a real word shorter than interruption.min_ms is no barge-in; with min_ms 200 it is", async () => {
    const { r } = await over({}, "No.", 300);
    assert.equal((await untilTurn(r, 1)).interrupted, false);
    r.close();
    const { r: r2 } = await over({ interruption: { min_ms: 200 } }, "No.", 300);
    await r2.talk(600, false);
    assert.equal((await untilTurn(r2, 1)).interrupted, true);
    r2.close();
  });

  test("a real question over a reply is a barge-in as before: audio stopped, the reply interrupted, the question answered", async () => {
    const { r, before, during } = await over({}, "What about tomorrow?", 800);
    assert.ok(during - before <= 1, `frames sent while the user spoke: ${during - before}`);
    await r.talk(600, false);
    assert.equal(eventCount(r, "in-2", "user.audio", "BOS"), 1, "the speech is turn 2");
    const m = await untilTurn(r, 1);
    assert.equal(m.interrupted, true);
    assert.equal(r.of("out-1").find((e) => e.type === "EOS" && e.label === "assistant.audio")!.error?.code, "interrupted");
    await untilTurn(r, 2);
    assert.equal(r.of("in-2").find((e) => e.type === "TEXT_DONE")!.text, "What about tomorrow?");
    r.close();
  });

  test("a recogniser behind: the audio resumes at resume_ms; the words, when they come, still make it a barge-in", async () => {
    const r = await rig();
    const long = Array.from({ length: 12 }, (_, i) => `Sentence number ${i + 1} of the reply. `);
    r.model.script = (call) => pieces(call.messages.length === 1 ? long : ["Sure."]);
    // Every recognition of the speech over the reply takes 2 s.
    r.stt.answer = (t) =>
      r.stt.turns.indexOf(t) === 0 ? "Tell me a story." : new Promise<string>((resolve) => r.clock.after(2_000, () => resolve("Call my mother.")));
    await r.talk(600);
    await r.talk(400, false);
    for (let t = 0; t < 30_000 && r.frames < 100; t += 20) await r.wait(20);
    await r.talk(800);
    await r.talk(250, false);
    const held = r.frames;
    await r.talk(600, false);
    assert.ok(r.frames > held, "the audio resumed without waiting for the words");
    await untilTurn(r, 1);
    assert.equal(r.turnMetrics(1)!.interrupted, true, "the words made it a barge-in");
    await untilTurn(r, 2);
    assert.equal(r.of("in-2").find((e) => e.type === "TEXT_DONE")!.text, "Call my mother.");
    r.close();
  });

  test("min_words 2: one real word is no barge-in", async () => {
    const { r } = await over({ interruption: { min_words: 2 } }, "Wait.", 800);
    await r.talk(600, false);
    assert.equal((await untilTurn(r, 1)).interrupted, false);
    r.close();
  });
});

describe("barge-in timing (voice.md §7: paused on the first frames, ended on the words so far)", () => {
  /** A long reply playing (turn 1); the conversation's clock then. */
  async function playing(voice: Record<string, unknown> = {}) {
    const r = await rig(voice);
    const long = Array.from({ length: 12 }, (_, i) => `Sentence number ${i + 1} of the reply. `);
    r.model.script = (call) => pieces(call.messages.length === 1 ? long : ["Sure."]);
    r.stt.answer = (t) => (r.stt.turns.indexOf(t) === 0 ? "Tell me a story." : "What about tomorrow?");
    r.stt.words = r.stt.answer;
    await r.talk(600);
    await r.talk(400, false);
    for (let t = 0; t < 30_000 && r.frames < 100; t += 20) await r.wait(20);
    assert.ok(r.frames >= 100, "the reply plays");
    return r;
  }

  /** 20 ms blocks of audio; for each, the clock after it, the frames sent and the events out so far. */
  async function blocks(r: Rig, ms: number, loud = true): Promise<Array<{ t: number; frames: number; events: number }>> {
    const out: Array<{ t: number; frames: number; events: number }> = [];
    for (let t = 0; t < ms; t += 20) {
      r.conversation.hear(new Int16Array(320).fill(loud ? 8000 : 0));
      await r.clock.advance(20);
      out.push({ t: r.clock.now(), frames: r.frames, events: r.events.length });
    }
    return out;
  }

  const interruptedAt = (r: Rig) => r.of("out-1").find((e) => e.type === "EOS" && e.label === "assistant.audio");

  test("voice activity's first block pauses the reply (no frame after it); a noise shorter than min_speech_ms resumes 150 ms after it, no turn, nothing counted", async () => {
    const r = await playing();
    const before = r.frames;
    const noise = await blocks(r, 100);
    // The onset is the first block: nothing is sent once it was heard (frames sent ahead were sent before).
    assert.equal(noise[0]!.frames - before, 0, `frames sent in the onset's block: ${noise[0]!.frames - before}`);
    assert.equal(noise.at(-1)!.frames, noise[0]!.frames, "paused while the sound lasts");
    const quiet = await blocks(r, 300, false);
    // The detector hears the noise end at the first quiet block; the reply goes on 150 ms later (not before).
    const end = quiet[0]!.t;
    const resumed = quiet.find((b) => b.frames > noise.at(-1)!.frames)!;
    // (The first quiet block is heard at end − 20: the resume is due at end + 130, in the block that ends at end + 140.)
    assert.equal(resumed.t - end, 140, `resumed ${resumed.t - end} ms after the first quiet block`);
    const m = await untilTurn(r, 1);
    assert.equal(m.interrupted, false);
    assert.equal(m.false_interruptions, 0, "a noise that is no speech is no false interruption");
    assert.equal(r.stt.turns.length, 1, "no transcription for the noise");
    assert.equal(r.events.filter((e) => e.stream === "in-2").length, 0);
    r.close();
  });

  test("a device that stops sending during an onset: the reply goes on (the onset ends as a noise), no turn", async () => {
    const r = await playing();
    const paused = (await blocks(r, 100)).at(-1)!.frames;
    await r.wait(1_000);
    assert.ok(r.frames > paused, "resumed without any more audio");
    assert.equal(r.stt.turns.length, 1);
    r.close();
  });

  test("a word's first syllable and a dip before the next: the reply stays paused throughout (no flicker)", async () => {
    const r = await playing();
    const paused = (await blocks(r, 60))[0]!.frames;
    await blocks(r, 60, false);
    await blocks(r, 600);
    assert.equal(r.frames, paused, "nothing sent between the syllables");
    r.close();
  });

  test("a question over a reply ends it on its words so far: EOS interrupted 400 ms after the onset, the user still speaking; the question is the next turn", async () => {
    const r = await playing();
    // The rig's audio heard at t covers (t - 20, t]: the first block's sound began 20 ms before it is heard.
    const onset = r.clock.now() - 20;
    // What the recogniser has heard grows with the speech; the final transcript is the whole question.
    wordsBySpeech(r, 300, ["", "What", "What about", "What about tomorrow?"]);
    r.stt.answer = (t) => (r.stt.turns.indexOf(t) === 0 ? "Tell me a story." : "What about tomorrow?");
    const speech = await blocks(r, 2_000);
    const eos = interruptedAt(r);
    assert.equal(eos?.error?.code, "interrupted", "the reply ended as interrupted while the user spoke");
    // When: the first block after which the EOS was out (events are counted per block).
    const at = speech.find((b) => b.events > r.events.indexOf(eos!))!.t - onset;
    // Asked first 100 ms before min_ms (no words yet), at min_ms (400: "What about", sure), and again
    // 100 ms later on more audio while the user speaks: heard again, the reply ends then.
    assert.ok(at >= 500 && at <= 520, `EOS interrupted ${at} ms after the onset`);
    assert.equal(r.stt.turns[1]!.askedSure, 2, "sure at min_ms");
    assert.equal(r.stt.turns[1]!.asked, 3, "and heard again 100 ms later");
    assert.equal(eventCount(r, "in-2", "user.audio", "BOS"), 1, "the speech is turn 2 from then");
    assert.ok(speech.at(-1)!.events > r.events.indexOf(eos!), "while the user was still speaking");
    await r.talk(600, false);
    await untilTurn(r, 2);
    assert.equal(r.of("in-2").find((e) => e.type === "TEXT_DONE")!.text, "What about tomorrow?");
    assert.equal(r.turnMetrics(1)!.interrupted, true);
    assert.deepEqual(
      r.model.calls.at(-1)!.messages.map((x) => x.role),
      ["user", "assistant", "user"],
      "the heard part of the reply, then the question",
    );
    r.close();
  });

  test("a pause between words at min_ms: the words are judged again once the speech goes on, and end the reply while it lasts", async () => {
    const r = await playing();
    await blocks(r, 300);
    // Quiet across min_ms (400 ms), shorter than the silence that ends speech.
    await blocks(r, 160, false);
    const speech = await blocks(r, 1_000);
    const eos = interruptedAt(r);
    assert.equal(eos?.error?.code, "interrupted");
    assert.ok(speech.at(-1)!.events > r.events.indexOf(eos!), "ended while the user was still speaking");
    r.close();
  });

  test("a hum heard as sure words that change as it goes on ('And then?' → 'And in nature,' → 'And in the chimney.') never ends the reply; the whole, not sure, resumes it", async () => {
    const r = await playing();
    // Each 100 ms of it heard as other words (measured: what Moonshine hears in flite nova's "Mm-hmm." 400, 600 and 800 ms in).
    wordsBySpeech(r, 100, ["", "", "", "", "And then?", "And in nature,", "And in the chimney.", "And then they?", "And in nature,", "And any chance."]);
    const words = r.stt.words!;
    r.stt.answer = (t) => (r.stt.turns.indexOf(t) === 0 ? "Tell me a story." : "And the mature men.");
    // Sure while the hum goes on (as Moonshine is, −0.29 at 600 ms); the whole sound's words are not.
    r.stt.sure = (t) => r.stt.turns.indexOf(t) === 0 || !t.finishing;
    r.stt.words = (t) => (r.stt.turns.indexOf(t) === 0 ? "Tell me a story." : words(t));
    const hum = await blocks(r, 900);
    assert.equal(interruptedAt(r), undefined, "not ended while the hum lasts");
    assert.ok(r.stt.turns[1]!.askedSure >= 3, `judged ${r.stt.turns[1]!.askedSure} times while it lasted`);
    assert.equal(hum.at(-1)!.frames, hum[0]!.frames, "the reply stays paused meanwhile");
    r.stt.turns[1]!.finishing = true;
    const paused = r.frames;
    await blocks(r, 900, false);
    assert.ok(r.frames > paused, "resumed");
    const m = await untilTurn(r, 1);
    assert.equal(m.interrupted, false);
    assert.equal(m.false_interruptions, 1);
    assert.equal(eventCount(r, "in-2", "user.audio", "BOS"), 0, "no turn for the hum");
    r.close();
  });

  test("sure words of a sound that had ended when they were asked end the reply at once; the same words heard again end it while the sound goes on", async () => {
    const r = await playing();
    const onset = r.clock.now() - 20;
    r.stt.answer = (t) => (r.stt.turns.indexOf(t) === 0 ? "Tell me a story." : "Stop.");
    r.stt.words = r.stt.answer;
    // "Stop." lasts 420 ms: asked first at 300 (sure, the sound goes on), heard again at min_ms (400), when the sound has lasted that long.
    const speech = [...(await blocks(r, 420)), ...(await blocks(r, 200, false))];
    const eos = interruptedAt(r);
    assert.equal(eos?.error?.code, "interrupted");
    const at = speech.find((b) => b.events > r.events.indexOf(eos!))!.t - onset;
    assert.ok(at >= 400 && at <= 420, `EOS interrupted ${at} ms after the onset`);
    r.close();
  });

  test("sure words asked before min_ms and heard again are no barge-in when the sound stopped short of min_ms: the reply resumes", async () => {
    const r = await playing();
    r.stt.answer = (t) => (r.stt.turns.indexOf(t) === 0 ? "Tell me a story." : "Stop.");
    r.stt.words = r.stt.answer;
    await blocks(r, 320);
    await blocks(r, 900, false);
    assert.equal(interruptedAt(r), undefined, "not ended");
    assert.ok(r.stt.turns[1]!.askedSure >= 1, "its words were asked early");
    const m = await untilTurn(r, 1);
    assert.equal(m.interrupted, false);
    assert.equal(m.false_interruptions, 1);
    r.close();
  });

  test("sure words asked once the sound had ended for 100 ms end the reply on that one judgement", async () => {
    const r = await playing();
    const onset = r.clock.now() - 20;
    r.stt.answer = (t) => (r.stt.turns.indexOf(t) === 0 ? "Tell me a story." : "Wait.");
    r.stt.words = r.stt.answer;
    // 380 ms of sound (min_ms less the slack: long enough), then quiet: at 300 and 400 not sure yet; at 600, sure, the sound ended 220 ms before.
    r.stt.sure = (t) => r.stt.turns.indexOf(t) === 0 || t.askedSure > 2;
    const speech = [...(await blocks(r, 380)), ...(await blocks(r, 240, false))];
    const eos = interruptedAt(r);
    assert.equal(eos?.error?.code, "interrupted");
    const at = speech.find((b) => b.events > r.events.indexOf(eos!))!.t - onset;
    assert.ok(at >= 600 && at <= 620, `EOS interrupted ${at} ms after the onset`);
    assert.equal(r.stt.turns[1]!.askedSure, 3, "decided on the third judgement, sure once");
    r.close();
  });

  test("a sound that goes on past 1.5 s is no backchannel: its plain words end the reply while it goes on, though the recogniser is never sure of them", async () => {
    const r = await playing();
    const onset = r.clock.now() - 20;
    r.stt.answer = (t) => (r.stt.turns.indexOf(t) === 0 ? "Tell me a story." : "Call my mother tomorrow morning.");
    r.stt.words = r.stt.answer;
    r.stt.sure = (t) => r.stt.turns.indexOf(t) === 0;
    const speech = await blocks(r, 2_000);
    const eos = interruptedAt(r);
    assert.equal(eos?.error?.code, "interrupted");
    const at = speech.find((b) => b.events > r.events.indexOf(eos!))!.t - onset;
    assert.ok(at >= 1_500 && at <= 1_800, `EOS interrupted ${at} ms after the onset`);
    r.close();
  });

  test("words the recogniser is not sure of (a hum heard as 'And then?') never end the reply early; judged again while the sound lasts, the reply resumes", async () => {
    const r = await playing();
    r.stt.words = (t) => (r.stt.turns.indexOf(t) === 0 ? "Tell me a story." : "And then?");
    r.stt.answer = (t) => (r.stt.turns.indexOf(t) === 0 ? "Tell me a story." : "M. M. H.");
    r.stt.sure = () => false;
    await blocks(r, 1_000);
    assert.equal(interruptedAt(r), undefined, "not ended while the hum lasts");
    const turn = r.stt.turns[1]!;
    // Judged at min_ms (400) and every 200 ms after: 400, 600, 800 (and 1000, as the sound ends).
    assert.ok(turn.askedSure >= 3, `judged ${turn.askedSure} times`);
    const paused = r.frames;
    await blocks(r, 900, false);
    assert.ok(r.frames > paused, "resumed within resume_ms of the sound's end");
    const m = await untilTurn(r, 1);
    assert.equal(m.interrupted, false);
    assert.equal(m.false_interruptions, 1);
    r.close();
  });
});

describe("latency accounting (voice.md §7)", () => {
  test("turn.metrics: speech_to_audio ≈ end_of_utterance_delay + ttft + ttfb + sending; the stages are histograms", async () => {
    const r = await rig({ turn: { preemptive: false } });
    slowModel(r, 300);
    r.tts.delayMs = 40;
    await r.talk(600);
    await r.talk(1_000, false);
    const m = await untilTurn(r, 1);
    const [eou, ttft, ttfb, total] = [m.end_of_utterance_delay, m.ttft, m.ttfb, m.speech_to_audio] as number[];
    assert.ok(ttft! >= 300, `ttft ${ttft}`);
    assert.ok(ttfb! >= 40, `ttfb ${ttfb}`);
    const parts = eou! + ttft! + ttfb!;
    assert.ok(total! >= parts && total! <= parts + 40, `speech_to_audio ${total} vs ${eou} + ${ttft} + ${ttfb}`);
    assert.equal(m.preemptive, "off");
    assert.equal(m.false_interruptions, 0);
    const text = await r.metrics.getSingleMetricAsString("perch_voice_stage_seconds");
    for (const stage of ["end_of_utterance_delay", "ttft", "ttfb"]) assert.match(text, new RegExp(`stage="${stage}"`));
    r.close();
  });
});

describe("turn-taking settings", () => {
  const refused = (voice: Record<string, unknown>, field: RegExp) =>
    assert.throws(
      () => loadConfig({}, { voice } as never),
      (err: unknown) => err instanceof ConfigError && field.test(err.message),
      JSON.stringify(voice),
    );

  test("defaults, and values out of range or out of order refused with the field named", () => {
    const { turn, interruption } = loadConfig({}, {} as never).voice;
    assert.deepEqual(
      [turn.finished_silence_ms, turn.silence_ms, turn.unfinished_silence_ms, turn.preemptive, turn.preemptive_after_ms],
      [250, 400, 1_200, true, 150],
    );
    assert.deepEqual(interruption, { min_ms: 400, min_words: 1, resume_ms: 600 });
    refused({ turn: { finished_silence_ms: 500 } }, /voice\.turn\.silence_ms/);
    refused({ turn: { unfinished_silence_ms: 300 } }, /voice\.turn\.silence_ms/);
    refused({ turn: { finished_silence_ms: 50 } }, /voice\.turn\.finished_silence_ms/);
    refused({ turn: { preemptive: "yes" } }, /voice\.turn\.preemptive/);
    refused({ turn: { preemptive_after_ms: -1 } }, /voice\.turn\.preemptive_after_ms/);
    refused({ interruption: { min_ms: -1 } }, /voice\.interruption\.min_ms/);
    refused({ interruption: { min_words: 0 } }, /voice\.interruption\.min_words/);
    refused({ interruption: { resume_ms: 20 } }, /voice\.interruption\.resume_ms/);
    refused({ interruption: { min_ms: 400, typo: 1 } }, /voice\.interruption/);
  });
});

describe("a preemptive reply discarded while it waits to run a tool (voice.md §7)", () => {
  test("its release rejects: the model run waiting on it ends (no tool runs), nothing hangs", async () => {
    let seen: "waiting" | "released" | "refused" = "waiting";
    let tools = 0;
    const reply = new PreparedReply(
      "what time is it",
      async (_signal, release) =>
        (async function* () {
          yield "Let me check.";
          // A tool step: it runs only once the reply is used.
          try {
            await release();
            seen = "released";
            tools++;
          } catch {
            seen = "refused";
            return;
          }
          yield "It is noon.";
        })(),
      { clock: new FakeClock(), maxChars: 2_000 },
    );
    await settle();
    assert.equal(seen, "waiting");
    reply.discard();
    await settle();
    assert.equal(seen, "refused", "the run waiting on release was told the reply was discarded");
    assert.equal(tools, 0);
  });
});
