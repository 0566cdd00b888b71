import type { SpeexModule } from "@echogarden/speex-resampler-wasm";
import type { VoiceConfig } from "../config/config.ts";
import type { ChatMessage } from "../protocol/compat.ts";
import type { VoiceClock } from "./clock.ts";
import type { EngineId, VoiceEngines } from "./engine-ports.ts";
import type { Stage, TurnResult, VoiceMetrics } from "./metrics.ts";
import type { OpusCodec } from "./opus.ts";
import type { VoiceEvents } from "./peer-events.ts";
import type { ListeningTurn, RecognitionHooks, TurnEnd } from "./recognition.ts";
import { failureCode, Reply } from "./reply.ts";

/** The agent answering this device now, with the engines its conversations use. */
export interface AgentChoice {
  id: string;
  voice: string;
  engines: VoiceEngines;
  /** BCP-47, given to the transcription. */
  language?: string;
}

/** The agent's reply to `messages` as text deltas; throws on failure; `signal` ends the model call (a barge-in, a cut reply). */
/** The agent's reply to `messages` in turn `n`, as text deltas. */
export type AgentRun = (agentId: string, messages: ChatMessage[], signal: AbortSignal, n: number) => Promise<AsyncIterable<string>>;

export interface ActivityOptions {
  config: VoiceConfig;
  events: VoiceEvents;
  clock: VoiceClock;
  metrics: VoiceMetrics;
  resampler: SpeexModule;
  codec: OpusCodec;
  /** Sends one Opus frame of a reply. */
  send: (opus: Buffer, first: boolean) => boolean;
  agent: () => AgentChoice | undefined;
  run: AgentRun;
  /** One line per turn, and what went wrong. */
  log: (level: "info" | "warn" | "debug", details: Record<string, unknown>, message: string) => void;
}

/** A turn of the conversation, from its speech to the end of its reply. */
export interface Turn extends ListeningTurn {
  n: number;
  agent: AgentChoice;
  /** Ends the turn's transcription (a barge-in, the connection's end). */
  abort: AbortController;
  ended: boolean;
  /** Text already sent as `TEXT_DELTA`. */
  partialSent: string;
}

/**
 * The turns of one conversation (agents-js's agent activity): a turn per speech, its transcript,
 * the agent's reply spoken through a reply handle, barge-in, and the bounded history of what was
 * said and heard.
 */
export class TurnActivity implements RecognitionHooks<Turn> {
  private readonly o: ActivityOptions;
  private readonly history: ChatMessage[] = [];
  private turns = 0;
  /** The turn whose final transcript is awaited. */
  private transcribing: Turn | undefined;
  private reply: Reply | undefined;
  private closed = false;

  constructor(o: ActivityOptions) {
    this.o = o;
  }

  close(): void {
    this.closed = true;
    this.transcribing?.abort.abort(new Error("the conversation ended"));
    this.reply?.interrupt();
    this.reply = undefined;
    this.history.length = 0;
  }

  speechStarted(): Turn | undefined {
    const agent = this.o.agent();
    if (!agent || this.closed) return undefined;
    if (this.reply) {
      if (!this.o.config.barge_in) return undefined;
      this.reply.interrupt();
      this.reply = undefined;
    }
    const n = this.turns + 1;
    const abort = new AbortController();
    let turn: Turn | undefined;
    let transcription: Turn["transcription"];
    try {
      transcription = agent.engines.transcription.open({
        ...(agent.language ? { language: agent.language } : {}),
        signal: abort.signal,
        maxWaitMs: this.o.config.max_reply_delay_ms,
        partial: (text) => {
          if (turn) this.partial(turn, text);
        },
      });
    } catch (err) {
      // An engine that cannot take the turn: this speech is not heard, the conversation goes on.
      this.o.log("warn", { err }, "the transcription could not start a turn");
      return undefined;
    }
    this.turns = n;
    turn = { n, agent, abort, ended: false, partialSent: "", transcription };
    this.o.events.bos(`in-${n}`, "audio", "user.audio");
    return turn;
  }

  speechEnded(turn: Turn, end: TurnEnd): void {
    turn.ended = true;
    this.o.events.eos(`in-${turn.n}`, "audio", "user.audio");
    void this.respond(turn, end).catch((err: unknown) => this.o.log("warn", { err, turn: turn.n }, "voice turn failed"));
  }

