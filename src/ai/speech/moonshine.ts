/**
 * Moonshine base (Useful Sensors, MIT licence): English speech recognition from the int8 ONNX files
 * that ship inside `@usefulsensors/moonshine-js` (pinned at exactly 0.1.15 — later versions add a
 * model under a non-commercial licence). Our own loader on `onnxruntime-node`: the encoder runs once
 * over the audio, then the merged decoder one token a step (beam search, or greedily), with its key/value cache;
 * tokens are decoded with `llama-tokenizer-js` (Moonshine's vocabulary is Llama's SentencePiece one).
 *
 * Inference is synchronous on the calling thread (onnxruntime-node runs a session on the thread
 * that calls it), so this module is only loaded inside a worker thread (recognition-worker.ts).
 */
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import llamaTokenizer from "llama-tokenizer-js";
import * as ort from "onnxruntime-node";

/**
 * The two sizes in the package: base (8 decoder layers, 8 key/value heads of 52 dimensions, about
 * 62 MB int8) for every job, tiny (6 layers, 8 heads of 36, about 28 MB) for conversation turns when
 * base would answer too late (recogniser.ts). The shape is read from the decoder's inputs.
 */
export type MoonshineSize = "base" | "tiny";
const START_TOKEN = 1;
const END_TOKEN = 2;
/** Moonshine is trained on 16 kHz mono audio of 0.1 s to 64 s (it does best below ~30 s). */
export const MOONSHINE_SAMPLE_RATE = 16_000;
/**
 * The model card's bound on output length: speech rarely carries more than ~6.5 tokens a second, and
 * a decoder that repeats itself (on noise, for instance) must stop.
 */
const TOKENS_PER_SECOND = 6.5;

/** The directory of an int8 model inside the npm package. */
export function moonshineModelDir(size: MoonshineSize = "base"): string {
  // The package's only export is its browser bundle (never loaded: it is only resolved), in dist/ beside the models.
  const bundle = fileURLToPath(import.meta.resolve("@usefulsensors/moonshine-js"));
  return join(dirname(bundle), "model", size, "quantized");
}

/** Decoder layers, key/value heads and their dimension. */
interface DecoderShape {
  layers: number;
  heads: number;
  headDim: number;
}

export interface MoonshineOptions {
  /** Threads for one inference (onnxruntime's intra-op pool). */
  threads: number;
}

export class MoonshineModel {
  private readonly encoder: ort.InferenceSession;
  private readonly decoder: ort.InferenceSession;
  private readonly vocabulary: number;
  private readonly shape: DecoderShape;

  private constructor(encoder: ort.InferenceSession, decoder: ort.InferenceSession) {
    this.encoder = encoder;
    this.decoder = decoder;
    this.vocabulary = llamaTokenizer.vocabById.length;
    this.shape = decoderShape(decoder);
  }

  static async load(options: MoonshineOptions, dir = moonshineModelDir()): Promise<MoonshineModel> {
    const session: ort.InferenceSession.SessionOptions = {
      intraOpNumThreads: options.threads,
      interOpNumThreads: 1,
      graphOptimizationLevel: "all",
      executionProviders: ["cpu"],
    };
    const encoder = await ort.InferenceSession.create(join(dir, "encoder_model.onnx"), session);
    const decoder = await ort.InferenceSession.create(join(dir, "decoder_model_merged.onnx"), session);
    return new MoonshineModel(encoder, decoder);
  }

  /** The text spoken in `audio` (16 kHz mono, -1..1), as the model writes it (cased and punctuated). */
  async transcribe(audio: Float32Array, o: DecodeOptions = {}): Promise<string> {
    return (await this.transcribeBatch([audio], o))[0]!.text;
  }

  /**
   * How likely the model finds each of `texts` as the words of `audio` (16 kHz mono, -1..1): the mean
   * log-probability per token, its end included, as `Heard.logprob` counts it, teacher-forced (the
   * decoder reads each text's tokens in one pass, no search, no cache). Compared with the free
   * decode's, it tells whether the model would as soon have written a backchannel ("Mm-hmm.") as
   * the words it heard in half a hum.
   */
  async score(audio: Float32Array, texts: readonly string[]): Promise<number[][]> {
    if (texts.length === 0 || audio.length < MOONSHINE_SAMPLE_RATE / 10) return texts.map(() => [Number.NEGATIVE_INFINITY]);
    const encoded = (await this.encoder.run({ input_values: new ort.Tensor("float32", audio, [1, audio.length]) })).last_hidden_state!;
    const rows = texts.length;
    const tokens = texts.map((t) => llamaTokenizer.encode(t, false, true).filter((id) => id < this.vocabulary));
    const length = Math.max(...tokens.map((t) => t.length)) + 1;
    // Each row: the start token, the text's tokens, then its end (what follows the end is never read).
    const ids = new BigInt64Array(rows * length).fill(BigInt(END_TOKEN));
    tokens.forEach((t, r) => {
      ids[r * length] = BigInt(START_TOKEN);
      for (const [i, id] of t.entries()) ids[r * length + i + 1] = BigInt(id);
    });
    const { layers, heads, headDim } = this.shape;
    const empty = new ort.Tensor("float32", new Float32Array(0), [rows, heads, 0, headDim]);
    const past: Record<string, ort.Tensor> = {};
    for (let layer = 0; layer < layers; layer++)
      for (const side of ["decoder", "encoder"]) for (const kind of ["key", "value"]) past[`past_key_values.${layer}.${side}.${kind}`] = empty;
    const result = await this.decoder.run({
      input_ids: new ort.Tensor("int64", ids, [rows, length]),
      encoder_hidden_states: rows === 1 ? encoded : repeatRows(encoded, rows),
      use_cache_branch: new ort.Tensor("bool", Uint8Array.of(0), [1]),
      ...past,
    });
    const logits = result.logits!.data as Float32Array;
    const vocabulary = result.logits!.dims.at(-1)!;
    return tokens.map((t, r) =>
      Array.from({ length: t.length + 1 }, (_, i) => {
        const at = logits.subarray((r * length + i) * vocabulary, (r * length + i + 1) * vocabulary);
        return at[i < t.length ? t[i]! : END_TOKEN]! - logSumExp(at);
      }),
    );
  }

