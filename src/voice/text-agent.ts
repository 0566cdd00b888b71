import type { SpeexModule } from "@echogarden/speex-resampler-wasm";
import type { VoiceConfig } from "../config/config.ts";
import type { ChatMessage } from "../protocol/compat.ts";
import { type ActivityOptions, type AgentChoice, type AgentRun, type Turn, TurnActivity } from "./activity.ts";
import type { VoiceClock } from "./clock.ts";
import { RECOGNITION_RATE, type VoiceActivityPort } from "./engine-ports.ts";
import type { VoiceMetrics } from "./metrics.ts";
import type { FrameEncoder } from "./opus.ts";
import type { VoiceEvents } from "./peer-events.ts";
import { AudioRecognition } from "./recognition.ts";
import type { TurnUsage } from "./usage.ts";

/** Dropped audio is said at most this often. */
const DROP_LOG_MS = 10_000;

export interface TextAgentOptions {
  config: VoiceConfig;
  events: VoiceEvents;
  /** The node's voice activity detector. */
  activity: VoiceActivityPort;
  resampler: SpeexModule;
  metrics: VoiceMetrics;
  clock: VoiceClock;
  /** Encodes the replies' frames: the conversation's uplink (on its audio thread, or here). */
  encoder: FrameEncoder;
  send: (opus: Buffer, first: boolean) => boolean;
  agent: () => AgentChoice | undefined;
  run: AgentRun;
  usage?: TurnUsage | undefined;
  limited?: (() => boolean) | undefined;
  earlier?: Promise<ChatMessage[]> | undefined;
  tracing?: ActivityOptions["tracing"];
  log: (level: "info" | "warn" | "debug", details: Record<string, unknown>, message: string) => void;
}

/**
 * A text agent's part of a conversation, the kind of agent activity that needs the node's
 * engines: the device's 16 kHz audio → recognition (voice activity, turns, transcription) → the
 * turn activity (the agent's reply synthesised and spoken through a reply handle, barge-in,
 * history).
 */
export class TextAgentActivity {
  /** The rate it hears the device at (the recogniser's). */
  readonly rate = RECOGNITION_RATE;
  private readonly o: TextAgentOptions;
  private readonly turns: TurnActivity;
  private recognition: AudioRecognition<Turn>;
  private droppedAt = Number.NEGATIVE_INFINITY;
  private closed = false;

  constructor(o: TextAgentOptions) {
    this.o = o;
    this.turns = new TurnActivity({
      config: o.config,
      events: o.events,
      clock: o.clock,
      metrics: o.metrics,
      resampler: o.resampler,
      codec: o.encoder,
      send: o.send,
      agent: o.agent,
      run: o.run,
      ...(o.usage ? { usage: o.usage } : {}),
      ...(o.limited ? { limited: o.limited } : {}),
      ...(o.earlier ? { earlier: o.earlier } : {}),
      ...(o.tracing ? { tracing: o.tracing } : {}),
      log: o.log,
    });
    this.recognition = this.listen();
  }

  /** The user is heard speaking now, even before it is a turn (its first frames). */
  get hearing(): boolean {
    return !this.closed && this.recognition.hearing;
  }

  /** 16 kHz audio of the device, in order. */
  hear(pcm: Int16Array): void {
    if (this.closed) return;
    this.recognition.hear(pcm);
    const now = this.o.clock.now();
    if (now - this.droppedAt <= DROP_LOG_MS) return;
    const dropped = this.recognition.takeDropped();
    if (dropped === 0) return;
    this.droppedAt = now;
    this.o.log("warn", { dropped_ms: Math.round((dropped / RECOGNITION_RATE) * 1000) }, "voice activity detection is behind; audio dropped");
  }

  silence(samples: number): void {
    if (!this.closed) this.recognition.silence(samples);
  }

  /** Every 20 ms: the end of turn. */
  tick(): void {
    if (!this.closed) this.recognition.tick();
  }

  /**
   * The audio thread that decoded the uplink ended: the turn being heard fails (its audio has a
   * hole), and the next one is heard afresh, on a new detector, from the thread that took over.
   */
  audioLost(err: Error): void {
    if (this.closed) return;
    this.recognition.close();
    this.turns.audioLost(err);
    this.recognition = this.listen();
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.turns.close();
    this.recognition.close();
  }

  /** The turns as the detector hears them, on a detector of their own. */
  private listen(): AudioRecognition<Turn> {
    const { o } = this;
    return new AudioRecognition({
      // The detector hears the speech stop at the shortest silence that can end a turn; the words decide the rest; its
      // onsets pause a reply at voice activity's first frames (voice.md §7).
      vad: o.activity.create({ minSpeechMs: o.config.turn.min_speech_ms, minSilenceMs: o.config.turn.finished_silence_ms, onsets: true }),
      turn: o.config.turn,
      clock: o.clock,
      hooks: this.turns,
      warn: (message, details) => o.log("warn", details, message),
    });
  }
}
