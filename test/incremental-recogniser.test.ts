import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { Heard } from "../src/ai/speech/moonshine.ts";
import { IncrementalRecogniser, type LiveRecognition } from "../src/ai/speech/recogniser.ts";
import type { JobOptions } from "../src/ai/speech/scheduler.ts";
import { embeddedTranscription, PartialGate } from "../src/voice/embedded-engines.ts";

const RATE = 16_000;

/** Audio the recogniser counts as speech (a 200 Hz tone, RMS 0.07) or as silence, `seconds` long. */
function speech(seconds: number): Float32Array {
  return Float32Array.from({ length: Math.round(seconds * RATE) }, (_, i) => 0.1 * Math.sin((2 * Math.PI * 200 * i) / RATE));
}
function silence(seconds: number): Float32Array {
  return new Float32Array(Math.round(seconds * RATE));
}
const int16 = (audio: Float32Array) => Int16Array.from(audio, (x) => Math.round(x * 32767));

/**
 * The model, faked: each recognition waits until the test answers it, so the test decides when a
 * job ends relative to the audio pushed (no time passes; nothing is timed).
 */
class FakeModel implements LiveRecognition {
  readonly jobs: Array<{ samples: number; options: JobOptions; answer: (text: string) => void }> = [];
  private waiting: Array<() => void> = [];

  recogniserIdle(): boolean {
    return true;
  }

  recogniseHeard(audio: Float32Array, options?: JobOptions): Promise<Heard> {
    return new Promise((resolve) => {
      this.jobs.push({ samples: audio.length, options: options ?? { class: "api" }, answer: (text) => resolve({ text, logprob: -0.1 }) });
      for (const w of this.waiting.splice(0)) w();
    });
  }

  async recognise(audio: Float32Array, options?: JobOptions): Promise<string> {
    return (await this.recogniseHeard(audio, options)).text;
  }

  /** The `n`th job, or a failure if `words` were answered first (with older words, without recognising the speech since). */
  async jobBefore(n: number, words: Promise<string>): Promise<FakeModel["jobs"][number]> {
    return await Promise.race([this.job(n), words.then((w) => assert.fail(`answered "${w}" without recognising the speech since the last recognition began`))]);
  }

  /** The `n`th job (from 1), once asked for. */
  async job(n: number): Promise<FakeModel["jobs"][number]> {
    while (this.jobs.length < n) await new Promise<void>((r) => this.waiting.push(r));
    return this.jobs[n - 1]!;
  }
}

describe("live recognition at a pause: speculate() never answers with words older than the speech (fast layer)", () => {
  test("a recognition still running when more speech came is waited for and not used: the words of all the speech are recognised", async () => {
    const model = new FakeModel();
    const asr = new IncrementalRecogniser(model);
    // "Set a timer.", then 200 ms of silence: the recognition starts on its own (150 ms of silence).
    asr.push(speech(1));
    asr.push(silence(0.2));
    const first = await model.job(1);
    assert.equal(first.samples, 1.2 * RATE);
    // "for", said while that recognition runs, then a pause: the end of turn asks for the words.
    asr.push(speech(0.3));
    asr.push(silence(0.1));
    const words = asr.speculate();
    first.answer("Set a timer.");
    const second = await model.jobBefore(2, words);
    assert.equal(second.samples, 1.6 * RATE, "the second recognition covers every word said");
    assert.equal(second.options.class, "conversation", "as urgent as a turn's final words");
    second.answer("Set a timer for.");
    assert.equal(await words, "Set a timer for.");
    // The words of the pause are kept: asked again with nothing but silence since, no job runs.
    asr.push(silence(0.1));
    assert.equal(await asr.speculate(), "Set a timer for.");
    assert.equal(model.jobs.length, 2);
  });

  test("a recognition that ended before more speech is not the answer; one that silence alone followed is", async () => {
    const model = new FakeModel();
    const asr = new IncrementalRecogniser(model);
    asr.push(speech(1));
    asr.push(silence(0.2));
    (await model.job(1)).answer("Set a timer.");
    // Only silence came after it: its words are the words so far.
    assert.equal((await asr.heardSoFar()).text, "Set a timer.");
    assert.equal(model.jobs.length, 1);
    // Speech after it, and too little silence to start a recognition of its own: asked now, all of it is recognised.
    asr.push(speech(0.3));
    asr.push(silence(0.1));
    const words = asr.speculate();
    const second = await model.jobBefore(2, words);
    assert.equal(second.samples, 1.6 * RATE);
    second.answer("Set a timer for.");
    assert.equal(await words, "Set a timer for.");
  });

  test("a running recognition that silence alone followed is the answer: no second job", async () => {
    const model = new FakeModel();
    const asr = new IncrementalRecogniser(model);
    asr.push(speech(1));
    asr.push(silence(0.2));
    const first = await model.job(1);
    asr.push(silence(0.3));
    const words = asr.speculate();
    first.answer("Turn the lights off.");
    assert.equal(await words, "Turn the lights off.");
    assert.equal(model.jobs.length, 1);
  });

  test("through the conversation's port: the words asked after a pause and more speech are those of all the speech", async () => {
    const model = new FakeModel();
    const port = embeddedTranscription({ createIncrementalRecogniser: () => new IncrementalRecogniser(model), languages: ["en"] }, new PartialGate());
    const partials: string[] = [];
    const turn = port.open({ signal: new AbortController().signal, partial: (text) => partials.push(text) });
    turn.push(int16(speech(1)));
    turn.push(int16(silence(0.2)));
    // The pause: the recognition under way covers everything so far.
    turn.pause();
    const first = await model.job(1);
    // More speech, and the end of turn asks for the words at the next pause.
    turn.push(int16(speech(0.3)));
    turn.push(int16(silence(0.1)));
    const words = turn.soFar();
    first.answer("Set a timer.");
    const second = await model.jobBefore(2, words);
    assert.equal(second.samples, 1.6 * RATE);
    second.answer("Set a timer for.");
    assert.equal(await words, "Set a timer for.");
    assert.deepEqual(partials, ["Set a timer."], "the pause's words went out as partial text, not as the turn's");
  });
});

