import { StoreUnavailable } from "../store/errors.ts";
import type { TelemetrySample } from "./telemetry.ts";

/**
 * Why the writer dropped frames: `overload`, its buffer was full while the store was up (it is not
 * keeping up); `store_unavailable`, its buffer was full while the store was unreachable; `store_error`,
 * the store refused a peer's samples for a reason that retrying does not fix.
 */
export type WriteDropReason = "overload" | "store_unavailable" | "store_error";

export interface TelemetrySink {
  recordMany(batch: Array<{ publicKey: string; samples: TelemetrySample[] }>): Promise<void>;
}

export interface TelemetryWriterOptions {
  sink: TelemetrySink;
  /** Frames stored: count them as accepted now. */
  onStored: (frames: number) => void;
  /** Frames dropped, by reason. */
  onDropped: (reason: WriteDropReason, frames: number) => void;
  /** A write failed (logged; what it held is retried or dropped and counted). */
  onError: (err: unknown) => void;
  /** Samples held in memory, waiting or being written; frames beyond are dropped (default 100,000). */
  bufferSamples?: number;
  /** A write at most this often while few samples wait (default 250 ms)... */
  intervalMs?: number;
  /**
   * ...or at once when this many wait (default 5,000: with many devices, a batch of a few hundred
   * samples held about one frame per peer, and each peer costs its own statements in the batch).
   */
  maxSamples?: number;
  /** Samples one transaction writes at most (whole peers; default 5,000): a backlog after an outage goes in several. */
  maxBatchSamples?: number;
  /** Retries after an unreachable store: first wait, doubled up to the last (default 100 ms to 5 s, with jitter). */
  retryMinMs?: number;
  retryMaxMs?: number;
}

interface Entry {
  samples: TelemetrySample[];
  frames: number;
}

/**
 * Batches telemetry writes: one transaction every `intervalMs`, or at once when `maxSamples` are
 * waiting. A frame counts as accepted once stored. While the store is unreachable, frames wait in
 * memory (up to `bufferSamples`) and are written when it returns, retried with back-off; frames
 * beyond the bound are dropped and counted. A write the store refuses for another reason is retried
 * peer by peer, so only the peer whose samples fail loses them.
 */
export class TelemetryWriter {
  private queue = new Map<string, Entry>();
  /** Samples waiting or being written. */
  private held = 0;
  /** Samples waiting (in `queue`). */
  private queued = 0;
  private writing: Promise<void> | undefined;
  private timer: NodeJS.Timeout | undefined;
  private backoff: number;
  private unreachable = false;
  private closed = false;
  private readonly o: Required<TelemetryWriterOptions>;

  constructor(o: TelemetryWriterOptions) {
    this.o = { bufferSamples: 100_000, intervalMs: 250, maxSamples: 5_000, maxBatchSamples: 5_000, retryMinMs: 100, retryMaxMs: 5_000, ...o };
    this.backoff = this.o.retryMinMs;
  }

  /** Whether the last write found the store unreachable (frames wait for it). */
  get waitingForStore(): boolean {
    return this.unreachable;
  }

  /** Samples held now (waiting or being written). */
  get heldSamples(): number {
    return this.held;
  }

  /** Queues one frame's samples; false when the buffer is full (the frame is dropped and counted). */
  add(publicKey: string, samples: TelemetrySample[]): boolean {
    if (this.closed || this.held + samples.length > this.o.bufferSamples) {
      this.o.onDropped(this.unreachable ? "store_unavailable" : "overload", 1);
      return false;
    }
    const entry = this.queue.get(publicKey);
    if (entry) {
      entry.samples.push(...samples);
      entry.frames++;
    } else this.queue.set(publicKey, { samples, frames: 1 });
    this.held += samples.length;
    this.queued += samples.length;
    if (this.unreachable) return true; // the retry timer writes it
    if (this.queued >= this.o.maxSamples && !this.writing) void this.flush();
    else this.timer ??= setTimeout(() => void this.flush(), this.o.intervalMs);
    return true;
  }

