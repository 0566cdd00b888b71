import type { SpeexModule } from "@echogarden/speex-resampler-wasm";
import type { VoiceConfig } from "../config/config.ts";
import type { Admission } from "../domain/usage-meter.ts";
import type { Traced, Tracing } from "../observability/tracing.ts";
import { TurnTrace } from "../observability/voice-spans.ts";
import type { ChatMessage } from "../protocol/compat.ts";
import type { VoiceClock } from "./clock.ts";
import type { EngineId, VoiceEngines } from "./engine-ports.ts";
import type { Stage, TurnResult, VoiceMetrics } from "./metrics.ts";
import type { FrameEncoder } from "./opus.ts";
import type { VoiceEvents } from "./peer-events.ts";
import { PreparedReply } from "./preemptive.ts";
import type { ListeningTurn, RecognitionHooks, TurnEnd } from "./recognition.ts";
import { failureCode, Reply, type ReplyOptions } from "./reply.ts";
import { contentWords, englishRules, leadingSaid, type TurnEndModel, turnEndSilence } from "./turn-end.ts";
import { countedSpeech, type TurnUsage } from "./usage.ts";

/** The agent answering this device now, with the engines its conversations use. */
export interface AgentChoice {
  id: string;
  voice: string;
  engines: VoiceEngines;
  /** BCP-47, given to the transcription. */
  language?: string;
}

/**
 * The agent's reply to `messages` in turn `n`, as text deltas; throws on failure; `signal` ends the
 * model call (a barge-in, a cut reply, a discarded preemptive reply). `release`, when given, is
 * awaited before any tool runs (a reply prepared in a pause runs no tool unless it is used).
 */
export type AgentRun = (
  agentId: string,
  messages: ChatMessage[],
  signal: AbortSignal,
  n: number,
  release?: () => Promise<void>,
  trace?: Traced,
) => Promise<AsyncIterable<string>>;

export interface ActivityOptions {
  config: VoiceConfig;
  events: VoiceEvents;
  clock: VoiceClock;
  metrics: VoiceMetrics;
  resampler: SpeexModule;
  /** Encodes the reply's frames. */
  codec: FrameEncoder;
  /** Sends one Opus frame of a reply. */
  send: (opus: Buffer, first: boolean) => boolean;
  agent: () => AgentChoice | undefined;
  run: AgentRun;
  /** One line per turn, and what went wrong. */
  log: (level: "info" | "warn" | "debug", details: Record<string, unknown>, message: string) => void;
  /** The end-of-turn rules (default the English rules of src/voice/turn-end.ts). */
  turnEnd?: TurnEndModel;
  /** Counts the turns and refuses them at a usage limit (usage.md); none: nothing is counted. */
  usage?: TurnUsage;
  /** Whether the device is known to be at a usage limit now (then no reply is prepared in a pause). */
  limited?: () => boolean;
  /**
   * The history a conversation continues from (fleet.md §3: the device's stored turns when it comes
   * back from a drained node), put before the first turn's words once known.
   */
  earlier?: Promise<ChatMessage[]>;
  /** The node's tracing (each turn a trace), and the conversation's id in it. */
  tracing?: { tracing: Tracing; conversation?: string | undefined } | undefined;
}

/** Audio is judged in pieces of about 20 ms: "sound until min_ms" allows this much short. */
const SOUND_SLACK_MS = 40;
/**
 * A reply paused at voice activity's first frames resumes if neither speech nor a noise was heard
 * this long after `min_speech_ms`: a detector that fails never holds a reply for good. (An uplink
 * that stops sending ends the onset as a noise: AudioRecognition.tick.) Not shorter: under load the
 * detector's confirmation comes late, and a reply resumed before it flickers back for a moment.
 */
const HOLD_SLACK_MS = 3_000;
/** Speech over a reply whose words so far are not (surely) a barge-in is judged again this often while it lasts. */
const RECHECK_MS = 200;
/** Sure words heard while the sound goes on are judged again this soon, on more audio (are they heard again?). */
const CONFIRM_MS = 100;
/** The sound had ended (no sound this long) when its words were asked: they are all the words there will be. */
const ENDED_MS = 100;
/**
 * Speech over a reply that has gone on this long is no backchannel (a hum lasts well under a second):
 * its plain words so far decide, sure or not. A real request whose first words the recogniser kept
 * hearing differently ("Call my" → "Coal my") otherwise waited for its end (seen in CI, issue 50).
 */
