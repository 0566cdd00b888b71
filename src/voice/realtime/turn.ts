import type { SpeexModule } from "@echogarden/speex-resampler-wasm";
import { Resampler } from "../../audio/resampler.ts";
import type { VoiceClock } from "../clock.ts";
import type { VoiceMetrics } from "../metrics.ts";
import { type FrameEncoder, OPUS_RATE } from "../opus.ts";
import type { VoiceEvents } from "../peer-events.ts";
import { Playout } from "../playout.ts";
import { SpokenText } from "../spoken.ts";
import { AudioQueue } from "./audio-queue.ts";
import type { RealtimeTools } from "./tools.ts";
import { REALTIME_RATE } from "./wire.ts";

/** Audio the model sent ahead of playback waits here, at most this long (voice.md §6); beyond, the reply is cut. */
export const MAX_BUFFER_S = 60;
const MAX_BUFFER_BYTES = MAX_BUFFER_S * REALTIME_RATE * 2;
/** The reply's audio is resampled and handed to the playout only this far ahead of what it has sent (48 kHz samples). */
const PLAYOUT_AHEAD = (OPUS_RATE * 200) / 1000;
/** Output items one turn keeps (a reply is one or two): audio or text of further new item ids is ignored. */
export const MAX_REPLY_ITEMS = 16;

/** How a turn ended, as the metrics count it. */
export type TurnOutcome = "answered" | "interrupted" | "failed";

export interface RealtimeTurnOptions {
  n: number;
  /** Clock time the user's speech ended (undefined: a reply nobody asked for). */
  stoppedAt: number | undefined;
  /** The previous reply's end, when this one must wait for it (barge-in off). */
  after?: Promise<void> | undefined;
  tools: RealtimeTools;
  /** `voice.max_reply_chars`. */
  maxReplyChars: number;
  clock: VoiceClock;
  resampler: SpeexModule;
  /** Encodes the reply's frames (the conversation's uplink: on its audio thread, or here). */
  encoder: FrameEncoder;
  /** Sends one Opus frame of the reply. */
  send: (opus: Buffer, first: boolean) => boolean;
  metrics: VoiceMetrics;
  events: VoiceEvents;
  /** Counts the model's audio (24 kHz samples), that played and that dropped by a cut alike. */
  audio?: (samples: number) => void;
  /** Sends a cancel, truncate or delete of Perch's own (an error answering it is harmless). */
  sendOwn: (event: Record<string, unknown>) => void;
  /** The turn is over, however it ended (its events, metrics and history are the session's). */
  end: (turn: RealtimeTurn, result: TurnOutcome, error?: string) => void;
  warn: (details: Record<string, unknown>, message: string) => void;
}

interface AudioItem {
  id: string;
  text: string;
  /** Samples (24 kHz) the model sent for it, those dropped by a cut included. */
  received: number;
  /** Playout samples (48 kHz) written before it began, and of it. */
  start: number;
  written: number;
}

/**
 * A realtime turn's reply, from the end of the user's speech to the last of its audio sent: the
 * model's output items (audio and words, bounded), its audio paced to the device through a
 * playout as playback makes room, a cut at the buffer's or the words' bound, and the items cut at
 * what the device heard when it stops early. Its response and tool calls are the session's.
 */
export class RealtimeTurn {
  readonly n: number;
  readonly stoppedAt: number | undefined;
  readonly tools: RealtimeTools;
  createdAt: number | undefined;
  firstAudioAt: number | undefined;
  /** The response whose events belong to this turn, while it is active. */
  responseId: string | undefined;
  responseActive = false;
  /** `response.created` is awaited until this cancels it. */
  cancelWait: (() => void) | undefined;
  /** The model call (response) of this turn under way, from 1: tools are offered while it is below `maxSteps`. */
  steps = 1;
  textStarted = false;
  audioStarted = false;
  cut = false;
  ended = false;
  /** Resolves once the turn has ended (a next reply's audio waits for it when barge-in is off). */
  readonly finished: Promise<void>;
  private finish!: () => void;
  private readonly o: RealtimeTurnOptions;
  /** The turn's output items by id, at most MAX_REPLY_ITEMS, in the order they came. */
  private readonly items = new Map<string, AudioItem>();
  /** Characters of the reply's text kept (all its items): at most `voice.max_reply_chars`. */
  private chars = 0;
  private readonly pending = new AudioQueue<AudioItem>();
  /** The last response is done: once `pending` is empty, the audio ends. */
  private audioComplete = false;
  private playout: Playout | undefined;
  private up: Resampler | undefined;
  private wakeUp: (() => void) | undefined;
  private pumping = false;
  private itemsWarned = false;

