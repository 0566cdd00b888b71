/**
 * The decoder's search (src/ai/speech/beam-search.ts) and the views of ensemble decoding
 * (src/ai/speech/views.ts), fast: on small synthetic distributions and a fake decoder whose "cache"
 * is each row's prefix, so that a row reordered wrongly says so. Whether ensembles help the words is
 * the hearing benchmark's to say (bench/hearing.ts).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { BeamSearch, type DecoderStep, decodeJointly, END_TOKEN, ensembleSources, jointLogprobs, START_TOKEN } from "../src/ai/speech/beam-search.ts";
import { renderView } from "../src/ai/speech/views.ts";

const V = 8;
const close = (a: number, b: number, eps = 1e-5) => Math.abs(a - b) < eps;
const sumExp = (x: Float32Array) => x.reduce((s, v) => s + Math.exp(v), 0);

/** Logits over V tokens from probabilities given for some (the rest share what is left). */
function logits(p: Record<number, number>): Float32Array {
  const given = Object.values(p).reduce((s, x) => s + x, 0);
  const rest = (1 - given) / (V - Object.keys(p).length);
  return Float32Array.from({ length: V }, (_, t) => Math.log(p[t] ?? rest) + 3);
}

test("one view's joint distribution is its log-softmax; several views' is their normalised mean (a product of experts)", () => {
  const a = logits({ 3: 0.6, 4: 0.3 });
  const one = jointLogprobs([a]);
  assert.ok(close(sumExp(one), 1));
  assert.ok(close(one[3]!, Math.log(0.6)) && close(one[4]!, Math.log(0.3)));
  // View a finds 3 likelier, view b finds 4 far likelier, and 3 unlikely: together they say 4.
  const b = logits({ 3: 0.05, 4: 0.9 });
  const joint = jointLogprobs([a, b]);
  assert.ok(close(sumExp(joint), 1), "normalised");
  assert.ok(joint[4]! > joint[3]!, "4 is what the views agree on");
  const mean = { 3: (Math.log(0.6) + Math.log(0.05)) / 2, 4: (Math.log(0.3) + Math.log(0.9)) / 2 };
  assert.ok(close(joint[4]! - joint[3]!, mean[4] - mean[3]), "the log-probabilities' mean, up to the norm");
  // Views that agree change nothing.
  const same = jointLogprobs([a, a, a]);
  for (let t = 0; t < V; t++) assert.ok(close(same[t]!, one[t]!, 1e-4));
});

test("beam search finds the likelier sequence that greedy misses; the best is judged per token", () => {
  // Step 0: token 3 (0.5) or 4 (0.4). After 3 comes 5 (0.35), then the end; after 4 the end is sure (0.95).
  const dist = (prefix: readonly number[]) =>
    jointLogprobs([
      logits(prefix.length === 0 ? { 3: 0.5, 4: 0.4 } : prefix.length === 1 && prefix[0] === 3 ? { 5: 0.35, [END_TOKEN]: 0.3 } : { [END_TOKEN]: 0.95 }),
    ]);
  const run = (width: number) => {
    const search = new BeamSearch(width, 10);
    let prefixes: number[][] = Array.from({ length: width }, () => []);
    for (let step = 0; !search.done && step < 10; step++) {
      const chosen = search.step(step, (b) => dist(prefixes[b]!));
      prefixes = chosen.map((c) => [...prefixes[c.from]!, c.token]);
    }
    return search.best();
  };
  assert.deepEqual(run(1).tokens, [3, 5], "greedy takes 3, then 5");
  const best = run(2);
  assert.deepEqual(best.tokens, [4]);
  assert.ok(close(best.logprob, Math.log(0.4) + Math.log(0.95), 1e-4));
});

test("ensemble rows: each beam's views stay together, following the beam they continue", () => {
  // Two utterances, two beams, three views: row (u·2 + b)·3 + v.
  const chosen = [
    [
      { from: 1, token: 7 },
      { from: 0, token: 6 },
    ],
    [
      { from: 0, token: 5 },
      { from: 0, token: 4 },
    ],
  ];
  const { source, next } = ensembleSources(chosen, 2, 3);
  assert.deepEqual(source, [3, 4, 5, 0, 1, 2, 6, 7, 8, 6, 7, 8]);
  assert.deepEqual(next, [7, 7, 7, 6, 6, 6, 5, 5, 5, 4, 4, 4]);
});

/**
 * A fake decoder: each row's cache is its prefix (the tokens fed to it, reordered as told); a row's
 * logits depend on its view and its prefix, and a row whose prefix is not its beam's is caught.
 */
function fakeDecoder(views: number, want: (view: number, prefix: readonly number[]) => Float32Array) {
  let cache: number[][] = [];
  const fed: number[][] = [];
  return {
    fed,
    run: async (next: readonly number[]): Promise<DecoderStep> => {
      if (cache.length === 0) cache = next.map(() => []);
      cache = cache.map((prefix, r) => [...prefix, next[r]!]);
      fed.push([...next]);
      const out = new Float32Array(next.length * V);
      for (const [r, prefix] of cache.entries()) out.set(want(r % views, prefix.slice(1)), r * V);
      return { logits: out, vocabulary: V };
    },
    reorder: (source: readonly number[]) => {
      cache = source.map((from) => cache[from]!);
    },
    rows: () => cache,
  };
}