const LONG_SOUND_MS = 1_500;
/**
 * A reply paused at an onset that proved a noise resumes this long after it, unless voice activity
 * starts again meanwhile: the detector drops a candidate at its first quiet frame, and a word's
 * first syllable can dip (without this, the reply would flicker back between syllables).
 */
const NOISE_RESUME_MS = 150;

/** A turn of the conversation, from its speech to the end of its reply. */
export interface Turn extends ListeningTurn {
  /** Its number; 0 while it is speech over a reply that may yet be no turn at all. */
  n: number;
  agent: AgentChoice;
  /** When its speech began (clock). */
  onset: number;
  /** Ends the turn's transcription (a barge-in, the connection's end). */
  abort: AbortController;
  ended: boolean;
  /** Text already sent as `TEXT_DELTA`. */
  partialSent: string;
  /** Speech over this reply, not (yet) a barge-in: its audio is paused, and this speech has no events. */
  over?: Speaking | undefined;
  /** The words of that speech are being recognised (is it a barge-in?). */
  checking?: boolean;
  /** The first two of the sure words of the last check, while the sound went on: heard again first, they are a barge-in. */
  sureLead?: string[] | undefined;
  /** The reply it interrupted, whose heard text the history must have before this turn's reply is asked. */
  interrupted?: Promise<void>;
  /** The barge-in check at `interruption.min_ms`, and the resume deadline. */
  timers: Array<() => void>;
  /** The reply asked of the model in the current pause. */
  prepared?: Prepared | undefined;
  /** Preemptive replies asked in this turn. */
  preempted: number;
  /** Its trace, from when it is a turn of its own, when the node traces. */
  trace?: TurnTrace | undefined;
}

/** A reply being spoken, and the false interruptions it survived. */
interface Speaking {
  n: number;
  reply: Reply;
  falseInterruptions: number;
  /** Resolves once what was heard of it is in the history. */
  remembered: Promise<void>;
}

/** A preemptive reply with what it was asked with. */
interface Prepared {
  reply: PreparedReply;
  agentId: string;
  /** The history it was given (before the user's words). */
  history: ChatMessage[];
}

/**
 * The turns of one conversation (agents-js's agent activity): a turn per speech, its transcript,
 * the agent's reply spoken through a reply handle, barge-in, and the bounded history of what was
 * said and heard. voice.md §7: the silence that ends a turn follows its words; the model is asked
 * already in the pause; speech over a reply pauses it and is a barge-in only when it lasts and
 * brings words that are not fillers, else the reply resumes as if nothing happened.
 */
export class TurnActivity implements RecognitionHooks<Turn> {
  private readonly o: ActivityOptions;
  private readonly history: ChatMessage[] = [];
  private readonly turnEnd: TurnEndModel;
  private turns = 0;
  /** The turn whose final transcript is awaited. */
  private transcribing: Turn | undefined;
  /** The last turn begun (its speech may still be heard). */
  private listening: Turn | undefined;
  private speaking: Speaking | undefined;
  /** Preemptive replies not yet used or discarded. */
  private readonly prepared = new Set<PreparedReply>();
  /** The reply paused at voice activity's first frames, until they are speech (a turn over it) or a noise. */
  private held: { speaking: Speaking; stop: () => void; resume?: (() => void) | undefined } | undefined;
  private closed = false;

  constructor(o: ActivityOptions) {
    this.o = o;
    this.turnEnd = o.turnEnd ?? englishRules;
  }

  close(): void {
    this.closed = true;
    const ended = new Error("the conversation ended");
    this.transcribing?.abort.abort(ended);
    this.listening?.abort.abort(ended);
    for (const stop of this.listening?.timers.splice(0) ?? []) stop();
    this.speaking?.reply.interrupt();
    this.speaking = undefined;
    this.held?.stop();
    this.held?.resume?.();
    this.held = undefined;
    for (const p of this.prepared) p.discard();
    this.prepared.clear();
    this.history.length = 0;
  }