  constructor(o: RealtimeTurnOptions) {
    this.o = o;
    this.n = o.n;
    this.stoppedAt = o.stoppedAt;
    this.tools = o.tools;
    this.finished = new Promise<void>((resolve) => {
      this.finish = resolve;
    });
  }

  /** Samples (48 kHz) of the reply the device was sent. */
  get played(): number {
    return this.playout?.played ?? 0;
  }

  /** A response of this turn began: its audio is awaited again. */
  responseCreated(id: string, now: number): void {
    this.cancelWait?.();
    this.cancelWait = undefined;
    this.responseId = id;
    this.responseActive = true;
    this.audioComplete = false;
    this.createdAt ??= now;
  }

  /** The turn's item of this id, made on first sight; undefined beyond MAX_REPLY_ITEMS (its audio and text are ignored). */
  item(id: string): AudioItem | undefined {
    let item = this.items.get(id);
    if (!item) {
      if (this.items.size >= MAX_REPLY_ITEMS) {
        if (!this.itemsWarned) {
          this.itemsWarned = true;
          this.o.warn({ turn: this.n, max: MAX_REPLY_ITEMS }, "the realtime model sent more output items than a reply keeps; the rest are ignored");
        }
        return undefined;
      }
      item = { id, text: "", received: 0, start: 0, written: 0 };
      this.items.set(id, item);
    }
    return item;
  }

  /** A delta of the reply's audio (base64 of 24 kHz PCM). */
  audio(itemId: string, delta: string): void {
    const item = this.item(itemId);
    if (!item) return;
    if (this.cut) {
      // Counted, not decoded: a model that keeps sending past the cut costs little.
      const samples = Math.floor(base64Bytes(delta) / 2);
      item.received += samples;
      this.o.audio?.(samples);
      return;
    }
    let bytes = Buffer.from(delta, "base64");
    if (bytes.length % 2) bytes = bytes.subarray(0, bytes.length - 1);
    if (bytes.length === 0) return;
    item.received += bytes.length / 2;
    this.o.audio?.(bytes.length / 2);
    if (this.pending.bytes + bytes.length > MAX_BUFFER_BYTES) {
      // The model speaks faster than the device plays beyond the buffer: the reply is cut here.
      this.cutReply();
      return;
    }
    this.pending.push(item, bytes);
    if (!this.pumping) void this.pump();
    else this.wake();
  }

  /** A delta of the reply's words: kept up to `voice.max_reply_chars` (all its items); beyond, the reply is cut. Returns what is to be told. */
  textDelta(itemId: string, delta: string): string {
    const item = this.item(itemId);
    if (!item) return "";
    const kept = delta.slice(0, Math.max(0, this.o.maxReplyChars - this.chars));
    item.text += kept;
    this.chars += kept.length;
    const wasCut = this.cut;
    if (kept.length < delta.length) this.cutReply();
    // Past a cut the words are kept (what share was heard is counted on them) but not told.
    return wasCut ? "" : kept;
  }

  /** An item's whole words, in place of its deltas (bounded the same way). */
  textDone(itemId: string, transcript: string): void {
    const item = this.item(itemId);
    if (!item) return;
    const room = this.o.maxReplyChars - (this.chars - item.text.length);
    const text = transcript.slice(0, Math.max(0, room));
    this.chars += text.length - item.text.length;
    item.text = text;
    if (text.length < transcript.length) this.cutReply();
  }

  /** The last response is done: once what waits is played, the turn is answered. */
  complete(): void {
    this.audioComplete = true;
    if (this.pumping) this.wake();
    else if (!this.playout) this.o.end(this, "answered");
  }

  /** The reply goes no further (its audio beyond the buffer, or its text beyond `max_reply_chars`): the response is cancelled, what waits is played. */
  cutReply(): void {
    if (this.cut) return;
    this.cut = true;
    if (this.responseActive) this.o.sendOwn({ type: "response.cancel" });
    this.audioComplete = true;
    this.wake();
    // Nothing of it is playing (its text came ahead of its audio): it ends now, whatever the model still sends.
    if (!this.pumping && !this.playout && !this.ended) this.o.end(this, "answered");
  }

