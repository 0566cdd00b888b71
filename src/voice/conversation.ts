import type { SpeexModule } from "@echogarden/speex-resampler-wasm";
import type { Logger } from "pino";
import type { OpusRate } from "../audio/opus.ts";
import type { VoiceConfig } from "../config/config.ts";
import type { ChatMessage } from "../protocol/compat.ts";
import type { ActivityOptions, AgentChoice, AgentRun } from "./activity.ts";
import type { AudioThreads } from "./audio-threads.ts";
import { systemClock, type VoiceClock } from "./clock.ts";
import type { VoiceActivityPort } from "./engine-ports.ts";
import type { VoiceMetrics } from "./metrics.ts";
import { type FrameEncoder, OPUS_RATE } from "./opus.ts";
import { VoiceEvents } from "./peer-events.ts";
import type { AudioPort } from "./port.ts";
import { TextAgentActivity } from "./text-agent.ts";
import { turnHangoverMs } from "./uplink.ts";
import { openUplink, type VoiceUplink } from "./uplinks.ts";
import type { TurnUsage } from "./usage.ts";

export type { AgentChoice } from "./activity.ts";

/**
 * The part of a conversation that thinks, chosen by the agent's kind: a text agent's
 * (src/voice/text-agent.ts: the node's recognition, the agent's words, synthesis) or a realtime
 * agent's (src/voice/realtime/activity.ts: a model that hears and speaks). Both hear the same
 * uplink, at the rate they ask for, and speak through the same encoder and sender.
 */
export interface AgentActivityKind {
  /** The rate it hears the device at. */
  readonly rate: OpusRate;
  /** Whether the user is heard speaking now (a drain does not hand the device over then). */
  readonly hearing: boolean;
  /** The device's audio at `rate`, in order, with `silence`. */
  hear(pcm: Int16Array): void;
  silence(samples: number): void;
  /** Every 20 ms. */
  tick(): void;
  /** The audio thread decoding the uplink ended: what was being heard is lost. */
  audioLost(err: Error): void;
  close(): void;
}

/** How a realtime agent's part opens (src/voice/service.ts), with the conversation's audio out. */
export interface RealtimeKind {
  /** The realtime agent answering the device now, or undefined (a text agent, voice off, a usage limit reached). */
  chosen(): string | undefined;
  open(agentId: string, out: { encoder: FrameEncoder; send: (opus: Buffer, first: boolean) => boolean }): AgentActivityKind;
}

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
  /** The device's text agent and its engines as last known (refreshed in the background); undefined: no text agent answers. */
  agent: () => AgentChoice | undefined;
  /** The text agent's reply to the history so far, as text deltas. */
  run: AgentRun;
  /** Realtime agents, when the node has any: while one is chosen, it answers instead of the text agent. */
  realtime?: RealtimeKind;
  /** Default the system's. */
  clock?: VoiceClock;
  /** The node's audio threads: the uplink is decoded on one of them (default: on this thread). */
  threads?: AudioThreads | undefined;
  /** Counts the device's turns and refuses them at its usage limits. */
  usage?: TurnUsage;
  /** Whether the device is known to be at a usage limit now. */
  limited?: () => boolean;
  /** The node's tracing (each turn a trace), and the conversation's id in it. */
  tracing?: ActivityOptions["tracing"];
  /** Hears the device's audio as the uplink decoded it (at the thinking part's rate), silence included, in order (the turns' recordings). */
  tap?: { heard(pcm: Int16Array, rate: OpusRate): void; silence(samples: number, rate: OpusRate): void };
}

/** A conversation logs dropped audio at most this often. */
const DROP_LOG_MS = 10_000;
/** The jitter buffer's, the end of turn's and the agent's choice's clock. */
const TICK_MS = 20;

/**
 * One device's voice conversation, for the life of its connection, one pipeline whatever the
 * agent: the device's packets (one subscription) → the uplink (RTP → audio at the thinking part's
 * rate, on an audio thread or here) → the agent activity its kind chooses (a text agent's
 * recognition and turns, or a realtime model's session), whose replies go out through the same
 * encoder (the uplink's) and sender. The choice is followed every tick: another agent, of another
 * kind, takes the audio from the next packet on. Its failures stay inside it: every callback is
 * guarded and ends at most the turn.
 */
export class Conversation {
  private readonly o: ConversationOptions;
  private readonly clock: VoiceClock;
  private readonly peer: string;
  private uplink: VoiceUplink;
  private readonly unsubscribe: () => void;
  /** The text agents' part: kept for the connection's life (its history outlives a realtime agent's turn in between). */
  private readonly text: TextAgentActivity;
  /** The realtime agent's part while one answers. */
  private realtime: { id: string; part: AgentActivityKind } | undefined;
  /** A realtime agent whose part could not open (said once, not every tick). */
  private refused: string | undefined;
  /** The part answering now: the one the audio goes to. */
  private part: AgentActivityKind | undefined;
  /** The replies' encoder: whichever uplink is current. */
  private readonly encoder: FrameEncoder = { frame: (pcm, encoded, urgent) => this.uplink.frame(pcm, encoded, urgent) };
  private readonly stopTicker: () => void;
  private readonly logged = { overrun: 0, overrunAt: Number.NEGATIVE_INFINITY };
  /** Samples heard from the uplink. */
  heardSamples = 0;
  private closed = false;