  /**
   * Voice activity's first frames over a reply: its audio pauses at once (voice.md §7: within 250
   * ms of the onset at the device); a pause that proves false costs nothing, the reply resumes.
   */
  voiceOnset(_at: number): void {
    const speaking = this.speaking;
    // Speech over it already holds it (its end is being judged): that speech decides.
    if (!speaking || this.closed || !this.o.config.barge_in || this.listening?.over === speaking) return;
    if (this.held) {
      // Activity again after a noise: the reply stays paused.
      this.held.resume?.();
      this.held.resume = undefined;
      return;
    }
    speaking.reply.pause();
    const stop = this.o.clock.after(this.o.config.turn.min_speech_ms + HOLD_SLACK_MS, () => this.guard(() => this.release()));
    this.held = { speaking, stop };
  }

  /** The activity that paused the reply was a noise, not speech: the reply goes on shortly, unless activity starts again. */
  voiceGone(): void {
    const held = this.held;
    if (!held || held.resume) return;
    held.resume = this.o.clock.after(NOISE_RESUME_MS, () => this.guard(() => this.release()));
  }

  /** The reply held at an onset goes on (unless speech over it holds it now). */
  private release(): void {
    const held = this.held;
    if (!held) return;
    this.held = undefined;
    held.stop();
    held.resume?.();
    if (this.speaking === held.speaking && this.listening?.over !== held.speaking) held.speaking.reply.resume();
  }

