/**
 * The decoder's search, apart from the model (pure, so that it is tested on small synthetic
 * distributions): beam search over one utterance, and the joint distribution of an ensemble — the
 * same utterance heard several ways (views.ts), whose next-token distributions are combined at each
 * step as a product of experts (their log-probabilities averaged, then normalised), so that every
 * view's decoder goes on with the same tokens.
 */

export const START_TOKEN = 1;
export const END_TOKEN = 2;

export interface Hypothesis {
  tokens: number[];
  /** Sum of the tokens' log-probabilities. */
  logprob: number;
}

/** A row's next token, and the beam (row of the previous step) it continues. */
export interface Continuation {
  from: number;
  token: number;
}

/**
 * One utterance's beam search: `width` hypotheses go on at each step, the best continuations of
 * all of them; a hypothesis that ends (its end token, a loop, the length bound) is put aside, and
 * the search is done once `width` have ended or none left can beat the best that ended (by mean
 * log-probability per token, so that short and long texts compare).
 */
export class BeamSearch {
  private readonly width: number;
  private readonly maxTokens: number;
  private alive: Hypothesis[] = [{ tokens: [], logprob: 0 }];
  private readonly ended: Hypothesis[] = [];
  done = false;

  constructor(width: number, maxTokens: number) {
    this.width = width;
    this.maxTokens = maxTokens;
  }

  /**
   * The next token of each of the `width` rows, and the row (beam) it continues, from each beam's
   * next-token log-probabilities (normalised: `logprobsOf(b)` sums to 1 in probability).
   */
  step(step: number, logprobsOf: (beam: number) => Float32Array): Continuation[] {
    const keep = (): Continuation[] => Array.from({ length: this.width }, (_, b) => ({ from: b, token: END_TOKEN }));
    if (this.done) return keep();
    const candidates: Array<{ from: number; token: number; logprob: number }> = [];
    // At the first step every row is the same start: only the first is expanded.
    const live = step === 0 ? 1 : this.alive.length;
    for (let b = 0; b < live; b++) {
      const logprobs = logprobsOf(b);
      for (const token of topTokens(logprobs, this.width + 1)) candidates.push({ from: b, token, logprob: this.alive[b]!.logprob + logprobs[token]! });
    }
    candidates.sort((a, b) => b.logprob - a.logprob);
    const alive: Hypothesis[] = [];
    const rows: Continuation[] = [];
    for (const c of candidates) {
      if (alive.length >= this.width) break;
      const parent = this.alive[c.from]!;
      if (c.token === END_TOKEN) {
        this.ended.push({ tokens: parent.tokens, logprob: c.logprob });
        continue;
      }
      const tokens = [...parent.tokens, c.token];
      // A decoder caught in a loop (on noise: "0000…", "the the the…") stops, keeping one repetition.
      const loop = repetition(tokens);
      if (loop > 0 || tokens.length >= this.maxTokens) {
        this.ended.push({ tokens: loop > 0 ? tokens.slice(0, tokens.length - loop) : tokens, logprob: c.logprob });
        continue;
      }
      alive.push({ tokens, logprob: c.logprob });
      rows.push({ from: c.from, token: c.token });
    }
    this.alive = alive;
    if (alive.length === 0 || this.ended.length >= this.width) this.done = true;
    while (rows.length < this.width) rows.push({ from: 0, token: END_TOKEN });
    if (this.done) return keep();
    return rows;
  }

  best(): Hypothesis {
    const all = this.ended.length > 0 ? this.ended : this.alive;
    return all.reduce((a, b) => (meanLogprob(b) > meanLogprob(a) ? b : a));
  }
}

/** A hypothesis's mean log-probability per token, its end included. */
export function meanLogprob(h: Hypothesis): number {
  return h.logprob / (h.tokens.length + 1);
}

/**
 * The joint next-token log-probabilities of several views' logits (each a row over the vocabulary):
 * each row's log-softmax, averaged over the rows, normalised again (a product of experts: a token
 * is likely only where every view finds it likely). One row: its log-softmax.
 */
export function jointLogprobs(
  rows: readonly Float32Array[],
  out: Float32Array = new Float32Array(rows[0]!.length),
  combine: Combine = "product",
): Float32Array {
  const n = rows.length;
  if (combine === "mixture" && n > 1) return mixtureLogprobs(rows, out);
  out.fill(0);
  for (const row of rows) {
    const norm = logSumExp(row);
    for (let i = 0; i < out.length; i++) out[i]! += (row[i]! - norm) / n;
  }
  if (n === 1) return out;
  const norm = logSumExp(out);
  for (let i = 0; i < out.length; i++) out[i]! -= norm;
  return out;
}

/** How the views' distributions are combined: `product` (log-probabilities averaged, normalised) or `mixture` (probabilities averaged). */
export type Combine = "product" | "mixture";

