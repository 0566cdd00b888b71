import { oggOpus } from "../audio/ogg-opus.ts";
import { LibOpus, OPUS_RATE, type OpusRate } from "../audio/opus.ts";
import type { RecordingSide } from "../store/recordings.ts";
import { RECOGNITION_RATE } from "./engine-ports.ts";
import { opusPacketSamples } from "./jitter.ts";
import type { VoiceEvent } from "./peer-events.ts";
import type { AudioPort } from "./port.ts";

/** The device's side is kept from this long before its turn's speech was detected (the recognition's look-back and the detector's lag). */
export const PRE_ROLL_MS = 600;
/** A side is kept up to this long (a turn ends at `voice.turn.max_ms`, 30 s by default; a reply is cut by its text's limit). */
export const MAX_SIDE_MS = 120_000;
/** The device's side is encoded at this bit rate (speech at 16 or 24 kHz, mono). */
const USER_BITRATE = 24_000;
/**
 * …and at this complexity (libopus's default is 10): it is encoded on the main thread as it comes,
 * and 3 costs 6 ms of CPU a second of speech instead of 15 (measured on flite's speech at 16 kHz),
 * for the same size and a speech recording that is transcribed as well (test/recordings.test.ts).
 */
const USER_COMPLEXITY = 3;

/** What one finished side of a turn is handed to the store as. */
export interface SideRecording {
  turn: number;
  side: RecordingSide;
  audio: Uint8Array;
  durationMs: number;
  retentionDays: number;
}

export interface TurnRecorderOptions {
  /** The retention of the agent answering now, when it records (`record.audio`); undefined: it does not. */
  policy: () => { retentionDays: number } | undefined;
  /** A finished side, after its turn's entries (Ogg Opus). */
  store: (r: SideRecording) => void;
  /** A finished turn's `turn.metrics` (JSON), after its entries. */
  metrics?: (turn: number, json: string) => void;
  /** A side that could not be encoded. */
  warn?: (err: unknown) => void;
}

interface Side {
  /** The rate its audio came at (the device's side), or 48 kHz (the reply's). */
  rate: number;
  turn: number;
  side: RecordingSide;
  retentionDays: number;
  packets: Uint8Array[];
  samples: number[];
  /** Samples at 48 kHz so far. */
  total: number;
}

/**
 * A conversation's recordings (voice.md §8), from what it hears and sends and nothing of its
 * internals: the device's audio as the uplink decoded it (16 kHz, `heard`/`silence`), encoded to
 * Opus as it comes; the reply's Opus frames as they were sent (`sent`), from the end of the
 * user's speech to the end of the reply's audio (so up to a barge-in); the turns' limits from the
 * voice events (`event`). A turn's sides go to the store once the turn finished (its
 * `turn.metrics`), so that they follow its entries.
 */
export class TurnRecorder {
  private readonly o: TurnRecorderOptions;
  /** The rate the device's audio comes at now (the thinking part's: 16 kHz for a text agent, 24 kHz for a realtime one). */
  private rate: OpusRate = RECOGNITION_RATE;
  /** The last PRE_ROLL_MS of the device's audio, a ring. */
  private ring = new Int16Array((PRE_ROLL_MS * RECOGNITION_RATE) / 1000);
  private ringAt = 0;
  private ringFilled = 0;
  private encoder: LibOpus | undefined;
  /** The device's side being heard, and its samples not yet a whole frame. */
  private user: Side | undefined;
  private pending = new Int16Array(RECOGNITION_RATE / 50);
  private pendingLength = 0;
  /** The reply's side being sent. */
  private reply: Side | undefined;
  /** Finished sides waiting for their turn's end. */
  private readonly finished: Side[] = [];
  private closed = false;
  /** The muxing of finished sides, one after another (tests wait on it). */
  private work: Promise<void> = Promise.resolve();

  constructor(o: TurnRecorderOptions) {
    this.o = o;
  }

