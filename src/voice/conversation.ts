import type { SpeexModule } from "@echogarden/speex-resampler-wasm";
import type { Logger } from "pino";
import { concatInt16 } from "../audio/samples.ts";
import type { VoiceConfig } from "../config/config.ts";
import type { ChatMessage } from "../protocol/compat.ts";
import { ENGINE_RATE, type LiveRecogniser, type LiveVad, type Recognition, type Speaker, type VadEvent } from "./engines.ts";
import { VoiceEvents } from "./events.ts";
import type { Stage, VoiceMetrics } from "./metrics.ts";
import { OPUS_RATE, OpusCodec } from "./opus.ts";
import type { AudioPort } from "./port.ts";
import { Reply } from "./reply.ts";
import { Resampler } from "./resampler.ts";
import { Uplink } from "./uplink.ts";

/** The agent answering this device now. */
export interface AgentChoice {
  id: string;
  voice: string;
}

export interface ConversationOptions {
  port: AudioPort;
  config: VoiceConfig;
  recognition: Recognition;
  speaker: Speaker;
  resampler: SpeexModule;
  metrics: VoiceMetrics;
  logger: Logger;
  /** The device's agent as last known (refreshed in the background); undefined: voice is off. */
  agent: () => AgentChoice | undefined;
  /** Admits a partial recognition (shared by the process's conversations); undefined when one is already running. */
  partials: { tryAcquire(): (() => void) | undefined };
  /** The agent's reply to `messages` in turn `n` as text deltas; throws on failure. */
  reply: (agentId: string, messages: ChatMessage[], signal: AbortSignal, n: number) => Promise<AsyncIterable<string>>;
}

/** Audio kept from before speech was confirmed, so that the recogniser hears the turn's first word. */
const PREROLL_S = 1.2;
/** Speech begins this long before the detector says (its onset). */
const ONSET_PAD_S = 0.2;
/** Audio waiting for the detector beyond this (the engine is overloaded) is dropped, not queued without bound. */
const MAX_PENDING_SAMPLES = 4 * ENGINE_RATE;
/** A conversation logs dropped audio at most this often. */
const DROP_LOG_MS = 10_000;
/** Quiet: below this share of the turn's loudest chunk, or below this floor (of 32767). */
const QUIET_SHARE = 0.1;
const QUIET_FLOOR = 100;
/** Near-digital silence longer than this between turns is not given to the detector. */
const SKIP_QUIET_AFTER_S = 0.5;
/** Quiet this long starts the recognition the final transcript will most likely reuse. */
const QUIET_BEFORE_RECOGNITION_S = 0.12;
/** Partial words while speaking only in turns longer than this (a short question's final comes at once). */
const PARTIALS_AFTER_S = 3;
/** The jitter buffer's clock. */
const TICK_MS = 20;

interface Turn {
  n: number;
  recogniser: LiveRecogniser;
  /** Samples of the timeline (16 kHz from the first) where the turn's speech began. */
  startSample: number;
  /** Text already sent as `TEXT_DELTA`. */
  partialSent: string;
  partialRunning: boolean;
  /** The loudest chunk of the turn (RMS), the yardstick of quiet. */
  peak: number;
  /** Where the current quiet stretch began (timeline samples); undefined while the user speaks. */
  quietSince: number | undefined;
  /** A recognition was started in the current quiet stretch. */
  speculated: boolean;
}

/**
 * One device's voice conversation, for the life of its connection: uplink audio → voice activity
 * → turns (recognised as they are spoken) → the agent's reply spoken back, with barge-in. Its
 * failures stay inside it: every callback is guarded and ends at most the turn.
 */
export class Conversation {
  private readonly o: ConversationOptions;
  private readonly events: VoiceEvents;
  private readonly codec = new OpusCodec();
  private readonly down: Resampler;
  private readonly uplink: Uplink;
  private readonly vad: LiveVad;
  private readonly ticker: NodeJS.Timeout;
  private readonly history: ChatMessage[] = [];
  /** Samples pushed to the detector; with `pushedAt`, maps the timeline to the clock. */
  private timeline = 0;
  /** Samples not given to the detector (silence between turns): its seconds + this = our timeline. */
  private vadSkipped = 0;
  /** Samples of near-digital silence in a row, up to now. */
  private quietRun = 0;
  /** The detector is inside speech (whether or not a turn was started for it). */
  private vadSpeaking = false;
  private pushedAt = performance.now();
  private readonly pending: Int16Array[] = [];
  private pendingSamples = 0;
  private draining = false;
  private dropped = 0;
  private droppedLoggedAt = Number.NEGATIVE_INFINITY;
  private overrunSamples = 0;
  private overrunLoggedAt = Number.NEGATIVE_INFINITY;
  /** The last PREROLL_S of audio, as [start sample, samples]. */
  private readonly recent: Array<[number, Int16Array]> = [];
  private turns = 0;
  private turn: Turn | undefined;
  /** Speech heard during a reply while barge-in is off: ignored until it ends. */
  private ignoring = false;
  private reply: Reply | undefined;
  private closed = false;

