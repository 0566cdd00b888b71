import OpusScript from "opusscript";
import type { AudioTrack } from "./answerer.ts";

const RATE = 48_000;
const FRAME_SAMPLES = 960; // 20 ms
let encoder: OpusScript | undefined;

/** One shared encoder: encoding is synchronous, so one at a time is all the event loop runs anyway. */
function opus(): OpusScript {
  encoder ??= new OpusScript(RATE, 1, OpusScript.Application.AUDIO);
  return encoder;
}

/** The Opus frames (20 ms each) of a sine tone. */
export function toneFrames(frequencyHz: number, durationMs: number): Buffer[] {
  const frames: Buffer[] = [];
  const count = Math.max(1, Math.round(durationMs / 20));
  const pcm = Buffer.alloc(FRAME_SAMPLES * 2);
  for (let f = 0; f < count; f++) {
    for (let i = 0; i < FRAME_SAMPLES; i++) {
      const t = (f * FRAME_SAMPLES + i) / RATE;
      pcm.writeInt16LE(Math.round(Math.sin(2 * Math.PI * frequencyHz * t) * 12_000), i * 2);
    }
    frames.push(Buffer.from(opus().encode(pcm, FRAME_SAMPLES)));
  }
  return frames;
}

/** RTP sender state of one track: sequence numbers and timestamps continue across plays. */
export class AudioSender {
  private seq = Math.floor(Math.random() * 0xffff);
  private timestamp = Math.floor(Math.random() * 0xffffffff);
  private playing: NodeJS.Timeout | undefined;
  private readonly track: AudioTrack;

  constructor(track: AudioTrack) {
    this.track = track;
  }

  /** Sends the frames paced at 20 ms; a new play replaces one under way. Resolves when done. */
  play(frames: Buffer[]): Promise<number> {
    this.stop();
    let i = 0;
    let sent = 0;
    return new Promise((resolve) => {
      const tick = () => {
        const frame = frames[i++];
        if (!frame) {
          this.stop();
          resolve(sent);
          return;
        }
        if (this.track.send(this.packet(frame, i === 1))) sent++;
      };
      this.playing = setInterval(tick, 20);
      tick();
    });
  }

  stop(): void {
    if (this.playing) clearInterval(this.playing);
    this.playing = undefined;
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
