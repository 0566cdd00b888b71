import { systemClock, type VoiceClock } from "./clock.ts";
import { FRAME_MS, FRAME_SAMPLES, type FrameEncoder } from "./opus.ts";

/**
 * Frames are sent up to this long before their time (the contract allows 100 ms): the device's
 * jitter buffer holds them, and a stall of the event loop shorter than this makes no frame late.
 */
const LEAD_MS = 80;
/** A frame sent later than its time by more than this is late (`perch_voice_frames_late_total`). */
const LATE_MS = 20;
/** Further behind than this (the event loop was held), the clock is re-anchored instead of sending a burst to catch up. */
const REANCHOR_MS = 100;

export interface PlayoutOptions {
  /** Encodes the reply's frames. */
  codec: FrameEncoder;
  /** Sends one Opus frame; `first` marks the first of the reply (the RTP marker bit). */
  send: (opus: Buffer, first: boolean) => boolean;
  /** A frame went out more than 20 ms after its time. */
  late?: () => void;
  /** The first frame went out. */
  started?: () => void;
  /** The conversation's clock (default the system's). */
  clock?: VoiceClock;
  /** Only the time from this (the timers stay the system's). */
  now?: () => number;
  /**
   * false: while less than a frame waits and more is to come, nothing is sent (the clock waits for
   * the audio) instead of silence keeping the time: every frame sent is the reply's own audio, as a
   * realtime model's truncation at what was sent needs (voice.md §6). Default true.
   */
  fillGaps?: boolean;
}

/**
 * One reply's audio on its way to the device: 48 kHz samples in, 20 ms Opus frames out, each at
 * its time on the monotonic clock (frame k at start + 20·k ms, so timer delays never accumulate),
 * at most 40 ms ahead, never in a burst. While the reply is still being synthesised and nothing is
 * queued, silence keeps the stream's timing; `played` counts only the reply's own samples sent.
 */
export class Playout {
  /** Samples of the reply (not filler silence) sent so far. */
  played = 0;
  /** Frames sent, and how many of them late. */
  frames = 0;
  lateFrames = 0;
  private readonly o: PlayoutOptions;
  private readonly clock: VoiceClock;
  private readonly queue: Int16Array[] = [];
  private head = 0;
  private queued = 0;
  private ended = false;
  private stopped = false;
  private paused = false;
  /** The next frame starts a talkspurt again (the RTP marker): the first after a resume. */
  private marker = false;
  private anchor: number | undefined;
  /** No frame is scheduled: the playout waits for audio (fillGaps false). */
  private waiting = false;
  /** Frames given to the encoder and not yet sent. */
  private inflight = 0;
  /** Everything is queued to the encoder: the playout finishes when the last frame is sent. */
  private draining = false;
  private index = 0;
  private timer: (() => void) | undefined;
  /** Writers waiting for the queue to shrink (back-pressure). */
  private waiters: Array<{ samples: number; resolve: () => void }> = [];
  private finished!: (played: number) => void;
  /** Resolves with the samples played once everything is sent, or at `stop()`. */
  readonly done: Promise<number>;

  constructor(o: PlayoutOptions) {
    this.o = o;
    this.clock = o.clock ?? (o.now ? { ...systemClock, now: o.now } : systemClock);
    this.done = new Promise((resolve) => {
      this.finished = resolve;
    });
  }

  get active(): boolean {
    return !this.stopped;
  }

  /** Samples written and not yet sent. */
  get queuedSamples(): number {
    return this.queued;
  }