  constructor(o: ConversationOptions) {
    this.o = o;
    this.events = new VoiceEvents(o.port);
    this.down = new Resampler(o.resampler, OPUS_RATE, ENGINE_RATE);
    this.vad = o.recognition.createVad({ minSpeechMs: o.config.turn.min_speech_ms, minSilenceMs: o.config.turn.silence_ms });
    this.uplink = new Uplink({
      codec: this.codec,
      resampler: this.down,
      payloadType: o.port.payloadType,
      pcm: (pcm) => this.heard(pcm),
      overrun: (samples) => this.overrun(samples),
    });
    o.port.onPacket((packet) => {
      if (this.closed || !o.agent()) return;
      try {
        this.uplink.packet(packet);
      } catch (err) {
        this.o.logger.warn({ err, peer: o.port.publicKey }, "voice uplink packet failed");
      }
    });
    this.ticker = setInterval(() => {
      try {
        this.uplink.tick();
      } catch (err) {
        this.o.logger.warn({ err, peer: o.port.publicKey }, "voice uplink tick failed");
      }
    }, TICK_MS);
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.ticker);
    this.reply?.interrupt();
    this.reply = undefined;
    this.turn = undefined;
    this.pending.length = 0;
    this.recent.length = 0;
    this.history.length = 0;
    this.down.close();
    this.codec.close();
  }

  /** The device claimed more audio than real time allows; logged at most every DROP_LOG_MS, not per packet. */
  private overrun(samples: number): void {
    this.o.metrics.uplinkDropped(samples / OPUS_RATE);
    this.overrunSamples += samples;
    const now = performance.now();
    if (now - this.overrunLoggedAt <= DROP_LOG_MS) return;
    this.overrunLoggedAt = now;
    this.o.logger.warn(
      { peer: this.o.port.publicKey, dropped_ms: Math.round((this.overrunSamples / OPUS_RATE) * 1000) },
      "the device sends audio ahead of real time; the excess is dropped",
    );
    this.overrunSamples = 0;
  }

  /** 16 kHz audio from the uplink, in order. */
  private heard(pcm: Int16Array): void {
    if (this.pendingSamples + pcm.length > MAX_PENDING_SAMPLES) {
      this.dropped += pcm.length;
      const now = performance.now();
      if (now - this.droppedLoggedAt > DROP_LOG_MS) {
        this.droppedLoggedAt = now;
        this.o.logger.warn(
          { peer: this.o.port.publicKey, dropped_ms: Math.round((this.dropped / ENGINE_RATE) * 1000) },
          "voice activity detection is behind; audio dropped",
        );
        this.dropped = 0;
      }
      return;
    }
    this.pending.push(pcm);
    this.pendingSamples += pcm.length;
    if (!this.draining) this.drain().catch((err: unknown) => this.o.logger.error({ err, peer: this.o.port.publicKey }, "voice audio handling failed"));
  }

  private async drain(): Promise<void> {
    this.draining = true;
    try {
      while (this.pending.length > 0 && !this.closed) {
        // Everything that arrived while the detector worked goes in one push: under load the
        // batches grow instead of the backlog.
        const pcm = concatInt16(this.pending.splice(0));
        this.pendingSamples = 0;
        const start = this.timeline;
        this.timeline += pcm.length;
        this.pushedAt = performance.now();
        this.remember(start, pcm);
        this.turn?.recogniser.push(pcm);
        let events: VadEvent[] = [];
        this.quietRun = rms(pcm) < QUIET_FLOOR ? this.quietRun + pcm.length : 0;
        try {
          // Near-digital silence between turns (half a second of it and more) cannot start speech:
          // the neural detector is spared it. Its clock then runs behind ours by what it skipped.
          if (!this.turn && !this.vadSpeaking && this.quietRun > SKIP_QUIET_AFTER_S * ENGINE_RATE) this.vadSkipped += pcm.length;
          else events = await this.vad.push(pcm);
        } catch (err) {
          this.o.logger.warn({ err, peer: this.o.port.publicKey }, "voice activity detection failed");
        }
        if (this.closed) return;
        for (const e of events) this.vadEvent(e);
        const turn = this.turn;
        if (turn && this.timeline - turn.startSample >= (this.o.config.turn.max_ms / 1000) * ENGINE_RATE) {
          for (const e of this.vad.flush()) this.vadEvent(e);
        } else if (turn) this.listen(turn, pcm);
      }
    } finally {
      this.draining = false;
    }
  }

  private remember(start: number, pcm: Int16Array): void {
    this.recent.push([start, pcm]);
    while (this.recent.length > 0 && this.recent[0]![0] + this.recent[0]![1].length < this.timeline - PREROLL_S * ENGINE_RATE) this.recent.shift();
  }

  /** Our timeline position (samples) of a detector time (seconds from the first sample it was given). */
  private position(vadSeconds: number): number {
    return vadSeconds * ENGINE_RATE + this.vadSkipped;
  }

  /** The clock time (performance.now) of a timeline position (samples). */
  private clockAt(position: number): number {
    return this.pushedAt - ((this.timeline - position) / ENGINE_RATE) * 1000;
  }

  private vadEvent(e: VadEvent): void {
    this.vadSpeaking = e.type === "start";
    if (e.type === "start") this.speechStarted(e.at);
    else this.speechEnded(e.at);
  }

  private speechStarted(at: number): void {
    const agent = this.o.agent();
    if (!agent) return;
    if (this.reply) {
      if (!this.o.config.barge_in) {
        this.ignoring = true;
        return;
      }
      this.reply.interrupt();
      this.reply = undefined;
    }
    const n = ++this.turns;
    const recogniser = this.o.recognition.createIncrementalRecogniser();
    const startSample = Math.max(0, Math.round(this.position(at) - ONSET_PAD_S * ENGINE_RATE));
    // What was said since the onset: the detector confirms speech only after min_speech_ms of it.
    for (const [start, pcm] of this.recent) {
      const end = start + pcm.length;
      if (end <= startSample) continue;
      recogniser.push(start >= startSample ? pcm : pcm.subarray(startSample - start));
    }
    this.turn = { n, recogniser, startSample, partialSent: "", partialRunning: false, peak: 0, quietSince: undefined, speculated: false };
    this.events.bos(`in-${n}`, "audio", "user.audio");
  }

  /**
   * When to recognise while the user speaks. As soon as the audio goes quiet (a likely end of the
   * turn, before the detector's silence confirms it) the recogniser starts on everything so far:
   * when the turn does end, its final transcript is that recognition, already under way. In long
   * turns, partial words also go out every so often while the user speaks.
   */
  private listen(turn: Turn, pcm: Int16Array): void {
    const level = rms(pcm);
    turn.peak = Math.max(turn.peak, level);
    if (level < Math.max(QUIET_FLOOR, turn.peak * QUIET_SHARE)) turn.quietSince ??= this.timeline - pcm.length;
    else {
      turn.quietSince = undefined;
      turn.speculated = false;
    }
    if (turn.quietSince !== undefined && !turn.speculated && this.timeline - turn.quietSince >= QUIET_BEFORE_RECOGNITION_S * ENGINE_RATE) {
      turn.speculated = true;
      this.partial(turn, true);
    } else if (this.timeline - turn.startSample >= PARTIALS_AFTER_S * ENGINE_RATE) this.partial(turn, false);
  }

  /** A recognition of the turn so far; its new words go out as TEXT_DELTA. */
  private partial(turn: Turn, speculative: boolean): void {
    if (turn.partialRunning) return;
    // Partials while speaking are a courtesy: one at a time per process, so that they never hold
    // up a final transcript. The one at a pause is (likely) the final transcript itself.
    const release = speculative ? () => {} : this.o.partials.tryAcquire();
    if (!release) return;
    turn.partialRunning = true;
    turn.recogniser.partial().then(
      (text) => {
        release();
        turn.partialRunning = false;
        if (this.turn !== turn || this.closed) return;
        // Only words that extend what was sent: a revision is left to the final transcript.
        if (text.length > turn.partialSent.length && text.startsWith(turn.partialSent)) {
          const fresh = text.slice(turn.partialSent.length);
          turn.partialSent = text;
          this.events.delta(`in-${turn.n}`, "user.transcript", fresh);
        }
      },
      () => {
        release();
        turn.partialRunning = false;
      },
    );
  }

  private speechEnded(at: number): void {
    if (this.ignoring) {
      this.ignoring = false;
      return;
    }
    const turn = this.turn;
    if (!turn) return;
    this.turn = undefined;
    const decided = performance.now();
    const lastVoiced = Math.min(decided, this.clockAt(this.position(at)));
    this.events.eos(`in-${turn.n}`, "audio", "user.audio");
    void this.respond(turn, { lastVoiced, decided }).catch((err) => this.o.logger.error({ err, peer: this.o.port.publicKey }, "voice turn failed"));
  }

  private async respond(turn: Turn, t: { lastVoiced: number; decided: number }): Promise<void> {
    const { n } = turn;
    const stages: Partial<Record<Stage, number>> = { end_of_speech: t.decided - t.lastVoiced };
    let transcript: string;
    try {
      transcript = (await turn.recogniser.finish()).trim();
    } catch (err) {
      if (this.closed) return;
      this.events.eos(`out-${n}`, "text", "assistant.text", { code: "failed", message: `recognition failed: ${(err as Error).message}` });
      return this.finishTurn(n, "failed", stages, false);
    }
    const transcribed = performance.now();
    stages.transcription = transcribed - t.decided;
    if (this.closed) return;
    this.events.done(`in-${n}`, "user.transcript", transcript);
    this.o.logger.debug({ peer: this.o.port.publicKey, turn: n, transcript }, "voice turn transcript");
    const agent = this.o.agent();
    // A newer turn began while this one was transcribed: it answers instead.
    if (!transcript || !agent || this.turns !== n) return this.finishTurn(n, "empty", stages, false);
    this.remember_("user", transcript);
    const messages = [...this.history];
    const reply = new Reply({
      n,
      voice: agent.voice,
      text: (signal) => this.o.reply(agent.id, messages, signal, n),
      speaker: this.o.speaker,
      resampler: this.o.resampler,
      codec: this.codec,
      send: (opus, first) => {
        this.o.metrics.frameSent();
        return this.o.port.sendFrame(opus, first);
      },
      events: this.events,
      late: () => this.o.metrics.frameLate(),
    });
    this.reply = reply;
    const outcome = await reply.outcome;
    if (this.reply === reply) this.reply = undefined;
    if (this.closed) return;
    if (outcome.heard) this.remember_("assistant", outcome.heard);
    if (outcome.at.firstToken !== undefined) stages.first_token = outcome.at.firstToken - transcribed;
    if (outcome.at.firstAudio !== undefined) {
      if (outcome.at.firstSentence !== undefined) stages.first_audio = outcome.at.firstAudio - outcome.at.firstSentence;
      stages.speech_to_audio = outcome.at.firstAudio - t.lastVoiced;
    }
    if (outcome.error) this.o.logger.warn({ peer: this.o.port.publicKey, turn: n, error: outcome.error }, "voice reply failed");
    this.finishTurn(n, outcome.result, stages, outcome.result === "interrupted");
  }

  private remember_(role: "user" | "assistant", content: string): void {
    this.history.push({ role, content });
    const max = this.o.config.history_turns * 2;
    if (this.history.length > max) this.history.splice(0, this.history.length - max);
  }

  private finishTurn(n: number, result: "answered" | "empty" | "interrupted" | "failed", stages: Partial<Record<Stage, number>>, interrupted: boolean): void {
    const rounded: Record<string, number | boolean> = {};
    for (const [k, v] of Object.entries(stages)) rounded[k] = Math.round(v * 10) / 10;
    rounded.interrupted = interrupted;
    this.events.done(`out-${n}`, "turn.metrics", JSON.stringify(rounded));
    this.o.metrics.turn(result, stages);
    this.o.logger.info({ peer: this.o.port.publicKey, turn: n, result, ...rounded }, "voice turn");
  }
}

function rms(pcm: Int16Array): number {
  let sum = 0;
  for (const x of pcm) sum += x * x;
  return Math.sqrt(sum / Math.max(1, pcm.length));
}