  speechStarted(onset: number): Turn | undefined {
    const agent = this.o.agent();
    const held = this.held;
    this.held = undefined;
    held?.stop();
    held?.resume?.();
    const speaking = this.speaking;
    if (!agent || this.closed || (speaking && !this.o.config.barge_in)) {
      // Speech that is no turn: a reply held at its onset goes on.
      if (held && this.speaking === held.speaking) held.speaking.reply.resume();
      return undefined;
    }
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
      if (held && this.speaking === held.speaking) held.speaking.reply.resume();
      return undefined;
    }
    turn = { n: 0, agent, onset, soundAt: onset, abort, ended: false, partialSent: "", transcription, timers: [], preempted: 0 };
    this.listening = turn;
    if (speaking) {
      // Speech over a reply: its audio holds at once; whether this is a barge-in, its length and words say.
      speaking.reply.pause();
      turn.over = speaking;
      const check = turn;
      // Asked first CONFIRM_MS before min_ms: heard again, the words can end the reply as the sound reaches min_ms.
      const at = onset + this.o.config.interruption.min_ms - CONFIRM_MS - this.o.clock.now();
      turn.timers.push(this.o.clock.after(Math.max(0, at), () => this.guard(() => this.checkWords(check))));
      return turn;
    }
    this.begin(turn);
    return turn;
  }

  silenceNeeded(turn: Turn, text: string | undefined): number {
    const t = this.o.config.turn;
    // Speech over a reply ends at the shortest silence (the reply resumes soon after a false interruption); with words it is a turn already.
    if (turn.over) return t.finished_silence_ms;
    return turnEndSilence(text, turn.agent.language, t, this.turnEnd);
  }

  paused(turn: Turn, text: string): void {
    if (turn.over || turn.n === 0 || this.closed || !this.o.config.turn.preemptive || this.o.limited?.()) return;
    if (turn.prepared && !turn.prepared.reply.discarded && turn.prepared.reply.answers(text)) return;
    this.drop(turn);
    const agent = this.o.agent();
    if (!agent || agent.id !== turn.agent.id || this.turns !== turn.n) return;
    const history = [...this.history];
    const messages: ChatMessage[] = [...history, { role: "user", content: text }];
    const { n } = turn;
    const reply = new PreparedReply(text, (signal, release) => this.o.run(agent.id, messages, signal, n, release, turn.trace?.traced), {
      clock: this.o.clock,
      maxChars: this.o.config.max_reply_chars,
    });
    this.prepared.add(reply);
    turn.prepared = { reply, agentId: agent.id, history };
    turn.preempted++;
  }

  resumed(turn: Turn): void {
    this.drop(turn);
  }

  speechEnded(turn: Turn, end: TurnEnd): void {
    turn.ended = true;
    if (turn.over) {
      this.overEnded(turn, end);
      return;
    }
    this.o.events.eos(`in-${turn.n}`, "audio", "user.audio");
    void this.respond(turn, end).catch((err: unknown) => this.o.log("warn", { err, turn: turn.n }, "voice turn failed"));
  }

  /**
   * The conversation's audio thread ended: the reply being spoken fails (its audio stops), and so
   * does a turn being heard (its audio has a hole), with the contract's failed events. The next
   * speech is a turn as usual.
   */
  audioLost(err: Error): void {
    // The reply being spoken: its frames were being encoded on that thread.
    this.speaking?.reply.fail(new Error(`the reply's audio was lost: ${err.message}`));
    const turn = this.listening;
    if (!turn || turn.ended || this.closed) return;
    turn.ended = true;
    for (const stop of turn.timers.splice(0)) stop();
    turn.abort.abort(err);
    this.drop(turn);
    turn.over = undefined;
    if (turn.n === 0) return;
    const { n } = turn;
    this.o.events.eos(`in-${n}`, "audio", "user.audio");
    this.o.events.eos(`out-${n}`, "text", "assistant.text", { code: "failed", message: `the turn's audio was lost: ${err.message}` });
    const engines: TurnEngines = { transcription: turn.agent.engines.transcription.engine, speech: turn.agent.engines.speech.engine };
    this.finishTurn(
      n,
      "failed",
      {},
      engines,
      {
        interrupted: false,
        turn_cut: false,
        reply_cut: false,
        preemptive: turn.preempted > 0 ? "discarded" : "off",
        false_interruptions: 0,
      },
      turn.trace,
      "the turn's audio was lost",
    );
  }

  /** A turn of its own: its number and its first event. */
  private begin(turn: Turn): void {
    this.turns++;
    turn.n = this.turns;
    const t = this.o.tracing;
    if (t) {
      const { agent } = turn;
      const engines = { transcription: agent.engines.transcription.engine, speech: agent.engines.speech.engine };
      turn.trace = TurnTrace.start(t.tracing, {
        now: this.o.clock.now(),
        onset: turn.onset,
        n: turn.n,
        agent: agent.id,
        conversation: t.conversation,
        engines,
      });
    }
    this.o.events.bos(`in-${turn.n}`, "audio", "user.audio");
  }

  /**
   * Speech over a reply has lasted `interruption.min_ms` (the words are asked first CONFIRM_MS
   * before, so that heard again they can decide then): the words recognised so far decide
   * (voice.md §7), while the user may still be speaking. Words that are not fillers, and that the
   * recogniser is sure of (it hears words in half a hum: "mm-hmm" → "and in nature"), make it a
   * barge-in when the sound had ended when they were asked, or when they are heard again (their
   * first two words first, in the words so far) on at least CONFIRM_MS more audio, asked as soon as
   * there is that much: a hum's words change as it goes on
   * ("and then?" → "and in nature," → "and in the chimney."), a request's stay ("call my" → "call my
   * mother").
   * Otherwise they are judged again every RECHECK_MS while the sound goes on, and at its end the
   * sure words of the whole decide. The reply's audio is paused meanwhile.
   */
  private checkWords(turn: Turn): void {
    if (!turn.over || turn.ended || turn.checking || this.closed) return;
    // Judged again RECHECK_MS later, or at min_ms after the early first check.
    const again = (ms?: number) => {
      const wait = ms ?? Math.min(RECHECK_MS, Math.max(0, turn.onset + this.o.config.interruption.min_ms - this.o.clock.now()) || RECHECK_MS);
      turn.timers.push(this.o.clock.after(wait, () => this.guard(() => this.checkWords(turn))));
    };
    const lasted = turn.soundAt >= turn.onset + this.o.config.interruption.min_ms - SOUND_SLACK_MS;
    // Neither going on now nor lasting min_ms: the sound may have stopped (its end then decides) or paused between words (judged again).
    if (!lasted && this.o.clock.now() - turn.soundAt > SOUND_SLACK_MS) {
      again();
      return;
    }
    turn.checking = true;
    const asked = this.o.clock.now();
    const ended = asked - turn.soundAt >= ENDED_MS;
    // Sure words to hear again: the words so far, as they come (the lead is the evidence), else the sure words.
    const lead = turn.sureLead;
    turn.sureLead = undefined;
    const long = turn.soundAt - turn.onset >= LONG_SOUND_MS;
    turn.transcription.soFar(lead || long ? {} : { sure: true }).then(
      (text) =>
        this.guard(() => {
          turn.checking = false;
          if (!turn.over || turn.ended || this.closed) return;
          if (long && contentWords(text) >= this.o.config.interruption.min_words) {
            this.bargeIn(turn);
            return;
          }
          const said = leadingSaid(text);
          // Only a sound that lasted min_ms is a barge-in (§7), and so is every one decided here: words
          // are asked only while the sound goes on or once it lasted min_ms, heard again at min_ms or
          // later, and a sound that had ended when asked had lasted min_ms.
          if (lead) {
            if (lead.every((w, i) => said[i] === w)) this.bargeIn(turn);
            else again();
            return;
          }
          if (contentWords(text) < this.o.config.interruption.min_words) {
            again();
            return;
          }
          if (ended) {
            this.bargeIn(turn);
            return;
          }
          turn.sureLead = said.slice(0, 2);
          // Heard again on at least CONFIRM_MS more audio, as soon as there is that much.
          again(Math.max(0, asked + CONFIRM_MS - this.o.clock.now()));
        }),
      () => {
        turn.checking = false;
      },
    );
  }

  /** The speech over the reply is a turn: the reply ends as interrupted (keeping what was heard). */
  private bargeIn(turn: Turn): void {
    const over = turn.over;
    if (!over) return;
    turn.over = undefined;
    for (const stop of turn.timers.splice(0)) stop();
    over.reply.interrupt();
    turn.interrupted = over.remembered;
    if (this.speaking === over) this.speaking = undefined;
    this.begin(turn);
  }

  /** A false interruption: no turn, no event, the reply goes on from where it paused (if it did not already). */
  private resume(turn: Turn): void {
    const over = turn.over;
    if (!over) return;
    turn.over = undefined;
    for (const stop of turn.timers.splice(0)) stop();
    turn.abort.abort(new Error("a false interruption"));
    over.falseInterruptions++;
    this.o.metrics.falseInterruption();
    over.reply.resume();
  }

  /** Speech over a reply ended before it was a barge-in: long enough and with words, it is one; else the reply resumes. */
  private overEnded(turn: Turn, end: TurnEnd): void {
    const { min_ms, min_words, resume_ms } = this.o.config.interruption;
    if (end.lastVoiced - turn.onset < min_ms) {
      this.resume(turn);
      return;
    }
    // Without words so far, the reply's audio resumes by this time whatever the transcription
    // says; words found later (a recogniser behind) still make it a barge-in.
    const over = turn.over;
    if (over) turn.timers.push(this.o.clock.after(Math.max(0, end.lastVoiced + resume_ms - this.o.clock.now()), () => this.guard(() => over.reply.resume())));
    // The sure words of the whole sound decide (a hum's final transcript may be words too: "And the mature men."); the turn's transcript is the final one.
    turn.transcription.soFar({ sure: true }).then(
      (text) =>
        this.guard(() => {
          if (!turn.over || this.closed) return;
          if (contentWords(text) < min_words) {
            this.resume(turn);
            return;
          }
          const transcript = turn.transcription.finish();
          this.bargeIn(turn);
          this.o.events.eos(`in-${turn.n}`, "audio", "user.audio");
          void this.respond(turn, end, transcript).catch((err: unknown) => this.o.log("warn", { err, turn: turn.n }, "voice turn failed"));
        }),
      () => this.guard(() => this.resume(turn)),
    );
  }

  private guard(fn: () => void): void {
    try {
      fn();
    } catch (err) {
      this.o.log("warn", { err }, "voice turn handling failed");
    }
  }

  /** The turn's preemptive reply is not used: it ends, unseen, and is counted. */
  private drop(turn: Turn): void {
    const p = turn.prepared;
    if (!p) return;
    turn.prepared = undefined;
    p.reply.discard();
    this.prepared.delete(p.reply);
    this.o.metrics.preemptive("discarded");
  }

  /** Partial words: only those that extend what was sent (a revision is left to the final transcript). */
  private partial(turn: Turn, text: string): void {
    if (turn.ended || this.closed || turn.n === 0) return;
    if (text.length > turn.partialSent.length && text.startsWith(turn.partialSent)) {
      const fresh = text.slice(turn.partialSent.length);
      turn.partialSent = text;
      this.o.events.delta(`in-${turn.n}`, "user.transcript", fresh);
    }
  }

  private async respond(turn: Turn, end: TurnEnd, known?: Promise<string>): Promise<void> {
    const { n } = turn;
    const { clock } = this.o;
    const eou = end.decided - end.lastVoiced;
    const stages: Partial<Record<Stage, number>> = { end_of_speech: eou, end_of_utterance_delay: eou };
    const flags: TurnFlags = {
      interrupted: false,
      turn_cut: end.cut,
      reply_cut: false,
      preemptive: "off",
      false_interruptions: 0,
    };
    const engines: TurnEngines = { transcription: turn.agent.engines.transcription.engine, speech: turn.agent.engines.speech.engine };
    const trace = turn.trace;
    trace?.stage("voice.end_of_turn", end.lastVoiced, end.decided, { "perch.voice.turn_cut": end.cut });
    const done = (result: TurnResult, engines: TurnEngines, f: TurnFlags, error?: string) => {
      this.drop(turn);
      if (f.preemptive === "off" && turn.preempted > 0) f.preemptive = "discarded";
      this.finishTurn(n, result, stages, engines, f, trace, error);
    };
    this.transcribing = turn;
    let transcript: string;
    try {
      transcript = await (known ?? turn.transcription.finish());
    } catch (err) {
      if (this.closed) return;
      if (turn.abort.signal.aborted) return done("empty", engines, flags);
      this.o.events.eos(`out-${n}`, "text", "assistant.text", { code: failureCode(err), message: `recognition failed: ${(err as Error).message}` });
      return done("failed", engines, flags);
    } finally {
      if (this.transcribing === turn) this.transcribing = undefined;
    }
    // What was heard of the reply this turn interrupted goes into the history first.
    if (turn.interrupted) await turn.interrupted;
    await this.continued();
    const transcribed = clock.now();
    stages.transcription = transcribed - end.decided;
    trace?.stage("voice.transcription", end.decided, transcribed, { "perch.voice.engine": engines.transcription }, ["perch.voice.transcript", transcript]);
    // The turn's audio was transcribed, answered or not (usage.md §1).
    this.o.usage?.record(turn.agent.id, { audio_ms: Math.max(0, Math.round(end.decided - turn.onset)) });
    if (this.closed) return;
    this.o.events.done(`in-${n}`, "user.transcript", transcript);
    this.o.log("debug", { turn: n, transcript }, "voice turn transcript");
    const agent = this.o.agent();
    // A newer turn began while this one was transcribed: it answers instead.
    if (!transcript || !agent || this.turns !== n) return done("empty", engines, flags);
    // A usage limit reached: the turn is answered with the agent's limited reply, without a model call (usage.md §3).
    const usage = this.o.usage;
    let admission: Admission | undefined;
    let limited: string | undefined;
    if (usage) {
      const gate = await usage.admit(agent.id).catch((err: unknown) => {
        this.o.log("warn", { err }, "usage could not be checked; the turn goes on");
        return undefined;
      });
      if (gate && "limited" in gate) limited = gate.limited;
      else admission = gate?.admission;
      if (this.closed || this.turns !== n) {
        admission?.abandon();
        return done("empty", engines, flags);
      }
    }
    const prepared = turn.prepared;
    const usable =
      limited === undefined &&
      prepared !== undefined &&
      prepared.agentId === agent.id &&
      prepared.reply.answers(transcript) &&
      sameHistory(prepared.history, this.history);
    this.remember("user", transcript);
    const messages = [...this.history];
    engines.speech = agent.engines.speech.engine;
    let text: ReplyOptions["text"] = (signal) => this.o.run(agent.id, messages, signal, n, undefined, trace?.traced);
    let speech = usage ? countedSpeech(agent.engines.speech, (chars) => usage.record(agent.id, { speech_chars: chars })) : agent.engines.speech;
    if (limited !== undefined && usage) {
      this.drop(turn);
      const kept = usage.limitedReply(agent.id, agent.engines.speech);
      text = async () =>
        (async function* () {
          yield kept.text;
        })();
      speech = kept.speech;
    } else if (usable) {
      turn.prepared = undefined;
      this.prepared.delete(prepared.reply);
      text = prepared.reply.adopt();
      flags.preemptive = "used";
      this.o.metrics.preemptive("used");
    } else this.drop(turn);
    const reply = new Reply({
      n,
      voice: agent.voice,
      text,
      speech,
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
      ...(trace ? { trace } : {}),
    });
    let remembered = () => {};
    const speaking: Speaking = { n, reply, falseInterruptions: 0, remembered: new Promise<void>((resolve) => (remembered = resolve)) };
    this.speaking = speaking;
    let outcome: Awaited<Reply["outcome"]>;
    try {
      outcome = await reply.outcome;
      if (this.speaking === speaking) this.speaking = undefined;
      // Settled however the conversation goes on: a turn left in flight would hold the device's
      // next work near a limit for ever (the meter lets one piece start at a time there).
      if (outcome.result === "failed") admission?.abandon();
      else admission?.answered();
      if (this.closed) return;
      if (outcome.heard) this.remember("assistant", outcome.heard);
    } catch (err) {
      admission?.abandon();
      throw err;
    } finally {
      remembered();
    }
    const { at } = outcome;
    if (at.firstToken !== undefined) {
      stages.first_token = at.firstToken - transcribed;
      // The reply's first text: when the model gave it (a preemptive reply may have had it before the turn ended).
      const firstText = usable ? Math.min(prepared.reply.firstAt ?? at.firstToken, at.firstToken) : at.firstToken;
      stages.ttft = Math.max(0, firstText - end.decided);
    }
    if (at.firstSpeech !== undefined && at.firstSentence !== undefined) stages.ttfb = at.firstSpeech - at.firstSentence;
    if (at.firstAudio !== undefined) {
      if (at.firstSentence !== undefined) stages.first_audio = at.firstAudio - at.firstSentence;
      stages.speech_to_audio = at.firstAudio - end.lastVoiced;
    }
    if (outcome.error) this.o.log("warn", { turn: n, error: outcome.error }, "voice reply failed");
    if (at.firstAudio !== undefined) trace?.stage("voice.playout", at.firstAudio, clock.now(), { "perch.voice.interrupted": outcome.result === "interrupted" });
    done(
      limited !== undefined && outcome.result === "answered" ? "limited" : outcome.result,
      engines,
      {
        ...flags,
        interrupted: outcome.result === "interrupted",
        reply_cut: outcome.cut,
        false_interruptions: speaking.falseInterruptions,
        ...(limited !== undefined ? { limited } : {}),
      },
      outcome.error,
    );
  }

  /** The earlier turns this conversation continues (once, before its first words; never over a history of its own). */
  private async continued(): Promise<void> {
    const earlier = this.o.earlier;
    if (!earlier) return;
    this.o.earlier = undefined;
    const messages = await earlier.catch(() => []);
    if (this.history.length === 0) for (const m of messages.slice(-this.o.config.history_turns * 2)) this.history.push(m);
  }

  private remember(role: "user" | "assistant", content: string): void {
    this.history.push({ role, content });
    const max = this.o.config.history_turns * 2;
    if (this.history.length > max) this.history.splice(0, this.history.length - max);
  }

  private finishTurn(
    n: number,
    result: TurnResult,
    stages: Partial<Record<Stage, number>>,
    engines: TurnEngines,
    flags: TurnFlags,
    trace?: TurnTrace,
    error?: string,
  ): void {
    const metrics: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(stages)) metrics[k] = Math.round(v * 10) / 10;
    Object.assign(metrics, flags, { engines });
    this.o.events.done(`out-${n}`, "turn.metrics", JSON.stringify(metrics));
    this.o.metrics.turn(result, stages, engines);
    trace?.end(result, stages, error);
    this.o.log("info", { turn: n, result, ...metrics, ...(trace?.traceId ? { trace_id: trace.traceId } : {}) }, "voice turn");
  }
}

/** The history a preemptive reply was given is still the conversation's (same entries, same order). */
function sameHistory(a: ChatMessage[], b: ChatMessage[]): boolean {
  return a.length === b.length && a.every((m, i) => m === b[i]);
}

/** Which engines answered a turn (`turn.metrics.engines`). */
export interface TurnEngines {
  transcription: EngineId;
  speech: EngineId;
}

/** What else `turn.metrics` says of a turn. */
interface TurnFlags {
  interrupted: boolean;
  /** The reply prepared in the pause was used, or one was asked and discarded, or none was asked. */
  preemptive: "used" | "discarded" | "off";
  /** Speech over the reply that was no barge-in (the reply resumed). */
  false_interruptions: number;
  /** The user's turn reached `voice.turn.max_ms` and was cut there. */
  turn_cut: boolean;
  /** The reply reached `voice.max_reply_chars`: the rest was not spoken. */
  reply_cut: boolean;
  /** The counter whose usage limit refused the turn (it was answered with the agent's limited reply). */
  limited?: string;
}
