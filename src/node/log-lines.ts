import type { DestinationStream } from "pino";

/** What `BatchedLines` hands its batches to: pino's own destination (sonic-boom). */
export interface LineSink {
  write(text: string): unknown;
  flush(cb?: (err?: Error) => void): void;
  flushSync(): void;
}

/**
 * The log's lines gathered in front of pino's destination and handed to it a batch at a time
 * (at `batchChars` characters, and at each flush). sonic-boom measures the bytes of everything it
 * holds (`Buffer.byteLength`) at every write: at one write per line that cost about 3 % of a
 * `GET /me/status`; here a line is only appended to a list. Pending lines are written at exit too.
 */
export class BatchedLines implements DestinationStream {
  private readonly sink: LineSink;
  private readonly batchChars: number;
  private lines: string[] = [];
  private chars = 0;

  constructor(sink: LineSink, batchChars = 4096) {
    this.sink = sink;
    this.batchChars = batchChars;
    flushedAtExit(this);
  }

  write(line: string): boolean {
    this.lines.push(line);
    this.chars += line.length;
    if (this.chars >= this.batchChars) this.hand();
    return true;
  }

  flush(cb?: (err?: Error) => void): void {
    this.hand();
    this.sink.flush(cb);
  }

  flushSync(): void {
    this.hand();
    this.sink.flushSync();
  }

  private hand(): void {
    if (this.lines.length === 0) return;
    const text = this.lines.length === 1 ? (this.lines[0] as string) : this.lines.join("");
    this.lines = [];
    this.chars = 0;
    this.sink.write(text);
  }
}

/** Every batcher made in this process, held weakly (a process may make many nodes: tests do). */
const batchers = new Set<WeakRef<BatchedLines>>();

function flushedAtExit(lines: BatchedLines): void {
  if (batchers.size === 0) {
    process.once("exit", () => {
      for (const ref of batchers) {
        try {
          ref.deref()?.flushSync();
        } catch {
          // Standard output is gone (a closed pipe): nothing more can be written.
        }
      }
    });
  }
  for (const ref of batchers) if (ref.deref() === undefined) batchers.delete(ref);
  batchers.add(new WeakRef(lines));
}
