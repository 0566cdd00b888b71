/**
 * A device's microphone and speaker over its WebRTC audio track, for the voice conversations
 * (voice.md): PCM spoken into the uplink in 10 ms blocks on a steady clock (silence in between,
 * as a real microphone sends), and the downlink's decoded PCM recorded.
 */
import { fromBinary } from "@bufbuild/protobuf";
import { concatInt16 } from "../audio/samples.ts";
import { FrameDecoder, FrameType } from "../protocol/frames.ts";
import { type PeerEvent, PeerEventSchema } from "../protocol/gen/event_pb.ts";

export const DEVICE_RATE = 48_000;
const BLOCK = DEVICE_RATE / 100;
/** Above this RMS a block is audible (of 32767). */
export const AUDIBLE_RMS = 300;

export interface AudioSourceLike {
  /** A libwebrtc source's track (the node-datachannel stack sends what `onData` gets itself). */
  createTrack?(): MediaStreamTrack;
  onData(data: { samples: Int16Array; sampleRate: number; bitsPerSample?: number; channelCount?: number; numberOfFrames?: number }): void;
}

function rms(samples: Int16Array): number {
  let sum = 0;
  for (const s of samples) sum += s * s;
  return Math.sqrt(sum / Math.max(1, samples.length));
}

/** Feeds the uplink 10 ms at a time at real time: queued speech, else silence. */
export class Microphone {
  /** performance.now() when the last audible block of the last `say` was handed to the stack. */
  lastVoicedAt: number | undefined;
  /** performance.now() when the first audible block of the last `say` to begin was handed to the stack. */
  firstVoicedAt: number | undefined;
  private readonly source: AudioSourceLike;
  private readonly queue: Array<{ pcm: Int16Array; done: () => void; voiced?: boolean }> = [];
  private offset = 0;
  private timer: NodeJS.Timeout | undefined;
  private anchor = 0;
  private blocks = 0;

  constructor(source: AudioSourceLike) {
    this.source = source;
  }

  start(): void {
    if (this.timer) return;
    this.anchor = performance.now();
    this.blocks = 0;
    this.tick();
  }

  /** Speaks 48 kHz samples; resolves once the last one was handed to the stack. */
  say(pcm: Int16Array): Promise<void> {
    return new Promise((done) => this.queue.push({ pcm, done }));
  }

  stop(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    for (const q of this.queue.splice(0)) q.done();
  }

  private tick = (): void => {
    const now = performance.now();
    // Behind by more than 100 ms (a held event loop): start the clock again rather than burst.
    if (now - (this.anchor + this.blocks * 10) > 100) {
      this.anchor = now;
      this.blocks = 0;
    }
    while (this.anchor + this.blocks * 10 <= now) {
      this.block();
      this.blocks++;
    }
    this.timer = setTimeout(this.tick, Math.max(1, this.anchor + this.blocks * 10 - performance.now()));
  };

  private block(): void {
    const out = new Int16Array(BLOCK);
    let filled = 0;
    let first: { voiced?: boolean } | undefined;
    while (filled < BLOCK && this.queue.length > 0) {
      const head = this.queue[0]!;
      const n = Math.min(BLOCK - filled, head.pcm.length - this.offset);
      if (!head.voiced) first ??= head;
      out.set(head.pcm.subarray(this.offset, this.offset + n), filled);
      filled += n;
      this.offset += n;
      if (this.offset >= head.pcm.length) {
        this.queue.shift();
        this.offset = 0;
        head.done();
      }
    }
    if (filled > 0 && rms(out) > AUDIBLE_RMS) {
      this.lastVoicedAt = performance.now();
      if (first) {
        first.voiced = true;
        this.firstVoicedAt = this.lastVoicedAt;
      }
    }
    this.source.onData({ samples: out, sampleRate: DEVICE_RATE, bitsPerSample: 16, channelCount: 1, numberOfFrames: BLOCK });
  }
}

/** The downlink as the device hears it (decoded by its WebRTC stack, 10 ms blocks). */
export class Loudspeaker {
  /** performance.now() of the first audible block since `mark()`. */
  firstAudibleAt: number | undefined;
  /** performance.now() of the last audible block. */
  lastAudibleAt: number | undefined;
  private chunks: Int16Array[] = [];
  private recording = false;
  rate = DEVICE_RATE;

  /** Starts keeping what is heard (for a WAV file or a recogniser). */
  record(): void {
    this.recording = true;
  }

  /** Forgets the first audible moment, to time the next reply. */
  mark(): void {
    this.firstAudibleAt = undefined;
  }

  block(samples: Int16Array, sampleRate: number): void {
    this.rate = sampleRate;
    if (this.recording) this.chunks.push(samples.slice());
    if (rms(samples) > AUDIBLE_RMS) {
      const now = performance.now();
      this.firstAudibleAt ??= now;
      this.lastAudibleAt = now;
    }
  }

  /** Everything recorded, and forgets it. */
  take(): Int16Array {
    const out = concatInt16(this.chunks);
    this.chunks = [];
    return out;
  }
}

/** The `PeerEvent`s of the event stream (service 32), one per binary frame; other frames are ignored. */
export class EventReader {
  private readonly decoder = new FrameDecoder();
  private readonly listeners = new Set<(e: PeerEvent) => void>();

  on(cb: (e: PeerEvent) => void): () => void {
    this.listeners.add(cb);
    return () => this.listeners.delete(cb);
  }

  push(bytes: Uint8Array): void {
    let frames: ReturnType<FrameDecoder["push"]>;
    try {
      frames = this.decoder.push(bytes);
    } catch {
      return;
    }
    for (const f of frames) {
      if (f.type !== FrameType.BINARY) continue;
      let event: PeerEvent;
      try {
        event = fromBinary(PeerEventSchema, f.payload);
      } catch {
        continue;
      }
      for (const l of this.listeners) l(event);
    }
  }
}
