import { availableParallelism } from "node:os";
import { Worker } from "node:worker_threads";
import type { OpusRate } from "../audio/opus.ts";
import { FRAME_HEADER, type FromAudioThread, ITEM_SIZE, OUT, PACKET_HEADER, type ToAudioThread } from "./audio-wire.ts";
import { FRAME_SAMPLES, type FrameEncoder } from "./opus.ts";

const WORKER = new URL("./audio-worker.ts", import.meta.url);
/** What comes for a thread within this many ms goes in one message. */
const FLUSH_MS = 10;
/** The wait before starting a thread again after threads that ended before they loaded: from this, doubling, up to the next. */
const RESTART_MIN_MS = 100;
const RESTART_MAX_MS = 5_000;
/** Each loaded thread is asked this often whether it answers (any message it sends is an answer). */
const HEARTBEAT_MS = 1_000;
/** A thread that sent nothing for this long though asked is stuck (alive, not answering): it is replaced. */
const STUCK_MS = 5_000;
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
  /** The uplink's hangover (src/voice/uplink.ts). */
  hangoverMs?: number | undefined;
  /** The device's audio, in order, with `silence`. */
  pcm: (samples: Int16Array) => void;
  /** Silence of `samples`, in its place among `pcm`'s. */
  silence: (samples: number) => void;
  /** Samples (48 kHz) the thread dropped for running ahead of real time. */
  overrun: (samples: number) => void;
  /** Packets decoded and silent (not decoded) since the last call. */
  counted: (decoded: number, silent: number) => void;
  /**
   * The thread that decoded this uplink and encoded its replies ended (a crash): what was being
   * heard and the frames being encoded are lost. Both go on at once on a fresh thread.
   */
  failed: (err: Error) => void;
}

/** A conversation's audio on an audio thread: its uplink decoded, its replies' frames encoded. */
export interface ThreadUplink extends FrameEncoder {
  /** The index of the thread it is on now (tests and measurements). */
  readonly thread: number;
  /** One packet from the track (RTP or RTCP); it goes to the thread with the others of this turn of the event loop. */
  packet(bytes: Buffer): void;
  close(): void;
}

interface Entry {
  o: ThreadUplinkOptions;
  thread: AudioThread;
  /** What gets each frame's packet, in the order the frames went to the thread. */
  encoded: Array<(opus: Buffer) => void>;
  /** Counts the thread last reported. */
  decoded: number;
  silent: number;
  /** Closed: kept until the thread's last counts come back (or the thread ends). */
  closing?: boolean;
}

export interface AudioThreadsOptions {
  /** The threads' module (tests: one that cannot start). */
  script?: URL;
  /** Runs `fn` after `ms` (tests: a fake timer); default an unref'd timer. */
  after?: (ms: number, fn: () => void) => void;
  /** The heartbeat's interval and how long without an answer makes a thread stuck (tests: shorter). */
  heartbeatMs?: number;
  stuckMs?: number;
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
  /** Reply frames encoded on the threads (tests and measurements). */
  framesEncoded = 0;
  private readonly threads: AudioThread[];
  private readonly entries = new Map<number, Entry>();
  private readonly warn: (details: Record<string, unknown>, message: string) => void;
  private ids = 0;
  private closing = false;
  private readonly script: URL;
  private readonly after: (ms: number, fn: () => void) => void;
  /** Threads that ended before they loaded, in a row: each next start waits longer. */
  private failedStarts = 0;
  private readonly heartbeat: NodeJS.Timeout;
  private readonly stuckMs: number;

  constructor(size: number, warn: (details: Record<string, unknown>, message: string) => void, o: AudioThreadsOptions = {}) {
    if (!Number.isInteger(size) || size < 1) throw new RangeError(`audio threads: at least 1, not ${size}`);
    this.size = size;
    this.warn = warn;
    this.script = o.script ?? WORKER;
    this.after = o.after ?? ((ms, fn) => setTimeout(fn, ms).unref());
    this.threads = Array.from({ length: size }, () => this.start());
    this.stuckMs = o.stuckMs ?? STUCK_MS;
    this.heartbeat = setInterval(() => this.beat(), o.heartbeatMs ?? HEARTBEAT_MS);
    this.heartbeat.unref();
  }

  /**
   * Asks each loaded thread whether it answers; one that sent nothing for `stuckMs` (a loop that
   * never yields, a decoder that hangs) is ended and replaced as if it had crashed: its
   * conversations' turns in progress fail with the contract's events and go on on a fresh thread.
   */
  private beat(): void {
    const now = performance.now();
    for (const thread of this.threads) {
      if (!thread.loaded || thread.ended) continue;
      if (now - thread.heardAt > this.stuckMs) {
        thread.fail(new Error(`the audio thread answered nothing for ${Math.round(now - thread.heardAt)} ms (stuck)`));
        void thread.worker.terminate().catch(() => {});
        continue;
      }
      thread.post({ t: "ping" });
    }
  }

