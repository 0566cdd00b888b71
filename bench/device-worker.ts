/**
 * The worker's side of bench/device-process.ts, shared by the device processes (crowd-worker.ts,
 * capacity-worker.ts, fleet-worker.ts): where the server is, the pre-encoded question, RTP headers
 * of a device's audio, one 20 ms ticker for every device, and the command loop.
 */
import { readFileSync } from "node:fs";

/** The server the devices reach (`PERCH_URL`, or `urlVariable`), its public key, and the local address to gather on. */
export function serverOfWorker(urlVariable = "PERCH_URL"): { baseUrl: string; serverPublicKey: string; bindAddress: string | undefined } {
  return { baseUrl: process.env[urlVariable]!, serverPublicKey: process.env.PERCH_SERVER_KEY!, bindAddress: process.env.CROWD_BIND || undefined };
}

/** The pre-encoded audio: the question's Opus frames (base64), the index of its last voiced frame, and a frame of silence. */
export interface CapacityAudio {
  question: string[];
  /** Each question frame's level in −dBov (0–127), as an RFC 6464 sender computes it. */
  levels: number[];
  lastVoiced: number;
  silence: string;
}

/** The audio file `CAPACITY_AUDIO` names (bench/capacity.ts's `encodedAudio` writes it), its frames decoded. */
export function capacityAudio(): { audio: CapacityAudio; question: Buffer[]; silence: Buffer } {
  const audio = JSON.parse(readFileSync(process.env.CAPACITY_AUDIO!, "utf8")) as CapacityAudio;
  return { audio, question: audio.question.map((f) => Buffer.from(f, "base64")), silence: Buffer.from(audio.silence, "base64") };
}

export const FRAME_MS = 20;
const SAMPLES_PER_FRAME = 960;
export const PAYLOAD_TYPE = 111;

/** One device's outgoing RTP: Opus frames of 20 ms, sequence and timestamp from a random start. */
export class RtpOut {
  sequence = (Math.random() * 0xffff) | 0;
  timestamp = (Math.random() * 0xffffffff) >>> 0;
  /** Set on the first packet of a talkspurt. */
  marker = true;

  /**
   * The packet of `payload` from `ssrc`; with `level` (−dBov) and `levelId`, the RFC 6464 audio
   * level in a one-byte header extension (RFC 8285), as libwebrtc sends it.
   */
  packet(ssrc: number, payload: Buffer, level?: { id: number; dbov: number }): Buffer {
    const ext = level ? 8 : 0;
    const packet = Buffer.allocUnsafe(12 + ext + payload.length);
    packet[0] = level ? 0x90 : 0x80;
    packet[1] = (this.marker ? 0x80 : 0) | PAYLOAD_TYPE;
    packet.writeUInt16BE(this.sequence, 2);
    packet.writeUInt32BE(this.timestamp >>> 0, 4);
    packet.writeUInt32BE(ssrc, 8);
    if (level) {
      // The level element (id, one byte), then padding.
      packet.writeUInt32BE(0xbede0001, 12);
      packet.writeUInt32BE(((level.id << 4) << 24) | ((level.dbov & 0x7f) << 16), 16);
    }
    payload.copy(packet, 12 + ext);
    this.marker = false;
    this.sequence = (this.sequence + 1) & 0xffff;
    this.timestamp = (this.timestamp + SAMPLES_PER_FRAME) >>> 0;
    return packet;
  }
}

/**
 * One ticker for every device of the process: `each(now)` for frame k at anchor + 20·k ms; behind
 * by more than 100 ms (the process stalled), the clock starts again rather than bursting.
 */
export class FrameTicker {
  private readonly each: (now: number) => void;
  private anchor = 0;
  private ticks = 0;
  private timer: NodeJS.Timeout | undefined;

  constructor(each: (now: number) => void) {
    this.each = each;
  }

  get running(): boolean {
    return this.timer !== undefined;
  }

  start(): void {
    if (this.timer) return;
    this.anchor = performance.now();
    this.ticks = 0;
    this.tick();
  }

  private tick(): void {
    const now = performance.now();
    if (now - (this.anchor + this.ticks * FRAME_MS) > 100) {
      this.anchor = now;
      this.ticks = 0;
    }
    while (this.anchor + this.ticks * FRAME_MS <= now) {
      this.each(now);
      this.ticks++;
    }
    this.timer = setTimeout(() => this.tick(), Math.max(1, this.anchor + this.ticks * FRAME_MS - performance.now()));
  }
}

/** A reply to the bench (`DeviceProcess.ask`). */
export function reply<M extends { type: string; id: number }>(message: M): void {
  process.send?.(message);
}

/**
 * The command loop: `handle` each command but `release` and `exit`. `release` closes every device
 * (`release()`) and answers `released`; `exit` releases, waits a moment for the peer connections
 * to send their closes, and leaves. When the bench goes away (finished, failed or killed), so do
 * the devices.
 */
export function serveCommands<C extends { type: string }>(
  handle: (command: Exclude<C, { type: "release" | "exit" }>) => void | Promise<void>,
  release: () => void | Promise<void>,
): void {
  process.on("message", async (command: C | { type: "release"; id: number } | { type: "exit" }) => {
    if (command.type === "release" && "id" in command) {
      await release();
      reply({ type: "released", id: command.id });
    } else if (command.type === "exit") {
      await release();
      setTimeout(() => process.exit(0), 300);
    } else await handle(command as Exclude<C, { type: "release" | "exit" }>);
  });
  process.on("disconnect", async () => {
    await release();
    process.exit(0);
  });
}
