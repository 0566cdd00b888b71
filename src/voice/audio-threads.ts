import { availableParallelism } from "node:os";
import { Worker } from "node:worker_threads";
import type { OpusRate } from "../audio/opus.ts";
import { type FromAudioThread, ITEM_SIZE, OUT, PACKET_HEADER, type ToAudioThread } from "./audio-wire.ts";

const WORKER = new URL("./audio-worker.ts", import.meta.url);
/** Threads by default: one a core, at most this many. */
const MAX_DEFAULT_THREADS = 4;

/** The default size of the pool: one thread a core, at most 4. */
export function defaultAudioThreads(): number {
  return Math.max(1, Math.min(MAX_DEFAULT_THREADS, availableParallelism()));
}

export interface ThreadUplinkOptions {
  payloadType: number;
  audioLevelId: number | undefined;
  /** The rate the samples come out at (the decoder's). */
  rate: OpusRate;
  /** The device's audio, in order (silence as zeros). */
  pcm: (samples: Int16Array) => void;
  /** Samples (48 kHz) the thread dropped for running ahead of real time. */
  overrun: (samples: number) => void;
  /** Packets decoded and silent (not decoded) since the last call. */
  counted: (decoded: number, silent: number) => void;
  /**
   * The thread that decoded this uplink ended (a crash): what was being heard is lost. The uplink
   * goes on at once on a fresh thread; the audio of the gap is missing.
   */
  failed: (err: Error) => void;
}

/** A conversation's uplink on an audio thread. */
export interface ThreadUplink {
  /** The index of the thread it is on now (tests and measurements). */
  readonly thread: number;
  /** One packet from the track (RTP or RTCP); it goes to the thread with the others of this turn of the event loop. */
  packet(bytes: Buffer): void;
  close(): void;
}

interface Entry {
  o: ThreadUplinkOptions;
  thread: AudioThread;
  /** Counts the thread last reported. */
  decoded: number;
  silent: number;
}

/**
 * The audio threads of a node: a small fixed pool of worker threads that decode the devices'
 * uplinks, each conversation assigned to the thread with the fewest, so that the main thread keeps
 * to signalling, the agents and the events. Packets are forwarded in one message per thread per
 * turn of the event loop; samples come back the same way. A thread that dies takes only its
 * conversations' audio of the moment (`failed`), and a fresh one takes its place and them.
 */
export class AudioThreads {
  readonly size: number;
  private readonly threads: AudioThread[];
  private readonly entries = new Map<number, Entry>();
  private readonly warn: (details: Record<string, unknown>, message: string) => void;
  private ids = 0;
  private closing = false;

  constructor(size: number, warn: (details: Record<string, unknown>, message: string) => void) {
    if (!Number.isInteger(size) || size < 1) throw new RangeError(`audio threads: at least 1, not ${size}`);
    this.size = size;
    this.warn = warn;
    this.threads = Array.from({ length: size }, () => this.start());
  }

  /** An uplink on the thread with the fewest conversations. */
  uplink(o: ThreadUplinkOptions): ThreadUplink {
    if (this.closing) throw new Error("the audio threads are closed");
    const id = ++this.ids;
    const thread = this.threads.reduce((a, b) => (b.conversations.size < a.conversations.size ? b : a));
    const entry: Entry = { o, thread, decoded: 0, silent: 0 };
    this.entries.set(id, entry);
    this.assign(id, entry, thread);
    const threads = this.threads;
    return {
      get thread() {
        const e = entry;
        return threads.indexOf(e.thread);
      },
      packet: (bytes) => {
        const e = this.entries.get(id);
        if (e) e.thread.queue(id, bytes);
      },
      close: () => {
        const e = this.entries.get(id);
        if (!e) return;
        this.entries.delete(id);
        e.thread.conversations.delete(id);
        e.thread.post({ t: "close", id });
      },
    };
  }

  /** The threads (tests and measurements): each one's conversations, and a way to end it as a crash would. */
  get workers(): Array<{ threadId: number; conversations: number; terminate(): Promise<void> }> {
    return this.threads.map((t) => ({
      threadId: t.worker.threadId,
      conversations: t.conversations.size,
      terminate: async () => {
        await t.worker.terminate();
      },
    }));
  }

  async close(): Promise<void> {
    this.closing = true;
    await Promise.all(this.threads.map((t) => t.worker.terminate().catch(() => {})));
  }

