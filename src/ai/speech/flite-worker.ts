/**
 * A worker thread of a WorkerPool (src/workers/pool.ts) that runs flite (compiled to WASI) for one text
 * at a time, so that synthesis never blocks the event loop. Instantiating the module costs 10–40 ms (its memory image is
 * large), so the next instance is prepared as soon as a job is answered, before it is needed.
 */
import { openSync, readFileSync, rmSync } from "node:fs";
import { devNull } from "node:os";
import { join } from "node:path";
import { parentPort, workerData } from "node:worker_threads";
import { jobError, type PoolJob, type PoolMessage, readyMessage } from "../../workers/pool.ts";

// node:wasi warns that it is experimental in every thread that loads it; the server's log needs
// no such line per worker.
const emitWarning = process.emitWarning;
process.emitWarning = ((warning: string | Error, ...rest: unknown[]) => {
  if (!String(warning).includes("WASI")) (emitWarning as (...a: unknown[]) => void).call(process, warning, ...rest);
}) as typeof process.emitWarning;
const { WASI } = await import("node:wasi");
process.emitWarning = emitWarning;

export interface FliteJob {
  /** flite's arguments after the program name, without `-o`. */
  args: string[];
}

export interface FliteResult {
  pcm: ArrayBuffer;
  sampleRate: number;
}

export interface FliteWorkerData {
  module: WebAssembly.Module;
  /** A directory private to this process, where flite writes its WAV files. */
  dir: string;
}

interface Prepared {
  wasi: InstanceType<typeof WASI>;
  instance: WebAssembly.Instance;
  argv: Buffer[];
}

const { module, dir } = workerData as FliteWorkerData;
const nullFd = openSync(devNull, "w");

// WASI fixes the arguments when it is constructed; serving args_get ourselves lets an instance be
// made before its job is known.
function prepare(): Prepared {
  const wasi = new WASI({ version: "preview1", args: [], env: {}, preopens: { "/out": dir }, returnOnExit: true, stdout: nullFd, stderr: nullFd });
  const base = wasi.getImportObject() as { wasi_snapshot_preview1: Record<string, unknown> };
  let memory: WebAssembly.Memory | undefined;
  const prepared = { wasi, argv: [] as Buffer[] } as Prepared;
  const imports = {
    wasi_snapshot_preview1: {
      ...base.wasi_snapshot_preview1,
      args_sizes_get: (countPtr: number, sizePtr: number) => {
        const view = new DataView(memory!.buffer);
        view.setUint32(countPtr, prepared.argv.length, true);
        view.setUint32(
          sizePtr,
          prepared.argv.reduce((n, a) => n + a.length, 0),
          true,
        );
        return 0;
      },
      args_get: (argvPtr: number, bufPtr: number) => {
        const view = new DataView(memory!.buffer);
        const bytes = new Uint8Array(memory!.buffer);
        let at = bufPtr;
        prepared.argv.forEach((arg, i) => {
          view.setUint32(argvPtr + 4 * i, at, true);
          bytes.set(arg, at);
          at += arg.length;
        });
        return 0;
      },
    },
  };
  prepared.instance = new WebAssembly.Instance(module, imports as WebAssembly.Imports);
  memory = prepared.instance.exports.memory as WebAssembly.Memory;
  return prepared;
}

/** The samples and rate of a 16-bit mono RIFF/WAVE file. */
function readWav(file: Buffer): { pcm: ArrayBuffer; sampleRate: number } {
  if (file.toString("latin1", 0, 4) !== "RIFF" || file.toString("latin1", 8, 12) !== "WAVE") throw new Error("flite wrote no WAVE file");
  let sampleRate = 0;
  for (let at = 12; at + 8 <= file.length; ) {
    const id = file.toString("latin1", at, at + 4);
    const size = file.readUInt32LE(at + 4);
    const body = at + 8;
    if (id === "fmt ") {
      if (file.readUInt16LE(body + 2) !== 1 || file.readUInt16LE(body + 14) !== 16) throw new Error("flite wrote other than 16-bit mono");
      sampleRate = file.readUInt32LE(body + 4);
    } else if (id === "data") {
      const end = Math.min(file.length, body + size);
      const pcm = new ArrayBuffer(end - body - ((end - body) % 2));
      file.copy(new Uint8Array(pcm), 0, body, body + pcm.byteLength);
      return { pcm, sampleRate };
    }
    at = body + size + (size % 2);
  }
  throw new Error("flite wrote a WAVE file without data");
}

const port = parentPort!;
let spare: Prepared;
try {
  spare = prepare();
} catch (error) {
  port.postMessage({ type: "failed", error: error instanceof Error ? error.message : String(error) } satisfies PoolMessage<FliteResult>);
  throw error;
}

port.on("message", ({ id, request }: PoolJob<FliteJob>) => {
  const current = spare;
  const name = `${id}.wav`;
  current.argv = ["flite", ...request.args, "-o", `/out/${name}`].map((a) => Buffer.from(`${a}\0`));
  try {
    const code = current.wasi.start(current.instance);
    if (code !== 0) throw new Error(`flite exited with status ${code}`);
    const { pcm, sampleRate } = readWav(readFileSync(join(dir, name)));
    port.postMessage({ type: "done", id, result: { pcm, sampleRate } } satisfies PoolMessage<FliteResult>, [pcm]);
  } catch (error) {
    port.postMessage(jobError(id, error) satisfies PoolMessage<FliteResult>);
  } finally {
    rmSync(join(dir, name), { force: true });
  }
  spare = prepare();
});
port.postMessage(readyMessage() satisfies PoolMessage<FliteResult>);
