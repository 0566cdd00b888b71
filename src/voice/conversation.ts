import type { SpeexModule } from "@echogarden/speex-resampler-wasm";
import type { Logger } from "pino";
import type { VoiceConfig } from "../config/config.ts";
import type { ChatMessage } from "../protocol/compat.ts";
import { type AgentChoice, type AgentRun, type Turn, TurnActivity } from "./activity.ts";
import type { AudioThreads, ThreadUplink } from "./audio-threads.ts";
import { systemClock, type VoiceClock } from "./clock.ts";
import { RECOGNITION_RATE, type VoiceActivityPort } from "./engine-ports.ts";
import type { VoiceMetrics } from "./metrics.ts";
import { OPUS_RATE, OpusCodec } from "./opus.ts";
import { VoiceEvents } from "./peer-events.ts";
import type { AudioPort } from "./port.ts";
import { AudioRecognition } from "./recognition.ts";
import { turnHangoverMs, Uplink } from "./uplink.ts";

import type { TurnUsage } from "./usage.ts";

export type { AgentChoice } from "./activity.ts";

export interface ConversationOptions {
  port: AudioPort;
  /** The history this conversation continues from (the device's stored turns), when any. */
  earlier?: Promise<ChatMessage[]>;
  config: VoiceConfig;
  /** The node's voice activity detector. */
  activity: VoiceActivityPort;
  resampler: SpeexModule;
  metrics: VoiceMetrics;
  logger: Logger;
  /** The device's agent and its engines as last known (refreshed in the background); undefined: voice is off. */
  agent: () => AgentChoice | undefined;
  /** The agent's reply to the history so far, as text deltas. */
  run: AgentRun;
  /** Default the system's. */
  clock?: VoiceClock;
  /** The node's audio threads: the uplink is decoded on one of them (default: on this thread). */
  threads?: AudioThreads | undefined;
  /** Counts the device's turns and refuses them at its usage limits. */
  usage?: TurnUsage;
  /** Whether the device is known to be at a usage limit now. */
  limited?: () => boolean;
  /** Hears the device's audio as the uplink decoded it (16 kHz), silence included, in order (the turns' recordings). */
  tap?: { heard(pcm: Int16Array): void; silence(samples: number): void };
}

/** A conversation logs dropped audio at most this often. */
const DROP_LOG_MS = 10_000;
/** The jitter buffer's and the end of turn's clock. */
const TICK_MS = 20;
/** The uplink's packets are counted in the metrics every this many ticks. */
const COUNT_TICKS = 50;

/**
 * One device's voice conversation, for the life of its connection: the uplink (RTP → 16 kHz
 * audio) → recognition (voice activity, turns, transcription) → the turn activity (the agent's
 * reply spoken back through a reply handle, barge-in, history). Its failures stay inside it:
 * every callback is guarded and ends at most the turn.
 */
export class Conversation {
  private readonly o: ConversationOptions;
  private readonly clock: VoiceClock;
  /** The uplink decodes straight to the recogniser's rate. */
  private readonly codec = new OpusCodec(RECOGNITION_RATE);
  /** The uplink, here or on an audio thread. */
  private readonly uplink: { here: Uplink } | { thread: ThreadUplink };
  private recognition: AudioRecognition<Turn>;
  private readonly turns: TurnActivity;
  private readonly stopTicker: () => void;
  private readonly logged = { overrun: 0, overrunAt: Number.NEGATIVE_INFINITY, droppedAt: Number.NEGATIVE_INFINITY };
  /** Uplink packets already counted in the metrics, and ticks until they are counted again. */
  private readonly counted = { decoded: 0, silent: 0, ticks: 0 };
  /** Samples heard from the uplink. */
  heardSamples = 0;
  private closed = false;