test("joint decoding: the views' rows of a beam say the same tokens, their caches reordered together, and the views' agreement wins", async () => {
  // View 0 leans to 3 then 5 ("the pitch"), views 1 and 2 to 4 then 6 ("the kitchen"); after the second token all end.
  const want = (view: number, prefix: readonly number[]) => {
    if (prefix.length >= 2) return logits({ [END_TOKEN]: 0.9 });
    if (prefix.length === 1) return logits(prefix[0] === 3 ? { 5: 0.7 } : view === 0 ? { 6: 0.4, 5: 0.3 } : { 6: 0.8 });
    return logits(view === 0 ? { 3: 0.55, 4: 0.4 } : { 3: 0.35, 4: 0.6 });
  };
  for (const beams of [1, 3]) {
    const alone = fakeDecoder(1, want);
    const [single] = await decodeJointly({ maxTokens: [10], beams, views: 1, run: alone.run, reorder: alone.reorder });
    assert.deepEqual(single!.tokens, [3, 5], `view 0 alone (beams ${beams})`);
    const fake = fakeDecoder(3, want);
    const [joint] = await decodeJointly({
      maxTokens: [10],
      beams,
      views: 3,
      run: fake.run,
      reorder: (source) => {
        fake.reorder(source);
        // Every row's cache is its beam's: the views of a beam hold one prefix.
        const rows = fake.rows();
        for (let b = 0; b < beams; b++) for (let v = 1; v < 3; v++) assert.deepEqual(rows[b * 3 + v], rows[b * 3], `beam ${b}'s view ${v}`);
      },
    });
    assert.deepEqual(joint!.tokens, [4, 6], `three views together (beams ${beams})`);
    assert.deepEqual(fake.fed[0], new Array(3 * beams).fill(START_TOKEN), "step 0 feeds every row the start");
  }
});

test("a beam that continues another beam takes that beam's cache rows, all its views' (the beams swap)", async () => {
  // 3 is likelier first, but nothing follows it well; 6 follows 4 surely, then the end: at step 1
  // the best beam continues beam 1, so rows 0–1 must take rows 2–3's caches.
  const flat = logits({});
  const want = (_view: number, prefix: readonly number[]) => {
    if (prefix.length === 0) return logits({ 3: 0.5, 4: 0.45 });
    if (prefix.length === 1) return prefix[0] === 4 ? logits({ 6: 0.95 }) : flat;
    return prefix[0] === 4 && prefix[1] === 6 ? logits({ [END_TOKEN]: 0.95 }) : flat;
  };
  const fake = fakeDecoder(2, want);
  const [best] = await decodeJointly({ maxTokens: [12], beams: 2, views: 2, run: fake.run, reorder: fake.reorder });
  assert.deepEqual(best!.tokens, [4, 6]);
  assert.ok(close(best!.logprob, Math.log(0.45) + 2 * Math.log(0.95), 1e-3), `${best!.logprob}`);
});

test("joint decoding of a batch: each utterance's beams and views apart from the others'", async () => {
  // Utterance 0's views all say 3, utterance 1's all say 4 (told apart by the row: views 2 a beam, beams 2).
  const views = 2;
  const beams = 2;
  let cache: number[][] = [];
  const run = async (next: readonly number[]): Promise<DecoderStep> => {
    if (cache.length === 0) cache = next.map(() => []);
    cache = cache.map((p, r) => [...p, next[r]!]);
    const out = new Float32Array(next.length * V);
    cache.forEach((p, r) => {
      const u = Math.floor(r / (beams * views));
      out.set(p.length > 1 ? logits({ [END_TOKEN]: 0.9 }) : logits({ [u === 0 ? 3 : 4]: 0.8 }), r * V);
    });
    return { logits: out, vocabulary: V };
  };
  const best = await decodeJointly({ maxTokens: [10, 10], beams, views, run, reorder: (s) => (cache = s.map((f) => cache[f]!)) });
  assert.deepEqual(
    best.map((h) => h.tokens),
    [[3], [4]],
  );
});

test("views keep the audio's length: a shift drops samples at the start, a speed stretches or squeezes it, a dither is seeded", async () => {
  const n = 16_000;
  // A tone with silence after it, as an utterance padded at its edges.
  const audio = Float32Array.from({ length: n }, (_, i) => (i < 12_000 ? 0.3 * Math.sin((2 * Math.PI * 300 * i) / 16_000) : 0));
  const copy = audio.slice();
  assert.equal(await renderView(audio, {}), audio, "the identity is the audio itself");
  const shifted = await renderView(audio, { shift: 128 });
  assert.equal(shifted.length, n);
  assert.deepEqual(shifted.subarray(0, n - 128), audio.subarray(128));
  assert.deepEqual(shifted.subarray(n - 128), new Float32Array(128), "silence at the end");
  // The tone's end (where it falls silent) moves to 12,000 / speed.
  const end = (x: Float32Array) => x.findLastIndex((v) => Math.abs(v) > 0.05);
  for (const speed of [0.97, 1.03]) {
    const moved = await renderView(audio, { speed });
    assert.equal(moved.length, n, `${speed}`);
    assert.ok(Math.abs(end(moved) - 12_000 / speed) < 20, `speed ${speed}: the tone ends at ${end(moved)}`);
  }
  const a = await renderView(audio, { seed: 1 });
  assert.deepEqual(a, await renderView(audio, { seed: 1 }), "the same seed, the same samples");
  assert.notDeepEqual(a, await renderView(audio, { seed: 2 }));
  let power = 0;
  for (let i = 0; i < n; i++) power += (a[i]! - audio[i]!) ** 2;
  const dbfs = 10 * Math.log10(power / n);
  assert.ok(Math.abs(dbfs - -66) < 0.5, `dither at ${dbfs} dBFS`);
  assert.deepEqual(audio, copy, "the input is untouched");
});
