import { availableParallelism, totalmem } from "node:os";

/** A recogniser process holds Moonshine base and tiny: 350–580 MB resident once warm (README). */
const GIB = 1024 ** 3;

/**
 * How many recogniser processes a node starts when its configuration does not say: two on a
 * machine with at least 2 cores and 4 GiB of memory (a burst of turns is recognised on both cores
 * at once, in two batches, and a file's transcription never holds the conversations' process),
 * else one. More than two add memory and little speed on the machines measured (docs/decisions.md).
 */
export function defaultRecogniserProcesses(machine: { cores: number; memoryBytes: number }): number {
  return machine.cores >= 2 && machine.memoryBytes >= 4 * GIB ? 2 : 1;
}

/** This machine's cores and memory. */
export function thisMachine(): { cores: number; memoryBytes: number } {
  return { cores: availableParallelism(), memoryBytes: totalmem() };
}
