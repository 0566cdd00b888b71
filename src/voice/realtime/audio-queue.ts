/**
 * A realtime reply's audio waiting for playback: the model's deltas (often a few hundred bytes
 * each, tens of thousands of them when it speaks faster than real time) are copied into blocks of
 * BLOCK_BYTES, one item's audio per block, so that the queue holds a few hundred entries at most
 * and taking the next costs the same however much waits. Bounded by the caller (`bytes`).
 */

/** 100 ms of 24 kHz 16-bit audio. */
export const BLOCK_BYTES = 4_800;

export interface AudioBlock<T> {
  tag: T;
  bytes: Buffer;
}

interface Block<T> {
  tag: T;
  buf: Buffer;
  len: number;
}

export class AudioQueue<T> {
  private blocks: Array<Block<T>> = [];
  private head = 0;
  private total = 0;

  /** Bytes waiting. */
  get bytes(): number {
    return this.total;
  }

  /** Queues `bytes` (an even length) for `tag`: appended to the last block when it is the same tag's and has room. */
  push(tag: T, bytes: Buffer): void {
    let at = 0;
    while (at < bytes.length) {
      let last = this.blocks.length > this.head ? this.blocks[this.blocks.length - 1]! : undefined;
      if (!last || last.tag !== tag || last.len === last.buf.length) {
        last = { tag, buf: Buffer.allocUnsafe(BLOCK_BYTES), len: 0 };
        this.blocks.push(last);
      }
      const n = Math.min(bytes.length - at, last.buf.length - last.len);
      bytes.copy(last.buf, last.len, at, at + n);
      last.len += n;
      at += n;
    }
    this.total += bytes.length;
  }

  /** The oldest block (possibly still partly filled: what is there is taken), or undefined when empty. */
  shift(): AudioBlock<T> | undefined {
    if (this.head >= this.blocks.length) return undefined;
    const b = this.blocks[this.head]!;
    this.blocks[this.head] = undefined as never;
    this.head++;
    // Taken blocks are dropped from the array now and then, not one by one.
    if (this.head >= 64 && this.head * 2 >= this.blocks.length) {
      this.blocks = this.blocks.slice(this.head);
      this.head = 0;
    }
    this.total -= b.len;
    return { tag: b.tag, bytes: b.buf.subarray(0, b.len) };
  }

  clear(): void {
    this.blocks = [];
    this.head = 0;
    this.total = 0;
  }
}