  /** An uplink on the thread with the fewest conversations. */
  uplink(o: ThreadUplinkOptions): ThreadUplink {
    if (this.closing) throw new Error("the audio threads are closed");
    const id = ++this.ids;
    // A thread that ended and waits to be started again takes none while another can.
    const live = this.threads.filter((t) => !t.ended);
    const thread = (live.length > 0 ? live : this.threads).reduce((a, b) => (b.conversations.size < a.conversations.size ? b : a));
    const entry: Entry = { o, thread, encoded: [], decoded: 0, silent: 0 };
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
        if (e && !e.closing) e.thread.queue(id, bytes);
      },
      frame: (pcm, encoded, urgent) => {
        const e = this.entries.get(id);
        if (!e || e.closing || pcm.length !== FRAME_SAMPLES) return;
        // Its thread ended and the next one is not started yet: the frame is not encoded (never awaited).
        if (e.thread.ended) return encoded(Buffer.alloc(0));
        e.encoded.push(encoded);
        e.thread.queueFrame(id, pcm, urgent === true);
      },
      close: () => {
        const e = this.entries.get(id);
        if (!e || e.closing) return;
        // Kept until the thread says it closed it, with the packets counted since its last report.
        e.closing = true;
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
    clearInterval(this.heartbeat);
    await Promise.all(this.threads.map((t) => t.worker.terminate().catch(() => {})));
  }

  private assign(id: number, entry: Entry, thread: AudioThread): void {
    entry.thread = thread;
    thread.conversations.add(id);
    const { payloadType, audioLevelId, rate, hangoverMs } = entry.o;
    thread.post({ t: "open", id, payloadType, audioLevelId, rate, hangoverMs });
  }

  private start(): AudioThread {
    const thread = new AudioThread(new Worker(this.script));
    thread.worker.unref();
    thread.worker.on("message", (m: FromAudioThread) => this.received(thread, m));
    let gone = false;
    const lost = (err: Error) => {
      if (gone) return;
      gone = true;
      this.lost(thread, err);
    };
    thread.fail = lost;
    thread.worker.on("error", lost);
    thread.worker.on("exit", (code) => lost(new Error(`the audio thread exited with code ${code}`)));
    return thread;
  }

  /**
   * A thread ended: a fresh one takes its place and its conversations, which are told. At once,
   * unless threads keep ending before they load (their module cannot start: a loop of starts would
   * take the cores): then after 100 ms, doubling up to 5 s, as WorkerPool does.
   */
  private lost(thread: AudioThread, err: Error): void {
    const i = this.threads.indexOf(thread);
    if (this.closing || i < 0) return;
    thread.ended = true;
    const moved = [...thread.conversations];
    this.warn({ err: err.message, conversations: moved.length }, "an audio thread ended; its conversations go on on a fresh one");
    // Conversations closed on it whose last counts it will never send.
    for (const [id, entry] of this.entries) if (entry.closing && entry.thread === thread) this.entries.delete(id);
    for (const id of moved) {
      const entry = this.entries.get(id);
      if (!entry) continue;
      entry.decoded = 0;
      entry.silent = 0;
      // Frames the thread was encoding never get their packets: the reply fails (`failed`).
      entry.encoded.length = 0;
      guard(() => entry.o.failed(err));
    }
    const failed = this.failedStarts;
    if (!thread.loaded) this.failedStarts++;
    const wait = thread.loaded || failed === 0 ? 0 : Math.min(RESTART_MAX_MS, RESTART_MIN_MS * 2 ** (failed - 1));
    const replace = () => {
      if (this.closing || this.threads[i] !== thread) return;
      const fresh = this.start();
      this.threads[i] = fresh;
      for (const id of thread.conversations) {
        const entry = this.entries.get(id);
        if (entry && !entry.closing) this.assign(id, entry, fresh);
      }
    };
    if (wait === 0) replace();
    else this.after(wait, replace);
  }