  /**
   * The texts of several utterances in one pass: the encoder over all of them at once (each padded
   * with silence to the longest, as every utterance is padded at its edges anyway), then the
   * decoder one token a step for all that have not ended, `beams` hypotheses each (beam search:
   * the most likely token sequence, not the most likely token at each step; 1 is greedy). On a CPU
   * a step costs little more for four rows than for one, so a queue of turns is answered in a
   * fraction of the time, and a few beams cost little more than one.
   */
  async transcribeBatch(audios: readonly Float32Array[], o: DecodeOptions = {}): Promise<Heard[]> {
    const beams = Math.max(1, Math.floor(o.beams ?? 1));
    // Less than ~0.1 s is nothing the model can hear (and its convolutions need some samples).
    const heard = audios.flatMap((audio, i) => (audio.length >= MOONSHINE_SAMPLE_RATE / 10 ? [i] : []));
    const out: Heard[] = audios.map(() => ({ text: "", logprob: 0 }));
    if (heard.length === 0) return out;
    const n = heard.length;
    const longest = Math.max(...heard.map((i) => audios[i]!.length));
    const input = new Float32Array(n * longest);
    for (const [row, i] of heard.entries()) input.set(audios[i]!, row * longest);
    const maxTokens = heard.map((i) => Math.max(4, Math.ceil((audios[i]!.length / MOONSHINE_SAMPLE_RATE) * TOKENS_PER_SECOND)));
    const encoded = (await this.encoder.run({ input_values: new ort.Tensor("float32", input, [n, longest]) })).last_hidden_state!;
    // Each utterance's encoding repeated for its beams: row u·beams + b.
    const hidden = beams === 1 ? encoded : repeatRows(encoded, beams);
    const rows = n * beams;
    const past: Record<string, ort.Tensor> = {};
    const { layers, heads, headDim } = this.shape;
    const empty = new ort.Tensor("float32", new Float32Array(0), [rows, heads, 0, headDim]);
    for (let layer = 0; layer < layers; layer++)
      for (const side of ["decoder", "encoder"]) for (const kind of ["key", "value"]) past[`past_key_values.${layer}.${side}.${kind}`] = empty;
    const searches = heard.map((_, u) => new BeamSearch(beams, maxTokens[u]!));
    const next = new Array<number>(rows).fill(START_TOKEN);
    for (let step = 0; step < Math.max(...maxTokens) && searches.some((s) => !s.done); step++) {
      const result = await this.decoder.run({
        input_ids: new ort.Tensor("int64", BigInt64Array.from(next, BigInt), [rows, 1]),
        encoder_hidden_states: hidden,
        use_cache_branch: new ort.Tensor("bool", Uint8Array.of(step > 0 ? 1 : 0), [1]),
        ...past,
      });
      const logits = result.logits!.data as Float32Array;
      const vocabulary = result.logits!.dims.at(-1)!;
      // Each row's beam goes on from a beam of the same utterance: the rows of the cache follow.
      const source = new Array<number>(rows);
      searches.forEach((search, u) => {
        const chosen = search.step(step, (b) => logits.subarray((u * beams + b) * vocabulary, (u * beams + b + 1) * vocabulary));
        for (let b = 0; b < beams; b++) {
          source[u * beams + b] = u * beams + chosen[b]!.from;
          next[u * beams + b] = chosen[b]!.token;
        }
      });
      const reorder = source.some((from, row) => from !== row);
      // The decoder's own cache grows every step; the cross-attention cache is computed once, at step 0.
      for (let layer = 0; layer < layers; layer++) {
        for (const kind of ["key", "value"]) {
          const own = result[`present.${layer}.decoder.${kind}`]!;
          past[`past_key_values.${layer}.decoder.${kind}`] = reorder ? gatherRows(own, source) : own;
          if (step === 0) past[`past_key_values.${layer}.encoder.${kind}`] = result[`present.${layer}.encoder.${kind}`]!;
        }
      }
    }
    heard.forEach((i, u) => {
      const best = searches[u]!.best();
      out[i] = {
        // Ids past the Llama vocabulary (Moonshine pads it to 32768) are never text.
        text: llamaTokenizer
          .decode(
            best.tokens.filter((t) => t < this.vocabulary),
            false,
            true,
          )
          .trim(),
        logprob: best.tokens.length > 0 ? best.logprob / (best.tokens.length + 1) : 0,
      };
    });
    return out;
  }
}

