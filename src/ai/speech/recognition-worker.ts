/**
 * A worker thread holding one model — Moonshine (recognition) or Silero (voice activity) — loaded
 * once when the worker starts; it then runs one job at a time for a WorkerPool (worker-pool.ts).
 */
import { parentPort, type Transferable, workerData } from "node:worker_threads";
import { MoonshineModel } from "./moonshine.ts";
import { SileroVad, type VadState } from "./silero.ts";
import type { PoolJob, PoolMessage } from "./worker-pool.ts";

export type RecognitionWorkerData = { model: "moonshine"; threads: number } | { model: "silero" };

export type RecognitionRequest = { op: "transcribe"; audio: Float32Array } | { op: "vad"; audio: Float32Array; state: VadState };

export type RecognitionResult = { op: "transcribe"; text: string; ms: number } | { op: "vad"; probabilities: Float32Array; state: VadState };

const data = workerData as RecognitionWorkerData;
const port = parentPort!;
const post = (message: PoolMessage<RecognitionResult>, transfer: Transferable[] = []) => port.postMessage(message, transfer);

try {
  const moonshine = data.model === "moonshine" ? await MoonshineModel.load({ threads: data.threads }) : undefined;
  const silero = data.model === "silero" ? await SileroVad.load() : undefined;
  port.on("message", (job: PoolJob<RecognitionRequest>) => {
    void (async () => {
      try {
        const r = job.request;
        if (r.op === "transcribe") {
          if (!moonshine) throw new Error("this worker holds no recogniser");
          const started = performance.now();
          const text = await moonshine.transcribe(r.audio);
          post({ type: "done", id: job.id, result: { op: "transcribe", text, ms: performance.now() - started } });
        } else {
          if (!silero) throw new Error("this worker holds no voice activity detector");
          const { probabilities, state } = await silero.probabilities(r.audio, r.state);
          post({ type: "done", id: job.id, result: { op: "vad", probabilities, state } }, [probabilities.buffer as ArrayBuffer]);
        }
      } catch (error) {
        post({ type: "error", id: job.id, error: error instanceof Error ? error.message : String(error) });
      }
    })();
  });
  post({ type: "ready" });
} catch (error) {
  post({ type: "failed", error: error instanceof Error ? error.message : String(error) });
}