  /** The device's audio at `rate`, in order. */
  heard(pcm: Int16Array, rate: OpusRate = RECOGNITION_RATE): void {
    if (this.closed) return;
    if (rate !== this.rate) this.changeRate(rate);
    if (this.user) this.append(pcm);
    else this.remember(pcm);
  }

  /** Silence of `samples` at `rate` in its place among `heard`'s. */
  silence(samples: number, rate: OpusRate = RECOGNITION_RATE): void {
    if (this.closed || samples <= 0) return;
    // Pieces of at most 16,000 samples: a long pause allocates nothing large.
    for (let left = samples; left > 0; left -= zeros.length) this.heard(zeros.subarray(0, Math.min(left, zeros.length)), rate);
  }

  /** The device's agent changed kind: its audio comes at another rate; a side being heard ends here, the ring starts anew. */
  private changeRate(rate: OpusRate): void {
    if (this.user) this.endUser(this.user.turn);
    this.rate = rate;
    this.ring = new Int16Array((PRE_ROLL_MS * rate) / 1000);
    this.ringAt = 0;
    this.ringFilled = 0;
    this.pending = new Int16Array(rate / 50);
    this.pendingLength = 0;
    this.encoder?.close();
    this.encoder = undefined;
  }

  /** One Opus frame sent to the device. */
  sent(opus: Buffer): void {
    const r = this.reply;
    if (this.closed || !r || opus.length === 0) return;
    const n = opusPacketSamples(opus) ?? OPUS_RATE / 50;
    if (((r.total + n) * 1000) / OPUS_RATE > MAX_SIDE_MS) return;
    r.packets.push(Uint8Array.from(opus));
    r.samples.push(n);
    r.total += n;
  }

  /** A voice event the conversation sent (voice.md §3). */
  event(e: VoiceEvent): void {
    if (this.closed) return;
    if (e.label === "user.audio" && e.type === "bos") this.startUser(turnOf(e.streamId, "in-"));
    else if (e.label === "user.audio" && e.type === "eos") this.endUser(turnOf(e.streamId, "in-"));
    else if (e.label === "assistant.audio" && e.type === "eos" && this.reply?.turn === turnOf(e.streamId, "out-")) this.endReply();
    else if (e.label === "turn.metrics" && e.type === "done") {
      const turn = turnOf(e.streamId, "out-");
      if (turn <= 0) return;
      if (this.reply?.turn === turn) this.endReply();
      this.o.metrics?.(turn, e.text);
      this.flush((s) => s.turn <= turn);
    }
  }

  /** The connection closed: the sides heard so far are kept (a reply cut by the close is kept as far as it was sent). */
  close(): void {
    if (this.closed) return;
    if (this.user) this.endUser(this.user.turn);
    if (this.reply) this.endReply();
    this.flush(() => true);
    this.closed = true;
    this.encoder?.close();
    this.encoder = undefined;
  }

  /** Resolves once every finished side so far was handed to the store (tests, measurements). */
  settled(): Promise<void> {
    return this.work;
  }

  private startUser(turn: number): void {
    if (turn <= 0) return;
    // A new turn: what is still waiting of earlier ones (a turn that ended with no metrics) goes now.
    this.flush((s) => s.turn < turn);
    if (this.reply && this.reply.turn < turn) this.endReply();
    const policy = this.o.policy();
    if (!policy) return;
    this.user = { rate: this.rate, turn, side: "user", retentionDays: policy.retentionDays, packets: [], samples: [], total: 0 };
    this.pendingLength = 0;
    // The ring's audio first, oldest first.
    const start = this.ringFilled < this.ring.length ? 0 : this.ringAt;
    const older = this.ring.subarray(start, this.ringFilled < this.ring.length ? this.ringFilled : this.ring.length);
    const newer = this.ringFilled < this.ring.length ? this.ring.subarray(0, 0) : this.ring.subarray(0, this.ringAt);
    this.append(older);
    this.append(newer);
    this.ringAt = 0;
    this.ringFilled = 0;
  }

