/**
 * A child process holding one model — Moonshine (recognition) or Silero (voice activity) — loaded
 * once when it starts; it then runs one job at a time for a WorkerPool (src/workers/pool.ts). A process,
 * not a thread: onnxruntime-node aborts the whole process when a thread holding a session is
 * terminated (as at the server's exit), and a crash here must never take the server down.
 */

import { jobError, type PoolJob, type PoolMessage } from "../../workers/pool.ts";
import type { Combine } from "./beam-search.ts";
import { type FrontEndOptions, frontEnd } from "./front-end.ts";
import { type Heard, MoonshineModel, moonshineModelDir } from "./moonshine.ts";
import { SileroVad, type VadItem, type VadResult } from "./silero.ts";
import type { View } from "./views.ts";

/** `fast`: Moonshine tiny is loaded beside base, for conversation turns that base would answer too late. */
export type RecognitionWorkerData = { model: "moonshine"; threads: number; fast?: boolean; dir?: string } | { model: "silero" };

/**
 * `transcribe`: one utterance per entry of `audios`, recognised in one batch (by tiny when `fast`
 * and the process holds it); `vad`: one stream per item, scored in one batch.
 */
export type RecognitionRequest =
  | { op: "transcribe"; audios: Float32Array[]; fast?: boolean; beams?: number; views?: View[]; frontEnd?: FrontEndOptions | false; combine?: Combine }
  | { op: "score"; audio: Float32Array; texts: string[]; fast?: boolean; views?: View[]; frontEnd?: FrontEndOptions | false }
  | { op: "vad"; items: VadItem[] };

/**
 * `model`: which Moonshine recognised the batch; `heard`: each utterance's text and how sure the model
 * is of it; `scores`: each text's mean log-probability per token for the audio (MoonshineModel.score; by tiny when `fast` and the process holds it).
 */
export type RecognitionResult =
  | { op: "transcribe"; heard: Heard[]; ms: number; model: "base" | "tiny" }
  | { op: "score"; scores: number[] }
  | { op: "vad"; results: VadResult[] };

const data = JSON.parse(process.env.PERCH_WORKER_DATA ?? "null") as RecognitionWorkerData;
// With a callback, a send to a parent that has just gone (EPIPE) is reported there instead of as
// an unhandled 'error' event; the 'disconnect' handler below then ends this process.
const post = (message: PoolMessage<RecognitionResult>) => {
  if (process.connected) process.send?.(message, undefined, undefined, () => {});
};
// The server is gone (exited, killed): so is this process.
process.on("disconnect", () => process.exit(0));

try {
  const moonshine = data.model === "moonshine" ? await MoonshineModel.load({ threads: data.threads }, data.dir) : undefined;
  // Tiny is a help, not a need: without it every turn is recognised by base.
  const tiny =
    data.model === "moonshine" && data.fast
      ? await MoonshineModel.load({ threads: data.threads }, moonshineModelDir("tiny")).catch((error: unknown) => {
          process.stderr.write(
            `Moonshine tiny could not be loaded; conversation turns use base only (${error instanceof Error ? error.message : String(error)})\n`,
          );
          return undefined;
        })
      : undefined;
  const silero = data.model === "silero" ? await SileroVad.load() : undefined;
  process.on("message", (message) => {
    const job = message as PoolJob<RecognitionRequest>;
    void (async () => {
      try {
        const r = job.request;
        if (r.op === "transcribe") {
          if (!moonshine) throw new Error("this worker holds no recogniser");
          const started = performance.now();
          const model = r.fast && tiny ? "tiny" : "base";
          const heard = await (model === "tiny" ? tiny! : moonshine).transcribeBatch(r.audios, {
            ...(r.beams !== undefined ? { beams: r.beams } : {}),
            ...(r.views !== undefined ? { views: r.views } : {}),
            ...(r.frontEnd ? { prepare: (audio: Float32Array) => frontEnd(audio, r.frontEnd as FrontEndOptions) } : {}),
            ...(r.combine ? { combine: r.combine } : {}),
          });
          post({ type: "done", id: job.id, result: { op: "transcribe", heard, ms: performance.now() - started, model } });
        } else if (r.op === "score") {
          if (!moonshine) throw new Error("this worker holds no recogniser");
          const scores = (
            await (r.fast && tiny ? tiny : moonshine).score(r.audio, r.texts, {
              ...(r.views !== undefined ? { views: r.views } : {}),
              ...(r.frontEnd ? { prepare: (audio: Float32Array) => frontEnd(audio, r.frontEnd as FrontEndOptions) } : {}),
            })
          ).map((tokens) => tokens.reduce((a, b) => a + b, 0) / tokens.length);
          post({ type: "done", id: job.id, result: { op: "score", scores } });
        } else {
          if (!silero) throw new Error("this worker holds no voice activity detector");
          post({ type: "done", id: job.id, result: { op: "vad", results: await silero.probabilitiesBatch(r.items) } });
        }
      } catch (error) {
        post(jobError(job.id, error));
      }
    })();
  });
  post({ type: "ready" });
} catch (error) {
  post({ type: "failed", error: error instanceof Error ? error.message : String(error) });
}