  constructor(o: ConversationOptions) {
    this.o = o;
    this.clock = o.clock ?? systemClock;
    this.peer = o.port.publicKey;
    const log = this.log;
    this.text = new TextAgentActivity({
      config: o.config,
      events: new VoiceEvents(o.port),
      activity: o.activity,
      resampler: o.resampler,
      metrics: o.metrics,
      clock: this.clock,
      encoder: this.encoder,
      send: (opus, first) => o.port.sendFrame(opus, first),
      agent: o.agent,
      run: o.run,
      usage: o.usage,
      limited: o.limited,
      earlier: o.earlier,
      tracing: o.tracing,
      log,
    });
    this.part = this.choose();
    try {
      this.uplink = this.openUplink(this.part?.rate ?? this.text.rate);
    } catch (err) {
      // Nothing of the conversation stays open (a realtime session would reconnect for good) when it cannot start.
      this.realtime?.part.close();
      this.text.close();
      throw err;
    }
    this.unsubscribe = o.port.onPacket((packet) => {
      if (this.closed || !this.part) return;
      try {
        this.uplink.packet(packet);
      } catch (err) {
        o.logger.warn({ err, peer: this.peer }, "voice uplink packet failed");
      }
    });
    this.stopTicker = this.clock.every(TICK_MS, () => {
      try {
        this.follow();
        this.uplink.tick();
        this.text.tick();
        this.realtime?.part.tick();
      } catch (err) {
        o.logger.warn({ err, peer: this.peer }, "voice uplink tick failed");
      }
    });
  }

  /** The audio thread (its index in the pool) the uplink is decoded on; -1 on this thread. */
  get uplinkThread(): number {
    return this.uplink.thread;
  }

  /** Whether the device converses now (its agent, of either kind, can answer). */
  get active(): boolean {
    return !this.closed && this.part !== undefined;
  }

  /** The user is heard speaking now, even before it is a turn (its first frames). */
  get hearing(): boolean {
    return !this.closed && this.part?.hearing === true;
  }

  /** 16 kHz audio of the device for the text agent, in order (from the uplink; tests give it directly). */
  hear(pcm: Int16Array): void {
    if (!this.closed) this.text.hear(pcm);
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.stopTicker();
    this.unsubscribe();
    this.uplink.close();
    this.realtime?.part.close();
    this.realtime = undefined;
    this.part = undefined;
    this.text.close();
  }

  private readonly log = (level: "info" | "warn" | "debug", details: Record<string, unknown>, message: string) =>
    this.o.logger[level]({ peer: this.peer, ...details }, message);

  /**
   * The part the agent's kind chooses now: the realtime agent's (opened when it is chosen, closed
   * when another is), else the text agent's while one answers, else none (voice off).
   */
  private choose(): AgentActivityKind | undefined {
    const id = this.o.realtime?.chosen();
    if (this.realtime && this.realtime.id !== id) {
      this.realtime.part.close();
      this.realtime = undefined;
    }
    if (id !== undefined && !this.realtime && this.refused !== id) {
      try {
        this.realtime = { id, part: this.o.realtime!.open(id, { encoder: this.encoder, send: (opus, first) => this.o.port.sendFrame(opus, first) }) };
        this.refused = undefined;
      } catch (err) {
        this.refused = id;
        this.log("warn", { err, agent: id }, "this realtime agent cannot converse");
      }
    }
    if (this.realtime) return this.realtime.part;
    return this.o.agent() ? this.text : undefined;
  }

  /** Follows the device's agent: the audio goes to the part chosen now, the uplink reopened when its rate changes. */
  private follow(): void {
    const part = this.choose();
    if (part === this.part) return;
    this.part = part;
    if (part && part.rate !== this.uplink.rate) {
      this.uplink.close();
      this.uplink = this.openUplink(part.rate);
    }
  }

  private openUplink(rate: OpusRate): VoiceUplink {
    const { o } = this;
    // Quiet packets are decoded and handed on at once for this long after speech: the silence that
    // ends a turn (a detector's, or a realtime model's) must not wait in the uplink's look-back.
    return openUplink(
      o.threads,
      { payloadType: o.port.payloadType, audioLevelId: o.port.audioLevelId, rate, hangoverMs: turnHangoverMs(o.config.turn) },
      {
        pcm: (samples) => {
          this.heardSamples += samples.length;
          if (this.closed || this.part?.rate !== rate) return;
          o.tap?.heard(samples, rate);
          this.part.hear(samples);
        },
        silence: (samples) => {
          this.heardSamples += samples;
          if (this.closed || this.part?.rate !== rate) return;
          o.tap?.silence(samples, rate);
          this.part.silence(samples);
        },
        overrun: (samples) => this.overrun(samples),
        counted: (decoded, silent) => o.metrics.uplinkPackets(decoded, silent),
        failed: (err) => this.audioLost(err),
      },
      this.clock,
    );
  }

  /** The audio thread that decoded the uplink ended: the part answering loses what it was hearing. */
  private audioLost(err: Error): void {
    if (this.closed) return;
    this.log("warn", { err: err.message }, "the voice uplink's audio thread ended; the turn being heard fails");
    this.part?.audioLost(err);
  }

  /** The device claimed more audio than real time allows; logged at most every DROP_LOG_MS, not per packet. */
  private overrun(samples: number): void {
    this.o.metrics.uplinkDropped(samples / OPUS_RATE);
    this.logged.overrun += samples;
    const now = this.clock.now();
    if (now - this.logged.overrunAt <= DROP_LOG_MS) return;
    this.logged.overrunAt = now;
    this.log("warn", { dropped_ms: Math.round((this.logged.overrun / OPUS_RATE) * 1000) }, "the device sends audio ahead of real time; the excess is dropped");
    this.logged.overrun = 0;
  }
}