describe("sure words over a reply: the model's words against its backchannels (issue 50, fast layer)", () => {
  /** A model whose recognitions answer `heard` at once, and that scores every backchannel text `backchannel`. */
  class Scoring implements LiveRecognition {
    heard: Heard = { text: "", logprob: 0 };
    backchannel = -3;
    scored: Array<{ samples: number; texts: readonly string[]; model?: string | undefined; views?: unknown }> = [];
    recognised: number[] = [];
    recogniserIdle(): boolean {
      return true;
    }
    async recogniseHeard(audio: Float32Array): Promise<Heard> {
      this.recognised.push(audio.length);
      return { ...this.heard };
    }
    async recognise(audio: Float32Array): Promise<string> {
      return (await this.recogniseHeard(audio)).text;
    }
    async scoreTexts(
      audio: Float32Array,
      texts: readonly string[],
      _job?: JobOptions,
      o: { model?: "base" | "tiny"; views?: unknown } = {},
    ): Promise<number[]> {
      this.scored.push({ samples: audio.length, texts, model: o.model, views: o.views });
      return texts.map((_, i) => (i === 0 ? this.backchannel : this.backchannel - 1));
    }
  }

  async function sure(model: Scoring): Promise<string> {
    const port = embeddedTranscription({ createIncrementalRecogniser: () => new IncrementalRecogniser(model), languages: ["en"] }, new PartialGate());
    const turn = port.open({ signal: new AbortController().signal, partial: () => {} });
    turn.push(int16(speech(0.6)));
    return turn.soFar({ sure: true });
  }

  test("words the model finds far likelier than any backchannel are sure; a hum's words it finds little likelier are not", async () => {
    const model = new Scoring();
    // "Stop." −0.12 against "Mm-hmm." −2.5 (measured: flite nova, 600 ms in).
    model.heard = { text: "Stop.", logprob: -0.12 };
    model.backchannel = -2.5;
    assert.equal(await sure(model), "Stop.");
    // The same audio the recognition heard is scored, with every backchannel text.
    assert.deepEqual(model.scored.at(-1)!.samples, model.recognised.at(-1));
    assert.ok(model.scored.at(-1)!.texts.includes("Mm-hmm."));
    // A hum's words (flite nova, 600 ms in: −0.29, as sure as the old floor of −0.35 wanted) barely beat "Mm-hmm.".
    model.heard = { text: "And in nature,", logprob: -0.29 };
    model.backchannel = -1.5;
    assert.equal(await sure(model), "");
    // Likely enough against the backchannels, but too unlikely itself.
    model.heard = { text: "Bill case", logprob: -1.22 };
    model.backchannel = -4;
    assert.equal(await sure(model), "");
  });

  test("words heard by Moonshine tiny (a loaded node's turns) are scored by tiny: its probabilities are not base's", async () => {
    const model = new Scoring();
    model.heard = { text: "Stop.", logprob: -0.12, model: "tiny" };
    assert.equal(await sure(model), "Stop.");
    assert.equal(model.scored.at(-1)!.model, "tiny");
    model.heard = { text: "Stop.", logprob: -0.12, model: "base" };
    await sure(model);
    assert.equal(model.scored.at(-1)!.model, "base");
  });

  test("the backchannels are scored as the words were heard: by the same model, in the same views (ensemble decoding)", async () => {
    const model = new Scoring();
    const views = [{}, { shift: 128 }, { speed: 1.03 }];
    model.heard = { text: "Stop.", logprob: -0.12, model: "tiny", views };
    model.backchannel = -2.5;
    assert.equal(await sure(model), "Stop.");
    assert.equal(model.scored.at(-1)!.model, "tiny");
    assert.deepEqual(model.scored.at(-1)!.views, views);
  });

  test("no words, or only backchannels, need no scoring; without `sure` the words are taken as heard", async () => {
    const model = new Scoring();
    model.heard = { text: "Mm-hmm.", logprob: -0.2 };
    assert.equal(await sure(model), "Mm-hmm.");
    model.heard = { text: "And in nature,", logprob: -0.29 };
    model.backchannel = -0.5;
    const port = embeddedTranscription({ createIncrementalRecogniser: () => new IncrementalRecogniser(model), languages: ["en"] }, new PartialGate());
    const turn = port.open({ signal: new AbortController().signal, partial: () => {} });
    turn.push(int16(speech(0.6)));
    assert.equal(await turn.soFar(), "And in nature.");
    assert.equal(model.scored.length, 0);
  });
});