  /** Its audio stops now (a barge-in, a failure); what played so far (48 kHz samples). */
  stopAudio(): number {
    const played = this.playout?.stop() ?? 0;
    this.pending.clear();
    return played;
  }

  /** The model's items cut at what the device heard: truncated there, or deleted when none of one was sent. */
  cutItems(played: number, interrupted: boolean): void {
    for (const item of this.items.values()) {
      if (!interrupted && item.received === 0) continue;
      const heard = Math.max(0, Math.min(item.written, played - item.start));
      // A cut reply's items heard whole stay whole (an interrupted response may hold more than came).
      if (!interrupted && heard >= item.received * (OPUS_RATE / REALTIME_RATE) - OPUS_RATE / 50) continue;
      if (heard <= 0) this.o.sendOwn({ type: "conversation.item.delete", item_id: item.id });
      else this.o.sendOwn({ type: "conversation.item.truncate", item_id: item.id, content_index: 0, audio_end_ms: Math.floor((heard * 1000) / OPUS_RATE) });
    }
  }

  /**
   * Ends it (once): its audio stopped unless answered, its waits released; the words the device
   * heard of it (all of them when it was answered whole; an item none of whose audio came was not heard).
   */
  close(result: TurnOutcome): string {
    this.ended = true;
    this.cancelWait?.();
    this.cancelWait = undefined;
    this.wake();
    const played = this.played;
    if (result !== "answered") this.playout?.stop();
    this.up?.close();
    this.pending.clear();
    const spoken = new SpokenText();
    const whole = result === "answered" && !this.cut;
    for (const item of this.items.values()) if (whole || item.received > 0) spoken.add(item.text, item.received * (OPUS_RATE / REALTIME_RATE));
    this.finish();
    return (whole ? spoken.text : spoken.heard(played)).trim();
  }

  private wake(): void {
    const w = this.wakeUp;
    this.wakeUp = undefined;
    w?.();
  }

  /** Feeds the turn's audio to its playout as playback makes room, resampled to 48 kHz. */
  private async pump(): Promise<void> {
    this.pumping = true;
    try {
      if (this.o.after) await this.o.after;
      if (this.ended) return;
      const up = new Resampler(this.o.resampler, REALTIME_RATE, OPUS_RATE);
      this.up = up;
      const { metrics } = this.o;
      const playout = new Playout({
        codec: this.o.encoder,
        clock: this.o.clock,
        send: (opus, first) => {
          metrics.frameSent();
          return this.o.send(opus, first);
        },
        late: () => metrics.frameLate(),
        // Only the model's audio is sent: a truncation at what was sent is then exact.
        fillGaps: false,
        started: () => {
          this.audioStarted = true;
          this.firstAudioAt = this.o.clock.now();
          this.o.events.bos(`out-${this.n}`, "audio", "assistant.audio", "audio/opus");
        },
      });
      this.playout = playout;
      let written = 0;
      for (;;) {
        if (this.ended) return;
        const block = this.pending.shift();
        if (!block) {
          if (this.audioComplete) break;
          await new Promise<void>((resolve) => {
            this.wakeUp = resolve;
          });
          continue;
        }
        const chunk = block.bytes;
        const pcm =
          chunk.byteOffset % 2 === 0 ? new Int16Array(chunk.buffer, chunk.byteOffset, chunk.length / 2) : new Int16Array(new Uint8Array(chunk).buffer);
        const out = up.process(pcm);
        const item = block.tag;
        if (item.written === 0) item.start = written;
        item.written += out.length;
        written += out.length;
        playout.write(out);
        await playout.room(PLAYOUT_AHEAD);
      }
      // The resampler's tail, and a breath of silence after the reply.
      playout.write(up.process(new Int16Array(REALTIME_RATE / 10)));
      playout.end();
      await playout.done;
      if (this.ended) return;
      // A cut reply: the model's items end where the device's audio did.
      if (this.cut) this.cutItems(playout.played, false);
      this.o.end(this, "answered");
    } catch (err) {
      if (!this.ended) this.o.end(this, "failed", `the reply's audio failed: ${(err as Error).message}`);
    } finally {
      this.pumping = false;
    }
  }
}

/** The bytes a base64 string decodes to. */
function base64Bytes(s: string): number {
  const pad = s.endsWith("==") ? 2 : s.endsWith("=") ? 1 : 0;
  return Math.max(0, Math.floor((s.length * 3) / 4) - pad);
}
