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
 * `GET /me/status`; here a line is only appended to a list. Pending lines are written at exit too,
 * by this batcher's own exit hook, until its node closes it (`close`): no process-wide list of batchers.
 */
export class BatchedLines implements DestinationStream {
  private readonly sink: LineSink;
  private readonly batchChars: number;
  private lines: string[] = [];
  private chars = 0;
  private closed = false;
  private readonly atExit = () => {
    try {
      this.flushSync();
    } catch {
      // Standard output is gone (a closed pipe): nothing more can be written.
    }
  };

  constructor(sink: LineSink, batchChars = 4096) {
    this.sink = sink;
    this.batchChars = batchChars;
    process.once("exit", this.atExit);
  }

  write(line: string): boolean {
    this.lines.push(line);
    this.chars += line.length;
    if (this.closed || this.chars >= this.batchChars) this.hand();
    return true;
  }

  /** Its node closed: what is pending is handed on, a later line at once, and the exit hook is removed. */
  close(): void {
    this.closed = true;
    this.hand();
    process.off("exit", this.atExit);
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
