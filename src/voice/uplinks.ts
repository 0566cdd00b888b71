import type { OpusRate } from "../audio/opus.ts";
import type { AudioThreads } from "./audio-threads.ts";
import type { VoiceClock } from "./clock.ts";
import { type FrameEncoder, OpusCodec } from "./opus.ts";
import { Uplink } from "./uplink.ts";

/** Local uplinks report their packet counts every this many ticks (a second), as the threads do. */
const COUNT_TICKS = 50;

/** What an uplink hands on, whichever kind decodes it. */
export interface UplinkListener {
  /** The device's audio at the uplink's rate, in order, with `silence`. */
  pcm(samples: Int16Array): void;
  /** Silence of `samples`, in its place among `pcm`'s. */
  silence(samples: number): void;
  /** Samples (48 kHz) dropped for running ahead of real time. */
  overrun(samples: number): void;
  /** Packets decoded and silent (not decoded) since the last call. */
  counted(decoded: number, silent: number): void;
  /** The thread decoding it ended (a crash): what was being heard is lost; the uplink goes on on a fresh thread. */
  failed(err: Error): void;
}

export interface UplinkSettings {
  payloadType: number;
  audioLevelId: number | undefined;
  /** The rate the samples come out at (the listener's). */
  rate: OpusRate;
  /** The uplink's hangover (src/voice/uplink.ts `turnHangoverMs`). */
  hangoverMs: number;
}

/**
 * A conversation's audio both ways, whichever kind does the work: the device's packets decoded
 * (jitter buffer, Opus, silence spared) and its replies' frames encoded, on an audio thread or on
 * this one. The conversation sees this interface only.
 */
export interface VoiceUplink extends FrameEncoder {
  /** The audio thread (its index in the pool) the uplink is on; -1 on this thread. */
  readonly thread: number;
  readonly rate: OpusRate;
  /** One packet from the track (RTP or RTCP). */
  packet(bytes: Buffer): void;
  /** Every 20 ms: the jitter buffer's clock (a thread keeps its own). */
  tick(): void;
  close(): void;
}

/** The uplink on one of the node's audio threads when it has them, else on this thread. */
export function openUplink(threads: AudioThreads | undefined, settings: UplinkSettings, listener: UplinkListener, clock: VoiceClock): VoiceUplink {
  if (!threads) return new LocalUplink(settings, listener, clock);
  const thread = threads.uplink({ ...settings, ...bound(listener) });
  return {
    rate: settings.rate,
    get thread() {
      return thread.thread;
    },
    packet: (bytes) => thread.packet(bytes),
    frame: (pcm, encoded, urgent) => thread.frame(pcm, encoded, urgent),
    tick: () => {},
    close: () => thread.close(),
  };
}

/** The listener's methods as functions of their own (the threads call them unbound). */
function bound(l: UplinkListener): UplinkListener {
  return {
    pcm: (s) => l.pcm(s),
    silence: (n) => l.silence(n),
    overrun: (n) => l.overrun(n),
    counted: (d, s) => l.counted(d, s),
    failed: (e) => l.failed(e),
  };
}

/** The uplink decoded and the replies encoded on this thread (`voice.audio_threads: 0`, and tests). */
class LocalUplink implements VoiceUplink {
  readonly thread = -1;
  readonly rate: OpusRate;
  private readonly codec: OpusCodec;
  private readonly uplink: Uplink;
  private readonly listener: UplinkListener;
  private readonly counted = { decoded: 0, silent: 0, ticks: 0 };
  private closed = false;

  constructor(s: UplinkSettings, listener: UplinkListener, clock: VoiceClock) {
    this.rate = s.rate;
    this.listener = listener;
    this.codec = new OpusCodec(s.rate);
    this.uplink = new Uplink({
      codec: this.codec,
      payloadType: s.payloadType,
      audioLevelId: s.audioLevelId,
      hangoverMs: s.hangoverMs,
      pcm: (pcm) => listener.pcm(pcm),
      silence: (n) => listener.silence(n),
      overrun: (n) => listener.overrun(n),
      now: () => clock.now(),
    });
  }

  packet(bytes: Buffer): void {
    if (!this.closed) this.uplink.packet(bytes);
  }

  frame(pcm: Int16Array, encoded: (opus: Buffer) => void): void {
    this.codec.frame(pcm, encoded);
  }

  tick(): void {
    if (this.closed) return;
    this.uplink.tick();
    if (++this.counted.ticks >= COUNT_TICKS) this.count();
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.count();
    this.codec.close();
  }

  /** The packets since last counted (every second, not per packet). */
  private count(): void {
    const { decoded, silent } = this.uplink;
    this.counted.ticks = 0;
    if (decoded === this.counted.decoded && silent === this.counted.silent) return;
    this.listener.counted(decoded - this.counted.decoded, silent - this.counted.silent);
    this.counted.decoded = decoded;
    this.counted.silent = silent;
  }
}
