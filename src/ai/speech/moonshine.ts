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
import { type Combine, type DecoderStep, decodeJointly, END_TOKEN, jointLogprobs, meanLogprob, START_TOKEN } from "./beam-search.ts";
import { IDENTITY, renderView, type View } from "./views.ts";

/**
 * The two sizes in the package: base (8 decoder layers, 8 key/value heads of 52 dimensions, about
 * 62 MB int8) for every job, tiny (6 layers, 8 heads of 36, about 28 MB) for conversation turns when
 * base would answer too late (recogniser.ts). The shape is read from the decoder's inputs.
 */
export type MoonshineSize = "base" | "tiny";
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
  async score(audio: Float32Array, texts: readonly string[], o: Pick<DecodeOptions, "views" | "prepare"> = {}): Promise<number[][]> {
    if (texts.length === 0 || audio.length < MOONSHINE_SAMPLE_RATE / 10) return texts.map(() => [Number.NEGATIVE_INFINITY]);
    // Heard as the recognition heard it: every view (views.ts), the tokens' log-probabilities on their joint distribution.
    const views = o.views && o.views.length > 0 ? o.views : [IDENTITY];
    const k = views.length;
    const prepare = o.prepare ?? ((a: Float32Array) => a);
    const seen = await Promise.all(views.map(async (view) => prepare(await renderView(audio, view))));
    const input = new Float32Array(k * audio.length);
    for (const [v, a] of seen.entries()) input.set(a, v * audio.length);
    const encoded = (await this.encoder.run({ input_values: new ort.Tensor("float32", input, [k, audio.length]) })).last_hidden_state!;
    // Row t·k + v: text t heard in view v.
    const rows = texts.length * k;
    const tokens = texts.map((t) => llamaTokenizer.encode(t, false, true).filter((id) => id < this.vocabulary));
    const length = Math.max(...tokens.map((t) => t.length)) + 1;
    // Each row: the start token, the text's tokens, then its end (what follows the end is never read).
    const ids = new BigInt64Array(rows * length).fill(BigInt(END_TOKEN));
    for (let r = 0; r < rows; r++) {
      const t = tokens[Math.floor(r / k)]!;
      ids[r * length] = BigInt(START_TOKEN);
      for (const [i, id] of t.entries()) ids[r * length + i + 1] = BigInt(id);
    }
    const { layers, heads, headDim } = this.shape;
    const empty = new ort.Tensor("float32", new Float32Array(0), [rows, heads, 0, headDim]);
    const past: Record<string, ort.Tensor> = {};
    for (let layer = 0; layer < layers; layer++)
      for (const side of ["decoder", "encoder"]) for (const kind of ["key", "value"]) past[`past_key_values.${layer}.${side}.${kind}`] = empty;
    const result = await this.decoder.run({
      input_ids: new ort.Tensor("int64", ids, [rows, length]),
      encoder_hidden_states:
        rows === k
          ? encoded
          : pickRows(
              encoded,
              Array.from({ length: rows }, (_, r) => r % k),
            ),
      use_cache_branch: new ort.Tensor("bool", Uint8Array.of(0), [1]),
      ...past,
    });
    const logits = result.logits!.data as Float32Array;
    const vocabulary = result.logits!.dims.at(-1)!;
    const joint = new Float32Array(vocabulary);
    return tokens.map((t, text) =>
      Array.from({ length: t.length + 1 }, (_, i) => {
        const at = (v: number) => {
          const r = text * k + v;
          return logits.subarray((r * length + i) * vocabulary, (r * length + i + 1) * vocabulary);
        };
        return jointLogprobs(
          Array.from({ length: k }, (_, v) => at(v)),
          joint,
        )[i < t.length ? t[i]! : END_TOKEN]!;
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
   *
   * With `views` (views.ts), each utterance is heard several ways, each view a row of the encoder's
   * batch; every beam then has one decoder row per view, and its next token is chosen on the views'
   * joint distribution (beam-search.ts), so that all of a beam's rows say the same tokens.
   */
  async transcribeBatch(audios: readonly Float32Array[], o: DecodeOptions = {}): Promise<Heard[]> {
    const beams = Math.max(1, Math.floor(o.beams ?? 1));
    const views = o.views && o.views.length > 0 ? o.views : [IDENTITY];
    const k = views.length;
    // Less than ~0.1 s is nothing the model can hear (and its convolutions need some samples).
    const heard = audios.flatMap((audio, i) => (audio.length >= MOONSHINE_SAMPLE_RATE / 10 ? [i] : []));
    const out: Heard[] = audios.map(() => ({ text: "", logprob: 0 }));
    if (heard.length === 0) return out;
    const n = heard.length;
    // Encoder rows: utterance u's view v at row u·k + v.
    const prepare = o.prepare ?? ((a: Float32Array) => a);
    const seen = await Promise.all(heard.flatMap((i) => views.map(async (view) => prepare(await renderView(audios[i]!, view)))));
    const maxTokens = heard.map((i) => Math.max(4, Math.ceil((audios[i]!.length / MOONSHINE_SAMPLE_RATE) * TOKENS_PER_SECOND)));
    const rows = await this.jointRows(seen, n, beams, k);
    const best = await decodeJointly({
      maxTokens,
      beams,
      views: k,
      ...(o.combine ? { combine: o.combine } : {}),
      run: (next, step) => rows.run(next, step),
      reorder: (source, step) => rows.reorder(source, step),
    });
    heard.forEach((i, u) => {
      const hypothesis = best[u]!;
      out[i] = {
        // Ids past the Llama vocabulary (Moonshine pads it to 32768) are never text.
        text: llamaTokenizer
          .decode(
            hypothesis.tokens.filter((t) => t < this.vocabulary),
            false,
            true,
          )
          .trim(),
        logprob: hypothesis.tokens.length > 0 ? meanLogprob(hypothesis) : 0,
      };
    });
    return out;
  }

  /**
   * The model's side of a joint decoding: `seen` (n utterances × k views, each row u·k + v) encoded
   * at once, padded to the longest, and a decoder of n × beams × k rows with its cache.
   */
  private async jointRows(seen: readonly Float32Array[], n: number, beams: number, k: number): Promise<JointRows> {
    const longest = Math.max(...seen.map((a) => a.length));
    const input = new Float32Array(seen.length * longest);
    for (const [row, audio] of seen.entries()) input.set(audio, row * longest);
    const encoded = (await this.encoder.run({ input_values: new ort.Tensor("float32", input, [seen.length, longest]) })).last_hidden_state!;
    // Decoder rows: utterance u's beam b's view v at row (u·beams + b)·k + v.
    const rows = n * beams * k;
    const hidden =
      rows === seen.length
        ? encoded
        : pickRows(
            encoded,
            Array.from({ length: rows }, (_, row) => Math.floor(row / (beams * k)) * k + (row % k)),
          );
    const past: Record<string, ort.Tensor> = {};
    const { layers, heads, headDim } = this.shape;
    const empty = new ort.Tensor("float32", new Float32Array(0), [rows, heads, 0, headDim]);
    for (let layer = 0; layer < layers; layer++)
      for (const side of ["decoder", "encoder"]) for (const kind of ["key", "value"]) past[`past_key_values.${layer}.${side}.${kind}`] = empty;
    let result: ort.InferenceSession.OnnxValueMapType = {};
    return {
      rows,
      run: async (next, step) => {
        result = await this.decoder.run({
          input_ids: new ort.Tensor("int64", BigInt64Array.from(next, BigInt), [rows, 1]),
          encoder_hidden_states: hidden,
          use_cache_branch: new ort.Tensor("bool", Uint8Array.of(step > 0 ? 1 : 0), [1]),
          ...past,
        });
        return { logits: result.logits!.data as Float32Array, vocabulary: result.logits!.dims.at(-1)! };
      },
      reorder: (source, step) => {
        const moved = source.some((from, r) => from !== r);
        // The decoder's own cache grows every step; the cross-attention cache is computed once, at step 0.
        for (let layer = 0; layer < layers; layer++) {
          for (const kind of ["key", "value"]) {
            const own = result[`present.${layer}.decoder.${kind}`]!;
            past[`past_key_values.${layer}.decoder.${kind}`] = moved ? pickRows(own, source) : own;
            if (step === 0) past[`past_key_values.${layer}.encoder.${kind}`] = result[`present.${layer}.encoder.${kind}`]!;
          }
        }
      },
    };
  }
}

/** A joint decoding's rows in the model: a step of its decoder, and its cache's rows reordered. */
interface JointRows {
  rows: number;
  run(next: readonly number[], step: number): Promise<DecoderStep>;
  reorder(source: readonly number[], step: number): void;
}

export interface DecodeOptions {
  /** Hypotheses kept at each step (beam search); 1 (the default) is greedy. */
  beams?: number;
  /** The ways each utterance is heard, decoded jointly (views.ts); default: the audio as it is. */
  views?: readonly View[];
  /** What is done to each view before the encoder hears it (the front end). */
  prepare?: (audio: Float32Array) => Float32Array;
  /** How the views' distributions are combined: their log-probabilities averaged (`product`, the default) or their probabilities (`mixture`). */
  combine?: Combine;
}

/** An utterance's text and the model's mean log-probability per token of it (its end included): how sure it is. */
export interface Heard {
  text: string;
  logprob: number;
  /** Which model heard it, when the recogniser says (a conversation's batch may run on tiny). */
  model?: MoonshineSize;
  /** The views it was heard in (views.ts), when the recogniser says: its sure-words scores are taken in the same. */
  views?: View[];
}

/** A tensor whose row i is row `source[i]` of `t` ([source.length, …]). */
function pickRows(t: ort.Tensor, source: readonly number[]): ort.Tensor {
  const data = t.data as Float32Array;
  const size = data.length / t.dims[0]!;
  const out = new Float32Array(source.length * size);
  source.forEach((from, row) => {
    out.set(data.subarray(from * size, (from + 1) * size), row * size);
  });
  return new ort.Tensor("float32", out, [source.length, ...t.dims.slice(1)]);
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
