import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { FRAME_SAMPLES, OpusCodec } from "../src/voice/opus.ts";
import { Playout } from "../src/voice/playout.ts";
import { SentenceSplitter } from "../src/voice/sentences.ts";
import { SpokenText } from "../src/voice/spoken.ts";

describe("sentence splitter", () => {
  test("gives each sentence as soon as it is complete, however the text is cut", () => {
    const text = 'Dr. Smith lives at No. 5 on Main St. in town. It costs 3.50 dollars! Really? "Yes." Then a line\nand the rest';
    const expected = ["Dr. Smith lives at No. 5 on Main St. in town.", "It costs 3.50 dollars!", "Really?", '"Yes."', "Then a line", "and the rest"];
    for (const size of [1, 3, 7, 1000]) {
      const s = new SentenceSplitter();
      const out: string[] = [];
      for (let i = 0; i < text.length; i += size) out.push(...s.push(text.slice(i, i + size)));
      out.push(...s.flush());
      assert.deepEqual(out, expected, `pieces of ${size}`);
    }
  });

  test("a sentence is given before the text after it arrives, and a run-on text is cut at a clause", () => {
    const s = new SentenceSplitter();
    assert.deepEqual(s.push("The weather is fine today."), [], "the end is not known before what follows");
    assert.deepEqual(s.push(" Tomorrow"), ["The weather is fine today."]);
    const long = `${"word, ".repeat(60)}end`;
    const r = new SentenceSplitter();
    const first = r.push(long);
    assert.ok(first.length >= 1 && first[0]!.length <= 240 && first[0]!.endsWith(","), first[0]);
  });
});

describe("spoken text", () => {
  test("keeps the sentences played, and the share of words of the one cut off", () => {
    const t = new SpokenText();
    t.add("One two three four.", 1000);
    t.add("Five six seven eight.", 1000);
    assert.equal(t.heard(0), "");
    assert.equal(t.heard(999), "One two three");
    assert.equal(t.heard(1000), "One two three four.");
    assert.equal(t.heard(1500), "One two three four. Five six");
    assert.equal(t.heard(5000), "One two three four. Five six seven eight.");
    assert.equal(t.text, "One two three four. Five six seven eight.");
  });
});