  constructor(o: ConversationOptions) {
    this.o = o;
    this.clock = o.clock ?? systemClock;
    const peer = o.port.publicKey;
    this.turns = new TurnActivity({
      config: o.config,
      events: new VoiceEvents(o.port),
      clock: this.clock,
      metrics: o.metrics,
      resampler: o.resampler,
      // The replies are encoded where the uplink is decoded: on its audio thread, or here.
      codec: {
        frame: (pcm, encoded, urgent) => {
          if ("thread" in this.uplink) this.uplink.thread.frame(pcm, encoded, urgent);
          else this.codec.frame(pcm, encoded);
        },
      },
      send: (opus, first) => o.port.sendFrame(opus, first),
      agent: o.agent,
      run: o.run,
      ...(o.usage ? { usage: o.usage } : {}),
      ...(o.limited ? { limited: o.limited } : {}),
      ...(o.earlier ? { earlier: o.earlier } : {}),
      log: (level, details, message) => o.logger[level]({ peer, ...details }, message),
    });
    this.recognition = this.listen();
    const pcm = (samples: Int16Array) => {
      this.heardSamples += samples.length;
      o.tap?.heard(samples);
      this.hear(samples);
    };
    // Quiet packets are decoded and handed on at once for this long after speech: the silence that
    // ends a turn (up to unfinished_silence_ms) must not wait in the uplink's look-back.
    const hangoverMs = turnHangoverMs(o.config.turn);
    const silence = (samples: number) => {
      this.heardSamples += samples;
      if (this.closed) return;
      o.tap?.silence(samples);
      this.recognition.silence(samples);
    };
    this.uplink = o.threads
      ? {
          thread: o.threads.uplink({
            payloadType: o.port.payloadType,
            audioLevelId: o.port.audioLevelId,
            rate: RECOGNITION_RATE,
            hangoverMs,
            pcm,
            silence,
            overrun: (samples) => this.overrun(samples),
            counted: (decoded, silent) => o.metrics.uplinkPackets(decoded, silent),
            failed: (err) => this.audioLost(err),
          }),
        }
      : {
          here: new Uplink({
            codec: this.codec,
            payloadType: o.port.payloadType,
            audioLevelId: o.port.audioLevelId,
            hangoverMs,
            pcm,
            silence,
            overrun: (samples) => this.overrun(samples),
            now: () => this.clock.now(),
          }),
        };
    const uplink = this.uplink;
    o.port.onPacket((packet) => {
      if (this.closed || !o.agent()) return;
      try {
        if ("here" in uplink) uplink.here.packet(packet);
        else uplink.thread.packet(packet);
      } catch (err) {
        o.logger.warn({ err, peer }, "voice uplink packet failed");
      }
    });
    this.stopTicker = this.clock.every(TICK_MS, () => {
      try {
        if ("here" in uplink) uplink.here.tick();
        this.recognition.tick();
        if (++this.counted.ticks >= COUNT_TICKS) this.count();
      } catch (err) {
        o.logger.warn({ err, peer }, "voice uplink tick failed");
      }
    });
  }

  /** The audio thread (its index in the pool) the uplink is decoded on; -1 on this thread. */
  get uplinkThread(): number {
    return "thread" in this.uplink ? this.uplink.thread.thread : -1;
  }

  /** Whether the device converses through this pipeline now (its agent is a text agent with engines). */
  get active(): boolean {
    return !this.closed && this.o.agent() !== undefined;
  }

  /** The user is heard speaking now, even before it is a turn (its first frames). */
  get hearing(): boolean {
    return !this.closed && this.recognition.hearing;
  }

  /** 16 kHz audio of the device, in order (from the uplink; tests give it directly). */
  hear(pcm: Int16Array): void {
    if (this.closed) return;
    this.recognition.hear(pcm);
    const now = this.clock.now();
    if (now - this.logged.droppedAt <= DROP_LOG_MS) return;
    const dropped = this.recognition.takeDropped();
    if (dropped === 0) return;
    this.logged.droppedAt = now;
    this.o.logger.warn(
      { peer: this.o.port.publicKey, dropped_ms: Math.round((dropped / RECOGNITION_RATE) * 1000) },
      "voice activity detection is behind; audio dropped",
    );
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.stopTicker();
    this.count();
    if ("thread" in this.uplink) this.uplink.thread.close();
    this.turns.close();
    this.recognition.close();
    this.codec.close();
  }

  /** The turns as the detector hears them, on a detector of their own. */
  private listen(): AudioRecognition<Turn> {
    const { o } = this;
    const peer = o.port.publicKey;
    return new AudioRecognition({
      // The detector hears the speech stop at the shortest silence that can end a turn; the words decide the rest; its
      // onsets pause a reply at voice activity's first frames (voice.md §7).
      vad: o.activity.create({ minSpeechMs: o.config.turn.min_speech_ms, minSilenceMs: o.config.turn.finished_silence_ms, onsets: true }),
      turn: o.config.turn,
      clock: this.clock,
      hooks: this.turns,
      warn: (message, details) => o.logger.warn({ peer, ...details }, message),
    });
  }

  /**
   * The audio thread that decoded the uplink ended: the turn being heard fails (its audio has a
   * hole), and the next one is heard afresh, on a new detector, from the thread that took over.
   */
  private audioLost(err: Error): void {
    if (this.closed) return;
    this.o.logger.warn({ peer: this.o.port.publicKey, err: err.message }, "the voice uplink's audio thread ended; the turn being heard fails");
    this.recognition.close();
    this.turns.audioLost(err);
    this.recognition = this.listen();
  }

  /** The uplink's packets since last counted, into the metrics (every second, not per packet). */
  private count(): void {
    if (!("here" in this.uplink)) return;
    const { decoded, silent } = this.uplink.here;
    this.o.metrics.uplinkPackets(decoded - this.counted.decoded, silent - this.counted.silent);
    this.counted.decoded = decoded;
    this.counted.silent = silent;
    this.counted.ticks = 0;
  }

  /** The device claimed more audio than real time allows; logged at most every DROP_LOG_MS, not per packet. */
  private overrun(samples: number): void {
    this.o.metrics.uplinkDropped(samples / OPUS_RATE);
    this.logged.overrun += samples;
    const now = this.clock.now();
    if (now - this.logged.overrunAt <= DROP_LOG_MS) return;
    this.logged.overrunAt = now;
    this.o.logger.warn(
      { peer: this.o.port.publicKey, dropped_ms: Math.round((this.logged.overrun / OPUS_RATE) * 1000) },
      "the device sends audio ahead of real time; the excess is dropped",
    );
    this.logged.overrun = 0;
  }
}