  /** Partial words: only those that extend what was sent (a revision is left to the final transcript). */
  private partial(turn: Turn, text: string): void {
    if (turn.ended || this.closed) return;
    if (text.length > turn.partialSent.length && text.startsWith(turn.partialSent)) {
      const fresh = text.slice(turn.partialSent.length);
      turn.partialSent = text;
      this.o.events.delta(`in-${turn.n}`, "user.transcript", fresh);
    }
  }

  private async respond(turn: Turn, end: TurnEnd): Promise<void> {
    const { n } = turn;
    const { clock } = this.o;
    const stages: Partial<Record<Stage, number>> = { end_of_speech: end.decided - end.lastVoiced };
    const done = (result: TurnResult, engines: TurnEngines, flags: TurnFlags) => this.finishTurn(n, result, stages, engines, flags);
    const engines: TurnEngines = { transcription: turn.agent.engines.transcription.engine, speech: turn.agent.engines.speech.engine };
    const flags: TurnFlags = { interrupted: false, turn_cut: end.cut, reply_cut: false };
    this.transcribing = turn;
    let transcript: string;
    try {
      transcript = await turn.transcription.finish();
    } catch (err) {
      if (this.closed) return;
      if (turn.abort.signal.aborted) return done("empty", engines, flags);
      this.o.events.eos(`out-${n}`, "text", "assistant.text", { code: failureCode(err), message: `recognition failed: ${(err as Error).message}` });
      return done("failed", engines, flags);
    } finally {
      if (this.transcribing === turn) this.transcribing = undefined;
    }
    const transcribed = clock.now();
    stages.transcription = transcribed - end.decided;
    if (this.closed) return;
    this.o.events.done(`in-${n}`, "user.transcript", transcript);
    this.o.log("debug", { turn: n, transcript }, "voice turn transcript");
    const agent = this.o.agent();
    // A newer turn began while this one was transcribed: it answers instead.
    if (!transcript || !agent || this.turns !== n) return done("empty", engines, flags);
    this.remember("user", transcript);
    const messages = [...this.history];
    engines.speech = agent.engines.speech.engine;
    const reply = new Reply({
      n,
      voice: agent.voice,
      text: (signal) => this.o.run(agent.id, messages, signal, n),
      speech: agent.engines.speech,
      resampler: this.o.resampler,
      codec: this.o.codec,
      clock,
      send: (opus, first) => {
        this.o.metrics.frameSent();
        return this.o.send(opus, first);
      },
      events: this.o.events,
      late: () => this.o.metrics.frameLate(),
      maxChars: this.o.config.max_reply_chars,
      maxWaitMs: this.o.config.max_reply_delay_ms,
    });
    this.reply = reply;
    const outcome = await reply.outcome;
    if (this.reply === reply) this.reply = undefined;
    if (this.closed) return;
    if (outcome.heard) this.remember("assistant", outcome.heard);
    if (outcome.at.firstToken !== undefined) stages.first_token = outcome.at.firstToken - transcribed;
    if (outcome.at.firstAudio !== undefined) {
      if (outcome.at.firstSentence !== undefined) stages.first_audio = outcome.at.firstAudio - outcome.at.firstSentence;
      stages.speech_to_audio = outcome.at.firstAudio - end.lastVoiced;
    }
    if (outcome.error) this.o.log("warn", { turn: n, error: outcome.error }, "voice reply failed");
    done(outcome.result, engines, { ...flags, interrupted: outcome.result === "interrupted", reply_cut: outcome.cut });
  }

  private remember(role: "user" | "assistant", content: string): void {
    this.history.push({ role, content });
    const max = this.o.config.history_turns * 2;
    if (this.history.length > max) this.history.splice(0, this.history.length - max);
  }

  private finishTurn(n: number, result: TurnResult, stages: Partial<Record<Stage, number>>, engines: TurnEngines, flags: TurnFlags): void {
    const metrics: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(stages)) metrics[k] = Math.round(v * 10) / 10;
    Object.assign(metrics, flags, { engines });
    this.o.events.done(`out-${n}`, "turn.metrics", JSON.stringify(metrics));
    this.o.metrics.turn(result, stages, engines);
    this.o.log("info", { turn: n, result, ...metrics }, "voice turn");
  }
}

/** Which engines answered a turn (`turn.metrics.engines`). */
export interface TurnEngines {
  transcription: EngineId;
  speech: EngineId;
}

/** What else `turn.metrics` says of a turn. */
interface TurnFlags {
  interrupted: boolean;
  /** The user's turn reached `voice.turn.max_ms` and was cut there. */
  turn_cut: boolean;
  /** The reply reached `voice.max_reply_chars`: the rest was not spoken. */
  reply_cut: boolean;
}