/** Waits until `check` holds (a liveness guard: it fails only after 5 s). */
async function until(check: () => boolean, what: string): Promise<void> {
  const end = Date.now() + 5_000;
  while (!check()) {
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/**
 * The playout's clock is injected: frames go out as it says they are due, however the timers
 * run on a loaded machine, so pacing is checked against it rather than against wall time.
 */
describe("playout", () => {
  test("sends 20 ms Opus frames of everything written, each when due (at most 80 ms ahead), the first marked, and finishes", async () => {
    const codec = new OpusCodec();
    let clock = 0;
    const sent: Array<{ bytes: number; first: boolean }> = [];
    const p = new Playout({ codec, now: () => clock, send: (opus, first) => sent.push({ bytes: opus.length, first }) > 0 });
    p.write(new Int16Array(FRAME_SAMPLES * 19 + 100).fill(1000));
    p.end();
    // Paced, never all at once: with the clock standing still, the frames due within 80 ms (0, 20, 40, 60, 80) and no more.
    assert.equal(sent.length, 5);
    await new Promise((r) => setTimeout(r, 50)); // the playout's timer runs (more than once), the clock still at 0
    assert.equal(sent.length, 5, "nothing more while the clock stands still");
    clock = 20;
    await until(() => sent.length === 6, "the frame due at 100 ms");
    clock = 60;
    await until(() => sent.length === 8, "the frames due up to 140 ms");
    // The clock runs on: everything is sent.
    let finished = false;
    void p.done.then(() => (finished = true));
    while (!finished) {
      clock += 20;
      await new Promise((r) => setTimeout(r, 1));
    }
    const played = await p.done;
    assert.equal(played, FRAME_SAMPLES * 19 + 100);
    assert.equal(sent.length, 20, "the last partial frame is padded");
    assert.deepEqual(
      sent.map((s) => s.first),
      [true, ...Array(19).fill(false)],
    );
    codec.close();
  });

  test("a frame is late by when it is sent: an encoder on another thread that answers late makes late frames (perch_voice_frames_late_total)", () => {
    const codec = new OpusCodec();
    let clock = 0;
    // An encoder that answers later, as the conversation's audio thread does.
    const held: Array<() => void> = [];
    const encoder = { frame: (pcm: Int16Array, encoded: (opus: Buffer) => void) => held.push(() => encoded(codec.encode(pcm))) };
    const sentAt: number[] = [];
    let late = 0;
    const p = new Playout({ codec: encoder, now: () => clock, send: () => sentAt.push(clock) > 0, late: () => late++ });
    p.write(new Int16Array(FRAME_SAMPLES * 10).fill(1000));
    assert.equal(held.length, 5, "the frames due within 80 ms went to the encoder");
    // They come back 150 ms later: frames due at 0–80 ms sent at 150 ms, each more than 20 ms late.
    clock = 150;
    for (const answer of held.splice(0)) answer();
    assert.deepEqual(sentAt, [150, 150, 150, 150, 150]);
    assert.equal(p.lateFrames, 5);
    assert.equal(late, 5);
    p.stop();
    codec.close();
  });

  test("stop() sends nothing more and reports what was played", async () => {
    const codec = new OpusCodec();
    let clock = 0;
    let frames = 0;
    const p = new Playout({ codec, now: () => clock, send: () => ++frames > 0 });
    p.write(new Int16Array(48_000));
    clock = 40;
    await until(() => frames === 7, "the frames due up to 120 ms");
    const played = p.stop();
    assert.equal(played, 7 * FRAME_SAMPLES);
    clock = 2_000;
    await new Promise((r) => setTimeout(r, 50));
    assert.equal(frames, 7, "nothing after stop()");
    assert.equal(await p.done, played);
    codec.close();
  });

  test("while synthesis lags, silence keeps the stream going without counting as played", async () => {
    const codec = new OpusCodec();
    let clock = 0;
    let frames = 0;
    const p = new Playout({ codec, now: () => clock, send: () => ++frames > 0 });
    p.write(new Int16Array(FRAME_SAMPLES));
    assert.equal(frames, 5, "the one frame written, then silence up to 80 ms ahead");
    clock = 200;
    await until(() => frames === 15, "silence up to 280 ms while nothing more is written");
    assert.equal(p.played, FRAME_SAMPLES, "silence is not counted as played");
    p.write(new Int16Array(FRAME_SAMPLES));
    p.end();
    clock = 400;
    assert.equal(await p.done, 2 * FRAME_SAMPLES);
    codec.close();
  });

  test("fillGaps false (a realtime model's audio): nothing is sent while audio is awaited; the next keeps its time, or goes now when late", async () => {
    const codec = new OpusCodec();
    let clock = 0;
    const sentAt: number[] = [];
    const p = new Playout({ codec, now: () => clock, fillGaps: false, send: () => sentAt.push(clock) > 0 });
    p.write(new Int16Array(FRAME_SAMPLES * 2));
    assert.deepEqual(sentAt, [0, 0], "the two frames written, no silence after them");
    clock = 10;
    p.write(new Int16Array(FRAME_SAMPLES * 6));
    // Frames 2..7 keep their times (40..140 ms): up to 80 ms ahead of the clock at 10 ms, those due by 90 go now.
    assert.deepEqual(sentAt, [0, 0, 10, 10, 10]);
    clock = 500;
    await until(() => sentAt.length === 8, "the rest of what was written");
    assert.equal(p.frames, 8, "no filler while nothing more was written");
    // Late now: the next frame goes at once, and the clock runs on from there.
    clock = 1_000;
    p.write(new Int16Array(FRAME_SAMPLES * 10));
    p.end();
    assert.equal(sentAt.filter((t) => t === 1_000).length, 5, "frames due within 80 ms of the new start, not a burst of ten");
    while (sentAt.length < 18) {
      clock += 20;
      await new Promise((r) => setTimeout(r, 1));
    }
    assert.equal(await p.done, 18 * FRAME_SAMPLES);
    codec.close();
  });
});
