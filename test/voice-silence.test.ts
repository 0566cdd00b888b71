/**
 * Silence that costs nothing, and speech after it heard from its first word (issue 41), fast: a
 * conversation on fake engines and a fake clock (test/support/fake-voice.ts), fed RTP packets of
 * real Opus as a device sends them. The end-to-end proof is in voice-silence-e2e.test.ts.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { concatInt16 } from "../src/audio/samples.ts";
import { encoded, type FakeTurnTranscription, type Rig, RtpSender, rig } from "./support/fake-voice.ts";

const RATE = 16_000;

/** The word's 20 ms packets. */
const WORD_PACKETS = 30;

/**
 * The fake recogniser's words: "hello" when the turn's audio has the whole word (every one of its
 * 20 ms loud, the first with at least 100 ms of what came before it), else "ello" (a clipped start).
 */
function heardWord(turn: FakeTurnTranscription): string {
  const pcm = concatInt16(turn.audio);
  let first = -1;
  let loud = 0;
  for (let b = 0; (b + 1) * 320 <= pcm.length; b++) {
    let sum = 0;
    for (let i = b * 320; i < (b + 1) * 320; i++) sum += pcm[i]! * pcm[i]!;
    if (Math.sqrt(sum / 320) <= 2000) continue;
    loud++;
    if (first < 0) first = b;
  }
  return first >= (0.1 * RATE) / 320 && loud >= WORD_PACKETS ? "hello" : "ello";
}

async function transcript(r: Rig): Promise<string | undefined> {
  for (let t = 0; t < 5_000 && !r.of("in-1").some((e) => e.label === "user.transcript"); t += 100) await r.wait(100);
  return r.of("in-1").find((e) => e.type === "TEXT_DONE" && e.label === "user.transcript")?.text;
}

describe("silence that costs nothing (fake engines, fake clock, real Opus)", () => {
  for (const kind of ["audio level", "DTX"] as const) {
    test(`a device sending ${kind === "DTX" ? "DTX in its pauses" : "its audio level"}: 10 s of silence cost no voice-activity inference, and the first word after it is heard whole`, async () => {
      const r = await rig();
      r.stt.answer = heardWord;
      const tx = new RtpSender(r);
      const silence = encoded(1, false)[0]!;
      if (kind === "DTX") for (let i = 0; i < 25; i++) await tx.send(Buffer.from([0x78]), { ms: 400 });
      else for (let i = 0; i < 500; i++) await tx.send(silence, { level: 127 });
      // The detector heard the first half second of the silence at most (the energy gate spares it the rest).
      assert.ok(r.vadSamples <= 0.5 * RATE + 640, `${r.vadSamples} samples given to the detector`);
      for (const p of encoded(WORD_PACKETS, true)) await tx.send(p, { level: 10 });
      for (let i = 0; i < 50; i++) await tx.send(silence, { level: 127 });
      assert.equal(await transcript(r), "hello");
      r.close();
    });
  }

  test("a device without the extension: its silence is decoded, yet the detector hears none of it past half a second", async () => {
    const r = await rig();
    r.stt.answer = heardWord;
    const tx = new RtpSender(r);
    const silence = encoded(1, false)[0]!;
    for (let i = 0; i < 500; i++) await tx.send(silence);
    assert.ok(r.vadSamples <= 0.5 * RATE + 640, `${r.vadSamples} samples given to the detector`);
    for (const p of encoded(WORD_PACKETS, true)) await tx.send(p);
    for (let i = 0; i < 50; i++) await tx.send(silence);
    assert.equal(await transcript(r), "hello");
    r.close();
  });
});