  private assign(id: number, entry: Entry, thread: AudioThread): void {
    entry.thread = thread;
    thread.conversations.add(id);
    const { payloadType, audioLevelId, rate } = entry.o;
    thread.post({ t: "open", id, payloadType, audioLevelId, rate });
  }

  private start(): AudioThread {
    const thread = new AudioThread(new Worker(WORKER));
    thread.worker.unref();
    thread.worker.on("message", (m: FromAudioThread) => this.received(thread, m));
    let gone = false;
    const lost = (err: Error) => {
      if (gone) return;
      gone = true;
      this.lost(thread, err);
    };
    thread.worker.on("error", lost);
    thread.worker.on("exit", (code) => lost(new Error(`the audio thread exited with code ${code}`)));
    return thread;
  }

  /** A thread ended: a fresh one takes its place and its conversations, which are told. */
  private lost(thread: AudioThread, err: Error): void {
    const i = this.threads.indexOf(thread);
    if (this.closing || i < 0) return;
    const fresh = this.start();
    this.threads[i] = fresh;
    const moved = [...thread.conversations];
    this.warn({ err: err.message, conversations: moved.length }, "an audio thread ended; its conversations go on on a fresh one");
    for (const id of moved) {
      const entry = this.entries.get(id);
      if (!entry) continue;
      entry.decoded = 0;
      entry.silent = 0;
      this.assign(id, entry, fresh);
      guard(() => entry.o.failed(err));
    }
  }

  private received(thread: AudioThread, m: FromAudioThread): void {
    const pcm = m.pcm ? new Int16Array(m.pcm) : undefined;
    const { items } = m;
    for (let i = 0; i + ITEM_SIZE <= items.length; i += ITEM_SIZE) {
      const entry = this.entries.get(items[i]!);
      // A conversation closed, or moved off a thread that ended, since.
      if (!entry || entry.thread !== thread) continue;
      const a = items[i + 2]!;
      const b = items[i + 3]!;
      switch (items[i + 1]) {
        case OUT.pcm:
          if (pcm) guard(() => entry.o.pcm(pcm.subarray(a, a + b)));
          break;
        case OUT.silence:
          guard(() => entry.o.pcm(new Int16Array(a)));
          break;
        case OUT.overrun:
          guard(() => entry.o.overrun(a));
          break;
        case OUT.counts: {
          const decoded = a - entry.decoded;
          const silent = b - entry.silent;
          entry.decoded = a;
          entry.silent = b;
          guard(() => entry.o.counted(decoded, silent));
          break;
        }
        case OUT.failed:
          guard(() => entry.o.failed(new Error("the audio thread could not open this conversation's decoder")));
          break;
      }
    }
  }
}

/** A callback of the conversation's failed: that is the conversation's to log; the others go on. */
function guard(fn: () => void): void {
  try {
    fn();
  } catch {}
}

class AudioThread {
  readonly worker: Worker;
  readonly conversations = new Set<number>();
  private readonly pending: Array<{ id: number; bytes: Buffer }> = [];
  private pendingBytes = 0;
  private scheduled = false;

  constructor(worker: Worker) {
    this.worker = worker;
  }

  post(m: ToAudioThread, transfer: ArrayBuffer[] = []): void {
    try {
      this.worker.postMessage(m, transfer);
    } catch {
      // The thread is ending: its conversations move to a fresh one.
    }
  }

  /** Queues a packet; the packets of this turn of the event loop go in one message. */
  queue(id: number, bytes: Buffer): void {
    if (bytes.length > 0xffff) return;
    this.pending.push({ id, bytes });
    this.pendingBytes += PACKET_HEADER + bytes.length;
    if (this.scheduled) return;
    this.scheduled = true;
    setImmediate(() => this.flush());
  }

  private flush(): void {
    this.scheduled = false;
    if (this.pending.length === 0) return;
    const data = new ArrayBuffer(this.pendingBytes);
    const out = Buffer.from(data);
    let at = 0;
    for (const { id, bytes } of this.pending) {
      out.writeUInt32LE(id, at);
      out.writeUInt16LE(bytes.length, at + 4);
      bytes.copy(out, at + PACKET_HEADER);
      at += PACKET_HEADER + bytes.length;
    }
    this.pending.length = 0;
    this.pendingBytes = 0;
    this.post({ t: "rtp", data }, [data]);
  }
}