  private received(thread: AudioThread, m: FromAudioThread): void {
    // Its first message (empty) says it loaded.
    thread.heardAt = performance.now();
    if (!thread.loaded) {
      thread.loaded = true;
      this.failedStarts = 0;
    }
    if (thread.ended) return;
    const pcm = m.pcm ? new Int16Array(m.pcm) : undefined;
    const opus = m.opus ? Buffer.from(m.opus) : undefined;
    const { items } = m;
    for (let i = 0; i + ITEM_SIZE <= items.length; i += ITEM_SIZE) {
      const entry = this.entries.get(items[i]!);
      // A conversation closed, or moved off a thread that ended, since.
      if (!entry || entry.thread !== thread) continue;
      const kind = items[i + 1];
      // A conversation that closed hears nothing more; only its counts come in.
      if (entry.closing && kind !== OUT.counts && kind !== OUT.closed) continue;
      const a = items[i + 2]!;
      const b = items[i + 3]!;
      switch (kind) {
        case OUT.pcm:
          if (pcm) guard(() => entry.o.pcm(pcm.subarray(a, a + b)));
          break;
        case OUT.silence:
          guard(() => entry.o.silence(a));
          break;
        case OUT.overrun:
          guard(() => entry.o.overrun(a));
          break;
        case OUT.counts:
        case OUT.closed: {
          const decoded = Math.max(0, a - entry.decoded);
          const silent = Math.max(0, b - entry.silent);
          entry.decoded = Math.max(entry.decoded, a);
          entry.silent = Math.max(entry.silent, b);
          if (decoded > 0 || silent > 0) guard(() => entry.o.counted(decoded, silent));
          if (kind === OUT.closed) this.entries.delete(items[i]!);
          break;
        }
        case OUT.opus: {
          const encoded = entry.encoded.shift();
          if (b > 0) this.framesEncoded++;
          if (encoded) guard(() => encoded(opus && b > 0 ? opus.subarray(a, a + b) : Buffer.alloc(0)));
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
  /** It said it loaded (its first message). */
  loaded = false;
  /** It ended (its conversations wait for the next thread, or are on it already). */
  ended = false;
  /** When it last sent anything (performance.now()). */
  heardAt = performance.now();
  /** Ends it as a crash would (once). */
  fail: (err: Error) => void = () => {};
  private readonly pending: Array<{ id: number; bytes: Buffer }> = [];
  private pendingBytes = 0;
  private readonly frames: Array<{ id: number; pcm: Int16Array }> = [];
  private scheduled: false | "now" | "later" = false;
  private timer: NodeJS.Timeout | undefined;
  private flushedAt = Number.NEGATIVE_INFINITY;

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

  /** Queues a packet; what comes in one turn of the event loop goes in one message. */
  queue(id: number, bytes: Buffer): void {
    if (bytes.length > 0xffff) return;
    this.pending.push({ id, bytes });
    this.pendingBytes += PACKET_HEADER + bytes.length;
    this.schedule();
  }

  /** Queues a reply frame to encode; an urgent one (a reply's first) goes at the next turn of the event loop. */
  queueFrame(id: number, pcm: Int16Array, urgent: boolean): void {
    this.frames.push({ id, pcm });
    this.schedule(urgent);
  }

  /**
   * At once (the next turn of the event loop) when the last message went FLUSH_MS ago or more, else
   * at FLUSH_MS after it: under load, what comes in FLUSH_MS goes in one message (node-datachannel
   * hands packets in turns of their own, and a message per packet costs the main thread more than
   * decoding them costs the thread).
   */
  private schedule(urgent = false): void {
    if (this.scheduled === "now" || (this.scheduled === "later" && !urgent)) return;
    const wait = urgent ? 0 : this.flushedAt + FLUSH_MS - performance.now();
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    if (wait <= 0) {
      this.scheduled = "now";
      setImmediate(() => this.flush());
    } else {
      this.scheduled = "later";
      this.timer = setTimeout(() => this.flush(), wait);
    }
  }

  private flush(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.scheduled = false;
    this.flushedAt = performance.now();
    let rtp: ArrayBuffer | undefined;
    if (this.pending.length > 0) {
      rtp = new ArrayBuffer(this.pendingBytes);
      const out = Buffer.from(rtp);
      let at = 0;
      for (const { id, bytes } of this.pending) {
        out.writeUInt32LE(id, at);
        out.writeUInt16LE(bytes.length, at + 4);
        bytes.copy(out, at + PACKET_HEADER);
        at += PACKET_HEADER + bytes.length;
      }
      this.pending.length = 0;
      this.pendingBytes = 0;
    }
    let frames: ArrayBuffer | undefined;
    if (this.frames.length > 0) {
      const size = FRAME_HEADER + FRAME_SAMPLES * 2;
      frames = new ArrayBuffer(this.frames.length * size);
      const view = new DataView(frames);
      this.frames.forEach(({ id, pcm }, i) => {
        view.setUint32(i * size, id, true);
        new Int16Array(frames!, i * size + FRAME_HEADER, FRAME_SAMPLES).set(pcm);
      });
      this.frames.length = 0;
    }
    if (rtp || frames) this.post({ t: "in", rtp, frames }, [...(rtp ? [rtp] : []), ...(frames ? [frames] : [])]);
  }
}
