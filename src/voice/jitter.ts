import type { RtpPacket } from "./rtp.ts";

/** What the buffer hands on, in order: a packet to decode, a lost packet to conceal, or a gap the sender left silent. */
export type JitterOutput =
  | { kind: "packet"; payload: Buffer /** The sender's audio level (−dBov), when the packet carried one. */; level?: number }
  | { kind: "lost"; samples: number }
  | { kind: "silence"; samples: number };

export interface JitterOptions {
  /** How long a missing packet is waited for before it is declared lost. */
  depthMs: number;
  /** Samples of one packet when nothing tells otherwise (20 ms at 48 kHz). */
  frameSamples: number;
  clockRate: number;
  /** A timestamp gap longer than this (the sender paused, or restarted) is not filled in. */
  maxGapMs: number;
  output: (o: JitterOutput) => void;
  now?: () => number;
}

export interface JitterStats {
  received: number;
  late: number;
  duplicate: number;
  lost: number;
  resets: number;
}

/** Packets further ahead than this are a new stream (the sender restarted), not a loss. */
const MAX_AHEAD = 512;

/** Samples in an Opus packet, from its table-of-contents byte (RFC 6716 §3.1); undefined when malformed. */
export function opusPacketSamples(payload: Buffer, clockRate = 48_000): number | undefined {
  if (payload.length < 1) return undefined;
  const toc = payload[0]!;
  const config = toc >> 3;
  const ms = config < 12 ? [10, 20, 40, 60][config & 3]! : config < 16 ? [10, 20][config & 1]! : [2.5, 5, 10, 20][config & 3]!;
  const code = toc & 3;
  let frames = code === 0 ? 1 : code === 3 ? (payload.length < 2 ? 0 : payload[1]! & 0x3f) : 2;
  if (frames === 0) return undefined;
  if (frames * ms > 120) frames = Math.floor(120 / ms);
  return Math.round((frames * ms * clockRate) / 1000);
}

/**
 * Reorders RTP packets by sequence number, waits up to `depthMs` for a missing one, then reports
 * it lost (for packet-loss concealment) and goes on. Late and duplicate packets are dropped;
 * timestamp gaps between consecutive packets (a sender's discontinuous transmission) come out as
 * silence, so the output keeps the sender's timeline.
 */
export class JitterBuffer {
  readonly stats: JitterStats = { received: 0, late: 0, duplicate: 0, lost: 0, resets: 0 };
  private readonly o: JitterOptions;
  private readonly now: () => number;
  /** Extended sequence number (no wrap) expected next; undefined before the first packet. */
  private next: number | undefined;
  /** RTP timestamp expected for `next`. */
  private nextTs = 0;
  private readonly pending = new Map<number, { packet: RtpPacket; at: number }>();

  constructor(o: JitterOptions) {
    this.o = o;
    this.now = o.now ?? (() => performance.now());
  }

  push(packet: RtpPacket): void {
    this.stats.received++;
    if (this.next === undefined) {
      this.start(packet);
    }
    let diff = this.distance(packet.sequence);
    if (diff < 0) {
      this.stats.late++;
      return;
    }
    if (diff > MAX_AHEAD) {
      this.stats.resets++;
      this.flush();
      this.start(packet);
      diff = 0;
    }
    const ext = this.next! + diff;
    if (this.pending.has(ext)) {
      this.stats.duplicate++;
      return;
    }
    this.pending.set(ext, { packet, at: this.now() });
    this.release();
  }

  /** Declares lost what has been waited for too long; call every few milliseconds. */
  tick(): void {
    this.release();
  }

  /** Packets waiting for an earlier one. */
  get waiting(): number {
    return this.pending.size;
  }

  /** Hands on everything waiting, declaring what is missing lost. */
  flush(): void {
    while (this.pending.size > 0) this.skipMissing();
  }

  /** Hands on everything waiting; the next packet starts a new timeline (a new sender). */
  restart(): void {
    this.flush();
    this.next = undefined;
  }

  /** How far `sequence` is ahead of the one expected (negative: behind), across the 16-bit wrap. */
  private distance(sequence: number): number {
    return ((((sequence - (this.next! & 0xffff)) & 0xffff) + 0x8000) & 0xffff) - 0x8000;
  }

  private start(packet: RtpPacket): void {
    this.next = packet.sequence;
    this.nextTs = packet.timestamp;
    this.pending.clear();
  }

  private release(): void {
    for (;;) {
      const entry = this.pending.get(this.next!);
      if (entry) {
        this.pending.delete(this.next!);
        this.emit(entry.packet);
        continue;
      }
      if (this.pending.size === 0) return;
      const oldest = Math.min(...[...this.pending.values()].map((e) => e.at));
      const depthFrames = Math.ceil((this.o.depthMs * this.o.clockRate) / 1000 / this.o.frameSamples);
      if (this.pending.size <= depthFrames && this.now() - oldest < this.o.depthMs) return;
      this.skipMissing();
    }
  }

  /** Declares lost every packet before the earliest one waiting. */
  private skipMissing(): void {
    const first = Math.min(...this.pending.keys());
    const missing = first - this.next!;
    if (missing <= 0) {
      const entry = this.pending.get(first)!;
      this.pending.delete(first);
      this.emit(entry.packet);
      return;
    }
    const packet = this.pending.get(first)!.packet;
    const gap = (packet.timestamp - this.nextTs) >>> 0;
    const maxGap = (this.o.maxGapMs * this.o.clockRate) / 1000;
    // Each missing packet is as long as the gap says, or a frame when the gap makes no sense.
    const each = gap > 0 && gap <= maxGap ? gap / missing : this.o.frameSamples;
    for (let i = 0; i < missing; i++) {
      this.stats.lost++;
      this.o.output({ kind: "lost", samples: Math.round(each * (i + 1)) - Math.round(each * i) });
    }
    this.next = first;
    this.nextTs = packet.timestamp;
  }

  private emit(packet: RtpPacket): void {
    const gap = (packet.timestamp - this.nextTs) >>> 0;
    const maxGap = (this.o.maxGapMs * this.o.clockRate) / 1000;
    if (gap > 0 && gap <= maxGap) this.o.output({ kind: "silence", samples: gap });
    this.o.output(packet.level === undefined ? { kind: "packet", payload: packet.payload } : { kind: "packet", payload: packet.payload, level: packet.level });
    this.next = this.next! + 1;
    this.nextTs = (packet.timestamp + (opusPacketSamples(packet.payload, this.o.clockRate) ?? this.o.frameSamples)) >>> 0;
  }
}
