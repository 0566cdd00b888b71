/**
 * Moonshine base (Useful Sensors, MIT licence): English speech recognition from the int8 ONNX files
 * that ship inside `@usefulsensors/moonshine-js` (pinned at exactly 0.1.15 — later versions add a
 * model under a non-commercial licence). Our own loader on `onnxruntime-node`: the encoder runs once
 * over the audio, then the merged decoder greedily, one token a step, with its key/value cache;
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
  async transcribe(audio: Float32Array): Promise<string> {
    return (await this.transcribeBatch([audio]))[0]!;
  }

  /**
   * The texts of several utterances in one pass: the encoder over all of them at once (each padded
   * with silence to the longest, as every utterance is padded at its edges anyway), then the
   * decoder one token a step for all that have not ended. On a CPU a step costs little more for
   * four utterances than for one, so a queue of turns is answered in a fraction of the time.
   */
  async transcribeBatch(audios: readonly Float32Array[]): Promise<string[]> {
    // Less than ~0.1 s is nothing the model can hear (and its convolutions need some samples).
    const heard = audios.flatMap((audio, i) => (audio.length >= MOONSHINE_SAMPLE_RATE / 10 ? [i] : []));
    const texts = audios.map(() => "");
    if (heard.length === 0) return texts;
    const n = heard.length;
    const longest = Math.max(...heard.map((i) => audios[i]!.length));
    const input = new Float32Array(n * longest);
    for (const [row, i] of heard.entries()) input.set(audios[i]!, row * longest);
    const maxTokens = heard.map((i) => Math.max(4, Math.ceil((audios[i]!.length / MOONSHINE_SAMPLE_RATE) * TOKENS_PER_SECOND)));
    const { last_hidden_state: hidden } = await this.encoder.run({ input_values: new ort.Tensor("float32", input, [n, longest]) });
    const past: Record<string, ort.Tensor> = {};
    const { layers, heads, headDim } = this.shape;
    const empty = new ort.Tensor("float32", new Float32Array(0), [n, heads, 0, headDim]);
    for (let layer = 0; layer < layers; layer++)
      for (const side of ["decoder", "encoder"]) for (const kind of ["key", "value"]) past[`past_key_values.${layer}.${side}.${kind}`] = empty;
    const tokens: number[][] = heard.map(() => []);
    const ended = heard.map(() => false);
    let next = heard.map(() => START_TOKEN);
    for (let step = 0; step < Math.max(...maxTokens) && ended.includes(false); step++) {
      const out = await this.decoder.run({
        input_ids: new ort.Tensor("int64", BigInt64Array.from(next, BigInt), [n, 1]),
        encoder_hidden_states: hidden!,
        use_cache_branch: new ort.Tensor("bool", Uint8Array.of(step > 0 ? 1 : 0), [1]),
        ...past,
      });
      const logits = out.logits!.data as Float32Array;
      const vocabulary = out.logits!.dims.at(-1)!;
      next = heard.map((_, row) => argMax(logits, row * vocabulary, vocabulary));
      next.forEach((token, row) => {
        if (ended[row]) return;
        const own = tokens[row]!;
        if (token === END_TOKEN) {
          ended[row] = true;
          return;
        }
        own.push(token);
        // A decoder caught in a loop (on noise: "0000…", "the the the…") stops, keeping one repetition.
        const loop = repetition(own);
        if (loop > 0) own.length -= loop;
        if (loop > 0 || own.length >= maxTokens[row]!) ended[row] = true;
      });
      // The decoder's own cache grows every step; the cross-attention cache is computed once, at step 0.
      for (let layer = 0; layer < layers; layer++) {
        for (const kind of ["key", "value"]) {
          past[`past_key_values.${layer}.decoder.${kind}`] = out[`present.${layer}.decoder.${kind}`]!;
          if (step === 0) past[`past_key_values.${layer}.encoder.${kind}`] = out[`present.${layer}.encoder.${kind}`]!;
        }
      }
    }
    // Ids past the Llama vocabulary (Moonshine pads it to 32768) are never text.
    heard.forEach((i, row) => {
      texts[i] = llamaTokenizer
        .decode(
          tokens[row]!.filter((t) => t < this.vocabulary),
          false,
          true,
        )
        .trim();
    });
    return texts;
  }
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

/** The index of the largest of `length` logits from `from`. */
function argMax(logits: Float32Array, from: number, length: number): number {
  let best = from;
  for (let i = from + 1; i < from + length; i++) if (logits[i]! > logits[best]!) best = i;
  return best - from;
}
