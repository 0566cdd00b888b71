import { LibOpus } from "../audio/opus.ts";
import type { AudioTrack } from "./answerer.ts";

const RATE = 48_000;
const FRAME_SAMPLES = 960; // 20 ms
const FRAME_MS = 20;

/** How many 20 ms frames a tone of `durationMs` has. */
export function toneFrameCount(durationMs: number): number {
  return Math.max(1, Math.round(durationMs / FRAME_MS));
}

/**
 * The Opus frames (20 ms each) of a sine tone, encoded one at a time as they are sent: encoding
 * a 10 s tone at once would hold the event loop for a few hundred milliseconds, per request. Each
 * tone has its own encoder (Opus carries state from frame to frame), released when it ends or is
 * stopped.
 */
export function* toneFrames(frequencyHz: number, durationMs: number): Generator<Buffer, void, undefined> {
  const encoder = new LibOpus("audio");
  try {
    const pcm = new Int16Array(FRAME_SAMPLES);
    for (let f = 0, count = toneFrameCount(durationMs); f < count; f++) {
      for (let i = 0; i < FRAME_SAMPLES; i++) {
        const t = (f * FRAME_SAMPLES + i) / RATE;
        pcm[i] = Math.round(Math.sin(2 * Math.PI * frequencyHz * t) * 12_000);
      }
      yield encoder.encode(pcm);
    }
  } finally {
    encoder.close();
  }
}

/** RTP sender state of one track: sequence numbers and timestamps continue across plays. */
export class AudioSender {
  private seq = Math.floor(Math.random() * 0xffff);
  private timestamp = Math.floor(Math.random() * 0xffffffff);
  private playing: NodeJS.Timeout | undefined;
  private current: { frames: Iterator<Buffer, void, undefined>; done: () => void } | undefined;
  private readonly track: AudioTrack;

  constructor(track: AudioTrack) {
    this.track = track;
  }

  /** Sends the frames paced at 20 ms; a new play replaces one under way. Resolves when done (or replaced). */
  play(frames: Iterator<Buffer, void, undefined>): Promise<number> {
    this.stop();
    let first = true;
    let sent = 0;
    return new Promise((resolve) => {
      const tick = () => {
        // A timer's callback: an encoder failure ends this play, not the process.
        try {
          const frame = frames.next();
          if (frame.done) {
            this.stop();
            return;
          }
          if (this.track.send(this.packet(frame.value, first))) sent++;
          first = false;
        } catch {
          this.stop();
        }
      };
      this.current = { frames, done: () => resolve(sent) };
      this.playing = setInterval(tick, FRAME_MS);
      tick();
    });
  }

  /** Sends one frame of another source (a voice reply), stopping a tone under way: the track has one voice at a time. */
  sendFrame(payload: Buffer, first: boolean): boolean {
    if (this.current) this.stop();
    return this.track.send(this.packet(payload, first));
  }

  stop(): void {
    if (this.playing) clearInterval(this.playing);
    this.playing = undefined;
    const current = this.current;
    this.current = undefined;
    current?.frames.return?.();
    current?.done();
  }

  private packet(payload: Buffer, first: boolean): Buffer {
    const header = Buffer.alloc(12);
    header[0] = 0x80;
    header[1] = (first ? 0x80 : 0) | (this.track.payloadType & 0x7f);
    header.writeUInt16BE(this.seq, 2);
    header.writeUInt32BE(this.timestamp >>> 0, 4);
    header.writeUInt32BE(this.track.ssrc >>> 0, 8);
    this.seq = (this.seq + 1) & 0xffff;
    this.timestamp = (this.timestamp + FRAME_SAMPLES) >>> 0;
    return Buffer.concat([header, payload]);
  }
}