export interface DecodeOptions {
  /** Hypotheses kept at each step (beam search); 1 (the default) is greedy. */
  beams?: number;
}

/** An utterance's text and the model's mean log-probability per token of it (its end included): how sure it is. */
export interface Heard {
  text: string;
  logprob: number;
  /** Which model heard it, when the recogniser says (a conversation's batch may run on tiny). */
  model?: MoonshineSize;
}

interface Hypothesis {
  tokens: number[];
  /** Sum of the tokens' log-probabilities. */
  logprob: number;
}

/**
 * One utterance's beam search: `width` hypotheses go on at each step, the best continuations of
 * all of them; a hypothesis that ends (its end token, a loop, the length bound) is put aside, and
 * the search is done once `width` have ended or none left can beat the best that ended (by mean
 * log-probability per token, so that short and long texts compare).
 */
class BeamSearch {
  private readonly width: number;
  private readonly maxTokens: number;
  private alive: Hypothesis[] = [{ tokens: [], logprob: 0 }];
  private readonly ended: Hypothesis[] = [];
  done = false;

  constructor(width: number, maxTokens: number) {
    this.width = width;
    this.maxTokens = maxTokens;
  }

  /** The next token of each of the `width` rows, and the row (beam) it continues. */
  step(step: number, logitsOf: (beam: number) => Float32Array): Array<{ from: number; token: number }> {
    const keep = (): Array<{ from: number; token: number }> => Array.from({ length: this.width }, (_, b) => ({ from: b, token: END_TOKEN }));
    if (this.done) return keep();
    const candidates: Array<{ from: number; token: number; logprob: number }> = [];
    // At the first step every row is the same start: only the first is expanded.
    const live = step === 0 ? 1 : this.alive.length;
    for (let b = 0; b < live; b++) {
      const logits = logitsOf(b);
      const norm = logSumExp(logits);
      for (const token of topTokens(logits, this.width + 1)) candidates.push({ from: b, token, logprob: this.alive[b]!.logprob + logits[token]! - norm });
    }
    candidates.sort((a, b) => b.logprob - a.logprob);
    const alive: Hypothesis[] = [];
    const rows: Array<{ from: number; token: number }> = [];
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
    return all.reduce((a, b) => (mean(b) > mean(a) ? b : a));
  }
}

function mean(h: Hypothesis): number {
  return h.logprob / (h.tokens.length + 1);
}

function logSumExp(x: Float32Array): number {
  let max = Number.NEGATIVE_INFINITY;
  for (let i = 0; i < x.length; i++) if (x[i]! > max) max = x[i]!;
  let sum = 0;
  for (let i = 0; i < x.length; i++) sum += Math.exp(x[i]! - max);
  return max + Math.log(sum);
}

/** The indices of the `k` largest logits, largest first. */
function topTokens(logits: Float32Array, k: number): number[] {
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

/** A [n, …] tensor with each row repeated `times` times in place: [n·times, …]. */
function repeatRows(t: ort.Tensor, times: number): ort.Tensor {
  const data = t.data as Float32Array;
  const n = t.dims[0]!;
  const size = data.length / n;
  const out = new Float32Array(data.length * times);
  for (let r = 0; r < n; r++) for (let k = 0; k < times; k++) out.set(data.subarray(r * size, (r + 1) * size), (r * times + k) * size);
  return new ort.Tensor("float32", out, [n * times, ...t.dims.slice(1)]);
}

/** A [rows, …] tensor whose row i is row `source[i]` of `t`. */
function gatherRows(t: ort.Tensor, source: readonly number[]): ort.Tensor {
  const data = t.data as Float32Array;
  const size = data.length / t.dims[0]!;
  const out = new Float32Array(data.length);
  source.forEach((from, row) => {
    out.set(data.subarray(from * size, (from + 1) * size), row * size);
  });
  return new ort.Tensor("float32", out, t.dims);
}

/** The decoder's shape from its cache inputs (`past_key_values.<layer>.decoder.key`: [batch, heads, length, dim]). */
function decoderShape(decoder: ort.InferenceSession): DecoderShape {
  const layers = decoder.inputNames.filter((name) => /^past_key_values\.\d+\.decoder\.key$/.test(name)).length;
  const meta = decoder.inputMetadata.find((m) => m.name === "past_key_values.0.decoder.key");
  const dims = meta?.isTensor ? meta.shape : [];
  const heads = dims[1];
  const headDim = dims[3];
  if (layers === 0 || typeof heads !== "number" || typeof headDim !== "number") throw new Error("the Moonshine decoder's cache inputs are not as expected");
  return { layers, heads, headDim };
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
