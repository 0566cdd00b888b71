/**
 * Ensemble decoding on the real model (src/ai/speech/moonshine.ts, issue 50): an utterance heard in
 * several views, decoded jointly, alone or in a batch with another, and its words scored
 * (teacher-forced) in the same views. Whether it hears better is the hearing benchmark's to say.
 */
import assert from "node:assert/strict";
import { before, test } from "node:test";
import { frontEnd } from "../src/ai/speech/front-end.ts";
import { MoonshineModel } from "../src/ai/speech/moonshine.ts";
import type { View } from "../src/ai/speech/views.ts";
import { ESPEAK_VOICES, espeak, wordErrorRate } from "./support/speech.ts";

const RATE = 16_000;
const VIEWS: View[] = [{}, { shift: 128 }, { speed: 1.03 }];
let model: MoonshineModel;
let audios: Float32Array[];
const texts = ["Open the front door.", "Set a timer for ten minutes."];

before(async () => {
  model = await MoonshineModel.load({ threads: 1 });
  audios = await Promise.all(
    texts.map(async (text, i) => {
      const speech = await espeak(text, ESPEAK_VOICES[i]!.args);
      const padded = new Float32Array(speech.length + RATE / 2);
      padded.set(speech, RATE / 4);
      return padded;
    }),
  );
});

test("an utterance heard in three views is decoded jointly, the same alone as in a batch with another", { timeout: 120_000 }, async () => {
  const o = { views: VIEWS, beams: 2, prepare: (a: Float32Array) => frontEnd(a) };
  const alone = [];
  for (const audio of audios) alone.push((await model.transcribeBatch([audio], o))[0]!);
  for (const [i, heard] of alone.entries()) assert.equal(wordErrorRate(texts[i]!, heard.text), 0, heard.text);
  const together = await model.transcribeBatch(audios, o);
  assert.deepEqual(
    together.map((h) => h.text),
    alone.map((h) => h.text),
  );
});

test("the words' joint log-probability decoded (with the cache) is the one scored teacher-forced in the same views", { timeout: 120_000 }, async () => {
  const prepare = (a: Float32Array) => frontEnd(a);
  const audio = audios[0]!;
  const mean = (x: number[]) => x.reduce((a, b) => a + b, 0) / x.length;
  const [heard] = await model.transcribeBatch([audio], { views: VIEWS, beams: 1, prepare });
  const [inViews] = await model.score(audio, [heard!.text], { views: VIEWS, prepare });
  const [inOne] = await model.score(audio, [heard!.text], { prepare });
  // Teacher-forced through the decoder's no-cache branch (and the int8 model quantises each batch's
  // activations as a whole), the figures differ a little from the cached decode's: measured 0.002 in
  // its views, 0.018 in one view.
  const off = (x: number[]) => Math.abs(mean(x) - heard!.logprob);
  assert.ok(off(inViews!) < 0.006, `decoded ${heard!.logprob}, scored in its views ${mean(inViews!)}, in one ${mean(inOne!)}`);
  // Another text is less likely, in the views as in one.
  const [other] = await model.score(audio, ["Mm-hmm."], { views: VIEWS, prepare });
  assert.ok(mean(other!) < mean(inViews!));
});