/** The views' probabilities averaged, as log-probabilities (a mixture: a token is likely where some view finds it likely). */
function mixtureLogprobs(rows: readonly Float32Array[], out: Float32Array): Float32Array {
  const norms = rows.map((row) => logSumExp(row));
  for (let i = 0; i < out.length; i++) {
    let max = Number.NEGATIVE_INFINITY;
    for (let r = 0; r < rows.length; r++) max = Math.max(max, rows[r]![i]! - norms[r]!);
    let sum = 0;
    for (let r = 0; r < rows.length; r++) sum += Math.exp(rows[r]![i]! - norms[r]! - max);
    out[i] = max + Math.log(sum / rows.length);
  }
  return out;
}

export function logSumExp(x: Float32Array): number {
  let max = Number.NEGATIVE_INFINITY;
  for (let i = 0; i < x.length; i++) if (x[i]! > max) max = x[i]!;
  let sum = 0;
  for (let i = 0; i < x.length; i++) sum += Math.exp(x[i]! - max);
  return max + Math.log(sum);
}

/** The indices of the `k` largest values, largest first. */
export function topTokens(logits: Float32Array, k: number): number[] {
  const top: number[] = [];
  for (let i = 0; i < logits.length; i++) {
    if (top.length === k && logits[i]! <= logits[top[k - 1]!]!) continue;
    let at = top.length < k ? top.length : k - 1;
    top[at] = i;
    while (at > 0 && logits[top[at - 1]!]! < logits[i]!) {
      top[at] = top[at - 1]!;
      top[at - 1] = i;
      at--;
    }
  }
  return top;
}

/**
 * Where each row of the next step comes from, for `utterances` × `beams` × `views` rows laid out as
 * row ((u·beams + b)·views + k): beam b of utterance u continuing beam `chosen[u][b].from` keeps
 * its views together (view k's cache row follows view k's).
 */
export function ensembleSources(chosen: readonly (readonly Continuation[])[], beams: number, views: number): { source: number[]; next: number[] } {
  const source: number[] = [];
  const next: number[] = [];
  chosen.forEach((rows, u) => {
    for (let b = 0; b < beams; b++)
      for (let k = 0; k < views; k++) {
        source.push((u * beams + rows[b]!.from) * views + k);
        next.push(rows[b]!.token);
      }
  });
  return { source, next };
}

/** One step of a decoder over all rows: each row's next-token logits, [rows × vocabulary]. */
export interface DecoderStep {
  logits: Float32Array;
  vocabulary: number;
}

/**
 * The joint search of `maxTokens.length` utterances, `beams` beams each, `views` rows a beam (rows
 * laid out as ensembleSources says): `run` feeds each row its next token (START_TOKEN at step 0)
 * and gives the logits; `reorder` is then told where each row of the next step comes from (the
 * decoder's cache must follow). The best hypothesis of each utterance.
 */
export async function decodeJointly(o: {
  maxTokens: readonly number[];
  beams: number;
  views: number;
  combine?: Combine;
  run: (next: readonly number[], step: number) => Promise<DecoderStep>;
  reorder: (source: readonly number[], step: number) => void;
}): Promise<Hypothesis[]> {
  const { beams, views } = o;
  const rows = o.maxTokens.length * beams * views;
  const searches = o.maxTokens.map((max) => new BeamSearch(beams, max));
  let next: readonly number[] = new Array<number>(rows).fill(START_TOKEN);
  let joint: Float32Array | undefined;
  for (let step = 0; step < Math.max(...o.maxTokens) && searches.some((s) => !s.done); step++) {
    const { logits, vocabulary } = await o.run(next, step);
    joint ??= new Float32Array(vocabulary);
    const out = joint;
    const row = (r: number) => logits.subarray(r * vocabulary, (r + 1) * vocabulary);
    // Each beam goes on from a beam of the same utterance, on its views' joint distribution.
    const chosen = searches.map((search, u) =>
      search.step(step, (b) =>
        jointLogprobs(
          Array.from({ length: views }, (_, v) => row((u * beams + b) * views + v)),
          out,
          o.combine,
        ),
      ),
    );
    const sources = ensembleSources(chosen, beams, views);
    next = sources.next;
    o.reorder(sources.source, step);
  }
  return searches.map((s) => s.best());
}

/** How many tokens at the end repeat a phrase of 1–4 tokens already said at least 4 times in a row (0 when none). */
export function repetition(tokens: readonly number[]): number {
  for (let n = 1; n <= 4; n++) {
    let times = 1;
    while (n * (times + 1) <= tokens.length && sameRun(tokens, n, times)) times++;
    if (times >= 4 && n * times >= 8) return n * (times - 1);
  }
  return 0;
}

/** Whether the n tokens before the last `times` phrases of n equal the last phrase. */
function sameRun(tokens: readonly number[], n: number, times: number): boolean {
  const end = tokens.length;
  for (let i = 0; i < n; i++) if (tokens[end - n + i] !== tokens[end - n * (times + 1) + i]) return false;
  return true;
}