  /** Resolves once at most `samples` wait to be sent (at once if so already), or the playout stopped. */
  room(samples: number): Promise<void> {
    if (this.stopped || this.queued <= samples) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push({ samples, resolve }));
  }

  /** Queues samples (48 kHz); the first write starts the clock. */
  write(pcm: Int16Array): void {
    if (this.stopped || this.ended || pcm.length === 0) return;
    this.queue.push(pcm);
    this.queued += pcm.length;
    if (this.anchor === undefined && !this.paused) {
      this.anchor = this.clock.now();
      this.pump();
    } else if (this.waiting && this.anchor !== undefined) {
      // After a wait for audio: the next frame keeps its time, or goes now when that has passed.
      this.waiting = false;
      this.anchor = Math.max(this.anchor, this.clock.now() - this.index * FRAME_MS);
      this.pump();
    }
  }

  /** Holds the audio at once (speech over the reply): nothing is sent, the queue and its position are kept. */
  pause(): void {
    if (this.stopped || this.paused) return;
    this.paused = true;
    this.timer?.();
    this.timer = undefined;
  }

  /** Goes on from where `pause()` held it, on a clock anchored now. */
  resume(): void {
    if (this.stopped || !this.paused) return;
    this.paused = false;
    if (this.anchor === undefined) {
      if (this.queued > 0) {
        this.anchor = this.clock.now();
        this.pump();
      } else if (this.ended) this.finish();
      return;
    }
    this.anchor = this.clock.now() - this.index * FRAME_MS;
    this.marker = true;
    this.pump();
  }

  /** No more audio: the playout finishes once the queue is sent. */
  end(): void {
    this.ended = true;
    if (this.anchor === undefined && !this.paused) this.finish();
    else if (this.waiting && !this.paused) {
      this.waiting = false;
      this.pump();
    }
  }

  /** Stops at once (a barge-in): nothing more is sent, not even frames being encoded. Returns the samples played. */
  stop(): number {
    this.close();
    return this.played;
  }

  /** The reply's end: done once its last frame is sent (an encoder on another thread may still hold some). */
  private finish(): void {
    if (this.stopped) return;
    if (this.inflight > 0) {
      this.draining = true;
      this.timer?.();
      this.timer = undefined;
      return;
    }
    this.close();
  }

  private close(): void {
    if (this.stopped) return;
    this.stopped = true;
    this.timer?.();
    this.timer = undefined;
    this.queue.length = 0;
    this.queued = 0;
    this.release();
    this.finished(this.played);
  }

  private pump = (): void => {
    this.timer = undefined;
    if (this.stopped || this.paused) return;
    try {
      let now = this.clock.now();
      for (;;) {
        if (this.ended && this.queued === 0) {
          this.finish();
          return;
        }
        if (this.o.fillGaps === false && !this.ended && this.queued < FRAME_SAMPLES) {
          // Waiting for audio: the next write starts the clock again.
          this.waiting = true;
          this.release();
          return;
        }
        const due = this.anchor! + this.index * FRAME_MS;
        if (due > now + LEAD_MS) break;
        if (now - due > REANCHOR_MS) {
          // Held up: start the clock again from here rather than catching up in a burst.
          this.anchor = now - this.index * FRAME_MS;
          continue;
        }
        this.sendFrame(due);
        now = this.clock.now();
      }
      this.release();
      const next = this.anchor! + this.index * FRAME_MS - LEAD_MS;
      this.timer = this.clock.after(Math.max(1, next - this.clock.now()), this.pump);
    } catch {
      // A failing encoder or sender ends this reply's audio; the conversation goes on.
      this.close();
    }
  };

  /** Wakes the writers the queue now has room for. */
  private release(): void {
    if (this.waiters.length === 0) return;
    const waiting = this.waiters;
    this.waiters = [];
    for (const w of waiting) {
      if (this.stopped || this.queued <= w.samples) w.resolve();
      else this.waiters.push(w);
    }
  }

  /** Hands the next frame (due at `due`) to the encoder; it is sent when encoded, and late if that is more than LATE_MS after `due`. */
  private sendFrame(due: number): void {
    const frame = new Int16Array(FRAME_SAMPLES);
    let filled = 0;
    while (filled < FRAME_SAMPLES && this.queue.length > 0) {
      const piece = this.queue[0]!;
      const n = Math.min(FRAME_SAMPLES - filled, piece.length - this.head);
      frame.set(piece.subarray(this.head, this.head + n), filled);
      filled += n;
      this.head += n;
      if (this.head >= piece.length) {
        this.queue.shift();
        this.head = 0;
      }
    }
    this.queued -= filled;
    const first = this.index === 0;
    const marker = first || this.marker;
    this.index++;
    this.marker = false;
    this.inflight++;
    const encoded = (opus: Buffer) => {
      this.inflight--;
      // Stopped (a barge-in) while it was encoded: it is not sent; nor is a frame the encoder failed (empty).
      if (!this.stopped && opus.length > 0) {
        try {
          this.o.send(opus, marker);
          // Late by when it goes out: an encoder on the audio thread answers after a round trip.
          if (this.clock.now() - due > LATE_MS) {
            this.lateFrames++;
            this.o.late?.();
          }
          this.frames++;
          this.played += filled;
          if (first) this.o.started?.();
        } catch {
          this.close();
        }
      }
      if (this.draining && this.inflight === 0) this.close();
    };
    this.o.codec.frame(frame, encoded, marker);
  }
}