  private endUser(turn: number): void {
    const u = this.user;
    if (!u || u.turn !== turn) return;
    this.user = undefined;
    if (this.pendingLength > 0) {
      this.pending.fill(0, this.pendingLength);
      this.encode(u, this.pending);
      this.pendingLength = 0;
    }
    if (u.packets.length > 0) this.finished.push(u);
    // The reply to this turn is recorded from now (a realtime model may answer before its text begins).
    this.reply = { rate: OPUS_RATE, turn, side: "assistant", retentionDays: u.retentionDays, packets: [], samples: [], total: 0 };
  }

  private endReply(): void {
    const r = this.reply;
    this.reply = undefined;
    if (r && r.packets.length > 0) this.finished.push(r);
  }

  private append(pcm: Int16Array): void {
    const u = this.user;
    if (!u) return;
    let at = 0;
    const frame = this.pending.length;
    while (at < pcm.length) {
      const take = Math.min(frame - this.pendingLength, pcm.length - at);
      this.pending.set(pcm.subarray(at, at + take), this.pendingLength);
      this.pendingLength += take;
      at += take;
      if (this.pendingLength === frame) {
        this.encode(u, this.pending);
        this.pendingLength = 0;
      }
    }
  }

  private encode(u: Side, frame: Int16Array): void {
    if ((u.total * 1000) / OPUS_RATE >= MAX_SIDE_MS) return;
    try {
      if (!this.encoder) {
        this.encoder = new LibOpus("voip", this.rate);
        this.encoder.setBitrate(USER_BITRATE);
        this.encoder.setComplexity(USER_COMPLEXITY);
      }
      u.packets.push(this.encoder.encode(frame));
      u.samples.push(OPUS_RATE / 50);
      u.total += OPUS_RATE / 50;
    } catch (err) {
      this.o.warn?.(err);
    }
  }

  private remember(pcm: Int16Array): void {
    let src = pcm;
    if (src.length >= this.ring.length) {
      src = src.subarray(src.length - this.ring.length);
      this.ring.set(src);
      this.ringAt = 0;
      this.ringFilled = this.ring.length;
      return;
    }
    const first = Math.min(src.length, this.ring.length - this.ringAt);
    this.ring.set(src.subarray(0, first), this.ringAt);
    this.ring.set(src.subarray(first), 0);
    this.ringAt = (this.ringAt + src.length) % this.ring.length;
    this.ringFilled = Math.min(this.ring.length, this.ringFilled + src.length);
  }

  /** Muxes and hands on the finished sides `which` picks, in order. */
  private flush(which: (s: Side) => boolean): void {
    const ready = this.finished.filter(which);
    if (ready.length === 0) return;
    for (const s of ready) this.finished.splice(this.finished.indexOf(s), 1);
    this.work = this.work.then(async () => {
      for (const s of ready) {
        try {
          const audio = await oggOpus(s.packets, s.samples, s.rate);
          this.o.store({ turn: s.turn, side: s.side, audio, durationMs: (s.total * 1000) / OPUS_RATE, retentionDays: s.retentionDays });
        } catch (err) {
          this.o.warn?.(err);
        }
      }
    });
  }
}

const zeros = new Int16Array(RECOGNITION_RATE);

/**
 * The port a conversation should use so that `recorder` hears what it sends (frames and events,
 * after the port it wraps has taken them).
 */
export function observeRecording(port: AudioPort, recorder: TurnRecorder): AudioPort {
  return {
    publicKey: port.publicKey,
    payloadType: port.payloadType,
    audioLevelId: port.audioLevelId,
    onPacket: (cb) => port.onPacket(cb),
    sendFrame: (opus, first) => {
      const sent = port.sendFrame(opus, first);
      if (sent) recorder.sent(opus);
      return sent;
    },
    sendEvent: (event) => {
      const sent = port.sendEvent(event);
      recorder.event(event);
      return sent;
    },
  };
}

/** n of a stream id `<prefix>n`; 0 when it is not one. */
function turnOf(streamId: string, prefix: string): number {
  if (!streamId.startsWith(prefix)) return 0;
  const n = Number(streamId.slice(prefix.length));
  return Number.isSafeInteger(n) && n > 0 ? n : 0;
}
