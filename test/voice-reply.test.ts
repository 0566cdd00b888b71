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

describe("playout", () => {
  test("sends 20 ms Opus frames of everything written, the first marked, and finishes", async () => {
    const codec = new OpusCodec();
    const sent: Array<{ bytes: number; first: boolean; at: number }> = [];
    const p = new Playout({ codec, send: (opus, first) => sent.push({ bytes: opus.length, first, at: performance.now() }) > 0 });
    p.write(new Int16Array(FRAME_SAMPLES * 19 + 100).fill(1000));
    p.end();
    const played = await p.done;
    assert.equal(played, FRAME_SAMPLES * 19 + 100);
    assert.equal(sent.length, 20, "the last partial frame is padded");
    assert.deepEqual(
      sent.map((s) => s.first),
      [true, ...Array(19).fill(false)],
    );
    // Paced, never all at once: the last frame is due 380 ms after the first, and goes at most 80 ms early.
    assert.ok(sent.at(-1)!.at - sent[0]!.at >= 250, `${sent.at(-1)!.at - sent[0]!.at} ms`);
    codec.close();
  });

  test("stop() sends nothing more and reports what was played", async () => {
    const codec = new OpusCodec();
    let frames = 0;
    const p = new Playout({ codec, send: () => ++frames > 0 });
    p.write(new Int16Array(48_000));
    await new Promise((r) => setTimeout(r, 100));
    const played = p.stop();
    const at = frames;
    assert.ok(at > 0 && at < 50);
    assert.equal(played, at * FRAME_SAMPLES);
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(frames, at);
    assert.equal(await p.done, played);
    codec.close();
  });

  test("while synthesis lags, silence keeps the stream going without counting as played", async () => {
    const codec = new OpusCodec();
    let frames = 0;
    const p = new Playout({ codec, send: () => ++frames > 0 });
    p.write(new Int16Array(FRAME_SAMPLES));
    await new Promise((r) => setTimeout(r, 120));
    assert.ok(frames >= 3, `${frames} frames`);
    p.write(new Int16Array(FRAME_SAMPLES));
    p.end();
    assert.equal(await p.done, 2 * FRAME_SAMPLES);
    codec.close();
  });
});