  /**
   * Writes what is queued; resolves once every sample queued before the call is stored, dropped,
   * or (the store being unreachable) back in the queue for the next retry.
   */
  flush(): Promise<void> {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    if (this.writing) return this.writing.then(() => this.flush());
    if (this.queue.size === 0) return Promise.resolve();
    this.writing = this.writeAll().finally(() => {
      this.writing = undefined;
    });
    return this.writing;
  }

  /** Flushes, trying the store once more if it is unreachable; what cannot be written then is dropped and counted. */
  async close(): Promise<void> {
    this.closed = true;
    await this.flush();
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    const left = [...this.queue.values()].reduce((n, e) => n + e.frames, 0);
    if (left > 0) this.o.onDropped("store_unavailable", left);
    this.queue.clear();
    this.held = 0;
    this.queued = 0;
  }

  /** Writes batches until the queue is empty or the store is unreachable (then a retry is scheduled). */
  private async writeAll(): Promise<void> {
    while (this.queue.size > 0) {
      const unwritten = await this.write(this.take());
      if (unwritten.length > 0) {
        // Back in front of what arrived meanwhile, in arrival order.
        const rest = this.queue;
        this.queue = new Map(unwritten);
        for (const [, e] of unwritten) this.queued += e.samples.length;
        for (const [key, e] of rest) {
          const mine = this.queue.get(key);
          if (mine) {
            mine.samples.push(...e.samples);
            mine.frames += e.frames;
          } else this.queue.set(key, e);
        }
        if (!this.closed) this.scheduleRetry();
        return;
      }
    }
  }

  /** Whole peers from the front of the queue, up to `maxBatchSamples` (at least one peer). */
  private take(): Array<[string, Entry]> {
    const batch: Array<[string, Entry]> = [];
    let samples = 0;
    for (const [key, e] of this.queue) {
      if (batch.length > 0 && samples + e.samples.length > this.o.maxBatchSamples) break;
      batch.push([key, e]);
      samples += e.samples.length;
      this.queue.delete(key);
      this.queued -= e.samples.length;
    }
    return batch;
  }

  /** Writes a batch; returns what must wait for the store to be reachable again (nothing of it is lost). */
  private async write(batch: Array<[string, Entry]>): Promise<Array<[string, Entry]>> {
    try {
      await this.o.sink.recordMany(batch.map(([publicKey, e]) => ({ publicKey, samples: e.samples })));
      this.stored(batch);
      return [];
    } catch (err) {
      this.o.onError(err);
      if (err instanceof StoreUnavailable) return batch;
      if (batch.length === 1) {
        this.refused(batch);
        return [];
      }
    }
    // Refused for another reason: peer by peer, so that only the one at fault loses its frames.
    for (const [i, item] of batch.entries()) {
      try {
        await this.o.sink.recordMany([{ publicKey: item[0], samples: item[1].samples }]);
        this.stored([item]);
      } catch (err) {
        this.o.onError(err);
        if (err instanceof StoreUnavailable) return batch.slice(i);
        this.refused([item]);
      }
    }
    return [];
  }

  private stored(batch: Array<[string, Entry]>): void {
    this.settled(batch);
    this.o.onStored(frames(batch));
  }

  private refused(batch: Array<[string, Entry]>): void {
    this.settled(batch);
    this.o.onDropped("store_error", frames(batch));
  }

  private settled(batch: Array<[string, Entry]>): void {
    for (const [, e] of batch) this.held -= e.samples.length;
    this.unreachable = false;
    this.backoff = this.o.retryMinMs;
  }

  private scheduleRetry(): void {
    this.unreachable = true;
    const wait = this.backoff * (0.5 + Math.random() / 2);
    this.backoff = Math.min(this.o.retryMaxMs, this.backoff * 2);
    this.timer ??= setTimeout(() => void this.flush(), wait);
  }
}

function frames(batch: Array<[string, Entry]>): number {
  return batch.reduce((n, [, e]) => n + e.frames, 0);
}
