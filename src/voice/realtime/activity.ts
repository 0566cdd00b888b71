import type { SpeexModule } from "@echogarden/speex-resampler-wasm";
import type { ToolKit, ToolObserver } from "../../ai/agents/toolbox.ts";
import { Resampler } from "../../audio/resampler.ts";
import type { VoiceConfig } from "../../config/config.ts";
import { toolEnded } from "../../observability/gen-ai-spans.ts";
import type { Traced } from "../../observability/tracing.ts";
import { TurnTrace } from "../../observability/voice-spans.ts";
import type { ChatMessage } from "../../protocol/compat.ts";
import type { ActivityOptions } from "../activity.ts";
import type { VoiceClock } from "../clock.ts";
import { RECOGNITION_RATE, type TurnTranscription, type VoiceActivityPort } from "../engine-ports.ts";
import type { Stage, VoiceMetrics } from "../metrics.ts";
import type { FrameEncoder } from "../opus.ts";
import type { VoiceEvents } from "../peer-events.ts";
import { AudioRecognition, type ListeningTurn, type TurnEnd } from "../recognition.ts";
import { turnEndSilence } from "../turn-end.ts";
import type { RealtimeAgentInfo } from "./agents.ts";
import { errorOf, type RealtimeEventOf, type RealtimeEventType, type RealtimeServerEvent } from "./events.ts";
import { RealtimeLink } from "./link.ts";
import { RealtimeTools } from "./tools.ts";
import { RealtimeTurn, type TurnOutcome } from "./turn.ts";
import { historyItems, REALTIME_RATE, type RealtimeTool, sessionUpdate } from "./wire.ts";

/** Uplink audio goes to the model in appends of this much (voice.md §6: every 20–100 ms). */
const APPEND_SAMPLES = (REALTIME_RATE * 40) / 1000;
/** Input transcripts awaited at most for this many items (an item whose transcript never comes is forgotten). */
const MAX_ITEMS = 64;
/** A user's transcript (one turn, at most `voice.turn.max_ms` of speech) is kept and told up to this many characters. */
export const MAX_USER_TRANSCRIPT_CHARS = 8_192;
/** An error answering Perch's own cancel, truncate or delete, from a server that echoes no event id, by its code (voice.md §6). */
const HARMLESS_CODES: Record<string, readonly string[]> = {
  "response.cancel": ["response_cancel_not_active"],
  "conversation.item.truncate": ["item_not_found", "item_truncate_invalid_item_id", "unsupported_content_type"],
  "conversation.item.delete": ["item_not_found", "item_delete_invalid_item_id"],
};
/** An error event that fails no turn is said at `warn` at most this often. */
const ERROR_SAY_EVERY_MS = 60_000;
/** Such an error is taken as the answer to an own event sent at most this long before. */
const HARMLESS_WITHIN_MS = 10_000;
/** A session is renewed between turns this long before the provider's `expires_at` (at most half its life); a turn going on defers it. */
const RENEW_BEFORE_MS = 60_000;
const RENEW_RETRY_MS = 500;

export interface RealtimeActivityOptions {
  agent: RealtimeAgentInfo;
  config: VoiceConfig;
  events: VoiceEvents;
  /** The agent's tools for this device (device tools of this device only). */
  tools: ToolKit;
  /** A turn's `tool.call` / `tool.result` events. */
  toolEvents: (n: number) => ToolObserver;
  /** The node's voice activity, for `turn_detection: node`. */
  activity: VoiceActivityPort | undefined;
  /** The device's memory, given after the agent's instructions once read. */
  notes?: () => Promise<string | undefined>;
  resampler: SpeexModule;
  /** Encodes the replies' frames: the conversation's uplink (on its audio thread, or here). */
  encoder: FrameEncoder;
  metrics: VoiceMetrics;
  clock: VoiceClock;
  /** Sends one Opus frame of a reply. */
  send: (opus: Buffer, first: boolean) => boolean;
  log: (level: "info" | "warn" | "debug", details: Record<string, unknown>, message: string) => void;
  /** Counts the session's use (usage.md §1): audio both ways (24 kHz samples), the tokens reported, answered turns. */
  usage?: RealtimeCounts;
  /** The node's tracing (each turn a trace, with the session's events), and the conversation's id in it. */
  tracing?: ActivityOptions["tracing"];
}

export interface RealtimeCounts {
  audio(samples: number): void;
  tokens(input: number, output: number): void;
  answered(): void;
}

/** A turn being heard by the node's own voice activity (`turn_detection: node`); the model does the transcribing. */
interface NodeTurn extends ListeningTurn {
  n: number;
}

const NO_TRANSCRIPTION: TurnTranscription = { push() {}, pause() {}, soFar: () => Promise.resolve(""), finish: () => Promise.resolve("") };

/**
 * A realtime agent's part of a conversation (voice.md §6), the kind of agent activity whose model
 * hears and speaks itself: the device's audio (24 kHz, from the conversation's uplink) to the
 * model over one WebSocket, the model's server events (typed, ./events.ts) turned into the
 * conversation's turns and events, each reply a RealtimeTurn (its audio through a playout, cut and
 * truncated at what was heard) with its tools a RealtimeTools, and a session reopened with the
 * history after any failure. Nothing here ends the device's connection: a failure ends at most the
 * turn in progress.
 */
export class RealtimeActivity {
  /** The rate it hears the device at (the model's). */
  readonly rate = REALTIME_RATE;
  private readonly o: RealtimeActivityOptions;
  private readonly link: RealtimeLink;
  private readonly node: { recognition: AudioRecognition<NodeTurn>; down: Resampler } | undefined;
  private appendParts: Int16Array[] = [];
  private appendSamples = 0;
  private readonly history: Array<ChatMessage & { n: number }> = [];
  private turns = 0;
  /** The user's speech being heard (its turn number). */
  private listening: { n: number } | undefined;
  /** The last turn number a reply was made for. */
  private answered = 0;
  private reply: RealtimeTurn | undefined;
  /** Input items awaiting their transcript: the turn they belong to and the characters told so far. */
  private readonly itemTurns = new Map<string, { n: number; chars: number }>();
  /** Event ids of Perch's own cancels, truncates and deletes: an error answering one is expected. */
  private readonly ours = new Set<string>();
  /** When Perch last sent each kind of its own events (for errors from servers that echo no event id). */
  private readonly oursSentAt = new Map<string, number>();
  /** When an error event was last said at `warn`. */
  private errorSaidAt = Number.NEGATIVE_INFINITY;
  private eventIds = 0;
  private toolsSent = "";
  /** The traces of the turns under way, by number (when the node traces). */
  private readonly traces = new Map<number, TurnTrace | undefined>();
  private cancelRenew: (() => void) | undefined;
  private memory: string | undefined;
  private closed = false;

  constructor(o: RealtimeActivityOptions) {
    this.o = o;
    if (o.agent.turnDetection === "node") {
      if (!o.activity) throw new Error("turn_detection node needs the node's voice activity detection (the embedded recogniser)");
      this.node = { recognition: this.listen(o.activity), down: new Resampler(o.resampler, REALTIME_RATE, RECOGNITION_RATE) };
    }
    this.link = new RealtimeLink({
      url: o.agent.url,
      apiKey: o.agent.apiKey,
      timeoutMs: o.agent.timeoutMs,
      clock: o.clock,
      opening: (setupId) => {
        const recent = this.history.slice(-2 * o.config.history_turns).map(({ role, content }) => ({ role, content }) as ChatMessage);
        return [this.settingsEvent(setupId), ...historyItems(recent)];
      },
      event: (e) => {
        try {
          this.event(e);
        } catch (err) {
          o.log("warn", { err, event: e.type }, "a realtime event could not be handled");
        }
      },
      up: () => o.log("debug", { agent: o.agent.id }, "realtime session open"),
      down: (reason, retryInMs, repeated) => {
        // Said once per back-off step: a provider that drops every session does not fill the log.
        o.log(
          repeated ? "debug" : "warn",
          { agent: o.agent.id, provider: o.agent.provider, reason, retry_in_ms: retryInMs },
          "the realtime session failed; reconnecting",
        );
        this.sessionLost(reason);
      },
    });
    this.readNotes();
  }

  /** The user is heard speaking now (the model's detector or the node's said so, and not yet that it stopped). */
  get hearing(): boolean {
    return !this.closed && (this.listening !== undefined || this.node?.recognition.hearing === true);
  }

  /** The device's audio at 24 kHz: appended in pieces of APPEND_SAMPLES; dropped while no session is open. */
  hear(pcm: Int16Array): void {
    if (this.closed) return;
    if (this.node) this.node.recognition.hear(this.node.down.process(pcm));
    this.appendParts.push(pcm);
    this.appendSamples += pcm.length;
    if (this.appendSamples < APPEND_SAMPLES) return;
    const parts = this.appendParts;
    this.appendParts = [];
    this.appendSamples = 0;
    if (!this.link.isOpen) return;
    const bytes = Buffer.concat(parts.map((p) => Buffer.from(p.buffer, p.byteOffset, p.byteLength)));
    this.o.usage?.audio(bytes.length / 2);
    this.link.send({ type: "input_audio_buffer.append", audio: bytes.toString("base64") }, true);
  }

  /** Silence the uplink did not decode: the model hears it as zeros (its detector ends the turn on it). */
  silence(samples: number): void {
    if (samples > 0) this.hear(new Int16Array(samples));
  }

  /** Every 20 ms: the node's end of turn. */
  tick(): void {
    if (!this.closed) this.node?.recognition.tick();
  }

  /**
   * The audio thread of the uplink ended: the reply it was encoding fails (its frames in flight are
   * lost; the response is cancelled), and the node's turn being heard is heard afresh (the model's
   * own detector hears the gap as it is).
   */
  audioLost(err: Error): void {
    if (this.closed) return;
    const turn = this.reply;
    if (turn && !turn.ended) {
      turn.tools.abort.abort(err);
      if (turn.responseActive) this.sendOwn({ type: "response.cancel" });
      turn.responseActive = false;
      turn.cutItems(turn.stopAudio(), true);
      this.endTurn(turn, "failed", `the reply's audio failed: ${err.message}`);
    }
    if (!this.node || !this.o.activity) return;
    this.node.recognition.close();
    this.node.recognition = this.listen(this.o.activity);
  }

  close(): void {
    if (this.closed) return;
    if (this.reply && !this.reply.ended) this.endTurn(this.reply, "interrupted");
    this.closed = true;
    this.cancelRenew?.();
    this.link.close();
    this.node?.recognition.close();
    this.node?.down.close();
    this.history.length = 0;
  }

  /** The node's own turn detection (`turn_detection: node`): the model is asked when the node hears the turn end. */
  private listen(activity: VoiceActivityPort): AudioRecognition<NodeTurn> {
    const { o } = this;
    return new AudioRecognition<NodeTurn>({
      vad: activity.create({ minSpeechMs: o.config.turn.min_speech_ms, minSilenceMs: o.config.turn.silence_ms }),
      turn: o.config.turn,
      clock: o.clock,
      hooks: {
        speechStarted: () => this.nodeSpeechStarted(),
        // voice.md §7's end of turn; without words of the node's own (the model transcribes), its plain silence.
        silenceNeeded: (_t, text) => turnEndSilence(text, undefined, o.config.turn),
        paused: () => {},
        resumed: () => {},
        speechEnded: (t, end) => this.nodeSpeechEnded(t, end),
      },
      warn: (message, details) => o.log("warn", details, message),
    });
  }

  // ---- the session ----------------------------------------------------------------------------

  /** The memory, once read, joins the instructions of this session (sent again when it changed) and of every reopened one. */
  private readNotes(): void {
    this.o.notes?.().then(
      (notes) => {
        const memory = notes || undefined;
        if (this.closed || memory === this.memory) return;
        this.memory = memory;
        try {
          this.link.send(this.settingsEvent(this.nextId("memory")));
        } catch (err) {
          // A promise callback: a throw here would be unhandled (the next session sends the notes anyway).
          this.o.log("warn", { err }, "the realtime session's notes could not be sent");
        }
      },
      (err: unknown) => this.o.log("warn", { err }, "the device's memory could not be read for the realtime session"),
    );
  }

  private nextId(prefix: string): string {
    return `perch_${prefix}_${++this.eventIds}`;
  }

  /** Sends an event whose error answer is expected and harmless (a cancel, truncate or delete of Perch's own). */
  private sendOwn(event: Record<string, unknown>): void {
    const id = this.nextId(String(event.type).replace(/\W/g, "_"));
    this.ours.add(id);
    this.oursSentAt.set(String(event.type), this.o.clock.now());
    if (this.ours.size > MAX_ITEMS) this.ours.delete(this.ours.values().next().value!);
    this.link.send({ ...event, event_id: id });
  }

  private tools(): RealtimeTool[] {
    return this.o.tools
      .definitions()
      .map((d) => ({ type: "function", name: d.function.name, description: d.function.description, parameters: d.function.parameters }));
  }

  private settingsEvent(eventId: string): Record<string, unknown> {
    const { agent } = this.o;
    const tools = this.tools();
    this.toolsSent = JSON.stringify(tools);
    return sessionUpdate(
      {
        instructions: this.memory ? `${agent.instructions}\n\n${this.memory}`.trim() : agent.instructions,
        voice: agent.voice,
        turnDetection: agent.turnDetection,
        transcription: agent.transcription,
        bargeIn: this.o.config.barge_in,
        tools,
      },
      eventId,
    );
  }

  /** The device's tools may have changed since the session was set up: the model is told before it answers. */
  private refreshTools(): void {
    if (JSON.stringify(this.tools()) === this.toolsSent) return;
    this.link.send(this.settingsEvent(this.nextId("tools")));
  }

  // ---- the server's events, by type -------------------------------------------------------------

  /** Each server event Perch reads, by its type (./events.ts): the session's reaction. */
  private readonly on: { [T in RealtimeEventType]: (e: RealtimeEventOf<T>) => void } = {
    "session.created": (e) => {
      const expires = e.session?.expires_at;
      if (expires !== undefined) this.renewBefore(expires * 1000 - Date.now());
    },
    "input_audio_buffer.speech_started": (e) => {
      if (!this.node) this.speechStarted(e.item_id);
    },
    "input_audio_buffer.speech_stopped": () => {
      if (!this.node) this.speechStopped(this.o.clock.now());
    },
    "input_audio_buffer.committed": (e) => {
      if (e.item_id && this.node && !this.itemTurns.has(e.item_id)) this.rememberItem(e.item_id, this.answered || this.turns);
    },
    "conversation.item.input_audio_transcription.delta": (e) => this.userDelta(e.item_id, e.delta),
    "conversation.item.input_audio_transcription.completed": (e) => this.userDone(e.item_id, e.transcript),
    "conversation.item.input_audio_transcription.failed": (e) => {
      this.itemTurns.delete(e.item_id ?? "");
    },
    "response.created": (e) => this.responseCreated(e.response?.id ?? ""),
    "response.output_item.added": (e) => {
      const turn = this.current(e.response_id);
      if (turn && e.item?.id && e.item.type === "message") turn.item(e.item.id);
    },
    "response.output_audio.delta": (e) => {
      const turn = this.reply;
      if (turn && !turn.ended && e.response_id === turn.responseId) turn.audio(e.item_id ?? "", e.delta ?? "");
    },
    "response.output_audio_transcript.delta": (e) => {
      const turn = this.current(e.response_id);
      if (!turn || !e.delta) return;
      const told = turn.textDelta(e.item_id ?? "", e.delta);
      if (!told) return;
      if (!turn.textStarted) {
        turn.textStarted = true;
        this.o.events.bos(`out-${turn.n}`, "text", "assistant.text");
      }
      this.o.events.delta(`out-${turn.n}`, "assistant.text", told);
    },
    "response.output_audio_transcript.done": (e) => {
      const turn = this.current(e.response_id);
      if (turn && e.transcript !== undefined) turn.textDone(e.item_id ?? "", e.transcript);
    },
    "response.function_call_arguments.done": (e) => {
      const turn = this.current(e.response_id);
      // A call in the last step (no tools offered) or beyond a step's bound is not run, as for text agents.
      if (turn && !turn.cut && e.call_id && e.name && turn.steps < this.o.agent.maxSteps && turn.tools.room)
        turn.tools.call(e.call_id, e.name, e.arguments ?? "");
    },
    "response.done": (e) => this.responseDone(e.response),
    error: (e) => this.modelError(errorOf(e)),
  };

  private event(e: RealtimeServerEvent): void {
    if (this.closed) return;
    if (this.o.tracing) this.traceEvent(e);
    (this.on[e.type] as (e: RealtimeServerEvent) => void)(e);
  }

  /** The session's event on the trace of the turn it belongs to: the one heard, else the one answered (deltas: only a reply's first audio). */
  private traceEvent(e: RealtimeServerEvent): void {
    const reply = this.reply && !this.reply.ended ? this.reply : undefined;
    const n = e.type === "input_audio_buffer.speech_started" ? this.turns + 1 : (this.listening?.n ?? reply?.n);
    if (e.type.endsWith(".delta") && e.type !== "response.output_audio.delta") return;
    const trace = n === undefined ? undefined : (this.traces.get(n) ?? (e.type === "input_audio_buffer.speech_started" ? this.trace(n) : undefined));
    if (!trace || (e.type === "response.output_audio.delta" && !trace.first(e.type))) return;
    const ids = e as { response_id?: string; item_id?: string; response?: { id?: string; status?: string } };
    const attributes: Record<string, string> = {};
    const responseId = ids.response_id ?? ids.response?.id;
    if (responseId) attributes["perch.realtime.response_id"] = responseId;
    if (ids.item_id) attributes["perch.realtime.item_id"] = ids.item_id;
    if (ids.response?.status) attributes["perch.realtime.status"] = ids.response.status;
    trace.sessionEvent(e.type, this.o.clock.now(), attributes);
  }

  /** Turn `n`'s trace, begun now (its speech started). */
  private trace(n: number): TurnTrace | undefined {
    const t = this.o.tracing;
    if (!t) return undefined;
    // A turn whose trace is not kept (`tracing.sample_ratio`) is remembered as such: decided once.
    if (this.traces.has(n)) return this.traces.get(n);
    const now = this.o.clock.now();
    const trace = TurnTrace.start(t.tracing, {
      now,
      onset: now,
      n,
      agent: this.o.agent.id,
      conversation: t.conversation,
      engines: { realtime: this.o.agent.provider },
    });
    this.traces.set(n, trace);
    return trace;
  }

  /** A part of the user's transcript: told up to the bound, the rest dropped. */
  private userDelta(itemId: string | undefined, delta: string | undefined): void {
    const input = this.itemTurns.get(itemId ?? "");
    if (!input || !delta) return;
    const told = delta.slice(0, Math.max(0, MAX_USER_TRANSCRIPT_CHARS - input.chars));
    input.chars += told.length;
    if (told) this.o.events.delta(`in-${input.n}`, "user.transcript", told);
  }

  private userDone(itemId: string | undefined, transcript: string | undefined): void {
    const item = itemId ?? "";
    const n = this.itemTurns.get(item)?.n;
    if (!n) return;
    this.itemTurns.delete(item);
    const text = (transcript ?? "").slice(0, MAX_USER_TRANSCRIPT_CHARS).trim();
    this.o.events.done(`in-${n}`, "user.transcript", text);
    this.o.log("debug", { turn: n, transcript: text }, "voice turn transcript");
    if (text) this.remember(n, "user", text);
  }

  /** An `error` event: harmless when it answers Perch's own cancel or truncation, else it fails the turn in progress. */
  private modelError(err: { code: string; message: string; eventId: string | undefined }): void {
    if (this.answersOwn(err)) {
      this.o.log("debug", { code: err.code, message: err.message }, "the model refused a cancel or truncation of Perch's (harmless)");
      return;
    }
    // Recoverable (voice.md §6): the session stays open; only the turn in progress fails.
    const failed = this.failTurn(`the model reported an error: ${err.code}: ${err.message}`);
    // Said for each turn it fails, else at most once a minute: a provider's flood of errors is not the log's.
    const now = this.o.clock.now();
    const say = failed || now - this.errorSaidAt >= ERROR_SAY_EVERY_MS;
    if (say) this.errorSaidAt = now;
    this.o.log(
      say ? "warn" : "debug",
      { agent: this.o.agent.id, provider: this.o.agent.provider, code: err.code, reason: err.message },
      "the realtime model reported an error",
    );
  }

  /** The turn a response's events belong to; undefined for a stale (cancelled, cut) response. */
  private current(responseId: string | undefined): RealtimeTurn | undefined {
    const turn = this.reply;
    if (!turn || turn.ended) return undefined;
    if (responseId !== undefined && responseId !== turn.responseId) return undefined;
    return turn;
  }

  /** An `error` event that answers one of Perch's own cancels, truncates or deletes: by its event id, or by its code when none is echoed. */
  private answersOwn(err: { code: string; eventId: string | undefined }): boolean {
    if (err.eventId) return this.ours.has(err.eventId);
    for (const [type, codes] of Object.entries(HARMLESS_CODES)) {
      const at = this.oursSentAt.get(type);
      if (at !== undefined && this.o.clock.now() - at <= HARMLESS_WITHIN_MS && codes.includes(err.code)) return true;
    }
    return false;
  }

  /** The turn in progress (being answered, or still being heard) ends as failed; the session is kept. */
  private failTurn(reason: string): boolean {
    const turn = this.reply;
    if (turn && !turn.ended) {
      turn.tools.abort.abort(new Error("the model reported an error"));
      if (turn.responseActive) this.sendOwn({ type: "response.cancel" });
      turn.responseActive = false;
      turn.stopAudio();
      this.endTurn(turn, "failed", reason);
      return true;
    }
    const heard = this.listening;
    if (!heard) return false;
    this.listening = undefined;
    this.o.events.eos(`in-${heard.n}`, "audio", "user.audio");
    this.endTurn(this.newTurn(heard.n, undefined), "failed", reason);
    return true;
  }

  private rememberItem(item: string, n: number): void {
    this.itemTurns.set(item, { n, chars: 0 });
    if (this.itemTurns.size > MAX_ITEMS) this.itemTurns.delete(this.itemTurns.keys().next().value!);
  }

  /** The provider ends a session at its age: a new one is opened before, between turns, so that no turn is lost. */
  private renewBefore(remainingMs: number): void {
    this.cancelRenew?.();
    const at = Math.max(0, remainingMs - Math.min(RENEW_BEFORE_MS, remainingMs / 2));
    const attempt = () => {
      this.cancelRenew = undefined;
      if (this.closed) return;
      if (this.listening || (this.reply && !this.reply.ended)) {
        this.cancelRenew = this.o.clock.after(RENEW_RETRY_MS, attempt);
        return;
      }
      this.o.log("info", { agent: this.o.agent.id }, "the realtime session is near its age limit; a new one opens with the history");
      this.link.renew();
    };
    this.cancelRenew = this.o.clock.after(at, attempt);
  }

  // ---- the user's turns -----------------------------------------------------------------------

  private speechStarted(item: string | undefined): void {
    if (this.reply && !this.reply.ended && this.o.config.barge_in) this.bargeIn(this.reply);
    const n = ++this.turns;
    this.listening = { n };
    this.trace(n);
    if (item) this.rememberItem(item, n);
    this.o.events.bos(`in-${n}`, "audio", "user.audio");
    this.refreshTools();
    // A conversation that began after an idle end has the memory as it is then (the same one's is cached: no read).
    this.readNotes();
  }

  private speechStopped(at: number): void {
    const heard = this.listening;
    if (!heard) return;
    this.listening = undefined;
    this.o.events.eos(`in-${heard.n}`, "audio", "user.audio");
    this.await(this.newTurn(heard.n, at));
  }

  private nodeSpeechStarted(): NodeTurn | undefined {
    if (this.closed) return undefined;
    if (this.reply && !this.reply.ended) {
      if (!this.o.config.barge_in) return undefined;
      this.bargeIn(this.reply);
    }
    this.speechStarted(undefined);
    return { n: this.turns, transcription: NO_TRANSCRIPTION, soundAt: this.o.clock.now() };
  }

  private nodeSpeechEnded(t: NodeTurn, end: TurnEnd): void {
    if (this.closed || this.listening?.n !== t.n) return;
    // What is still held back for the next append belongs to this turn.
    this.flushAppend();
    this.link.send({ type: "input_audio_buffer.commit" });
    this.link.send({ type: "response.create" });
    this.answered = t.n;
    this.speechStopped(end.lastVoiced);
  }

  private flushAppend(): void {
    if (this.appendSamples === 0 || !this.link.isOpen) return;
    const parts = this.appendParts;
    this.appendParts = [];
    this.appendSamples = 0;
    const bytes = Buffer.concat(parts.map((p) => Buffer.from(p.buffer, p.byteOffset, p.byteLength)));
    this.o.usage?.audio(bytes.length / 2);
    this.link.send({ type: "input_audio_buffer.append", audio: bytes.toString("base64") });
  }

  // ---- the replies ------------------------------------------------------------------------------

  private newTurn(n: number, stoppedAt: number | undefined): RealtimeTurn {
    const { o } = this;
    const previous = this.reply;
    const turn = new RealtimeTurn({
      n,
      stoppedAt,
      // Barge-in off: the previous reply plays to its end before this one's audio starts.
      after: previous && !previous.ended ? previous.finished : undefined,
      tools: new RealtimeTools({ kit: o.tools, observer: tracedTools(o.toolEvents(n), this.trace(n)), timeoutMs: o.agent.toolTimeoutMs, clock: o.clock }),
      maxReplyChars: o.config.max_reply_chars,
      clock: o.clock,
      resampler: o.resampler,
      encoder: o.encoder,
      send: o.send,
      metrics: o.metrics,
      events: o.events,
      ...(o.usage ? { audio: (samples: number) => o.usage!.audio(samples) } : {}),
      sendOwn: (event) => this.sendOwn(event),
      end: (t, result, error) => this.endTurn(t, result, error),
      warn: (details, message) => o.log("warn", details, message),
    });
    this.answered = Math.max(this.answered, n);
    this.reply = turn;
    return turn;
  }

  /** `response.created` is awaited for at most the provider's `timeout_ms`; then the turn fails and the session is reopened. */
  private await(turn: RealtimeTurn): void {
    turn.cancelWait?.();
    const ms = this.o.agent.timeoutMs;
    turn.cancelWait = this.o.clock.after(ms, () => {
      turn.cancelWait = undefined;
      if (turn.ended || this.closed) return;
      try {
        this.link.fail(`the model did not start its response within ${ms} ms`);
      } catch (err) {
        this.o.log("warn", { err }, "realtime response timeout handling failed");
      }
    });
  }

  private responseCreated(id: string): void {
    let turn = this.reply;
    if (!turn || turn.ended) {
      // A response nobody's speech asked for (or its speech_stopped was missed): a turn of its own.
      const n = this.listening && this.listening.n > this.answered ? this.listening.n : ++this.turns;
      turn = this.newTurn(n, undefined);
    }
    turn.responseCreated(id, this.o.clock.now());
  }

  private responseDone(response: RealtimeEventOf<"response.done">["response"]): void {
    const turn = this.reply;
    const used = response?.usage;
    if (used) this.o.usage?.tokens(positive(used.input_tokens), positive(used.output_tokens));
    if (!turn || turn.ended || response?.id !== turn.responseId) return;
    turn.responseActive = false;
    const status = response?.status;
    if (status === "cancelled" && !turn.cut) {
      // The provider cancelled it (its own detector heard speech, with barge-in Perch's to decide): the reply ends here.
      turn.cutItems(turn.stopAudio(), true);
      this.endTurn(turn, "interrupted");
      return;
    }
    if (status === "failed") {
      const error = response?.status_details?.error;
      this.link.fail(`the model's response failed: ${error?.message ?? error?.code ?? "no reason given"}`);
      return;
    }
    const calls = turn.tools.take();
    if (calls.length > 0 && !turn.cut) {
      void this.answerCalls(turn, calls);
      return;
    }
    turn.complete();
  }

  /** The calls' outputs, then `response.create`: the model answers with them. */
  private async answerCalls(turn: RealtimeTurn, calls: ReturnType<RealtimeTools["take"]>): Promise<void> {
    const outputs = await turn.tools.outputs(calls);
    if (turn.ended || this.closed || turn.tools.aborted) return;
    for (const output of outputs) this.link.send(output);
    // The last step offers no tools, so that the model has to answer.
    turn.steps++;
    this.link.send({ type: "response.create", ...(turn.steps >= this.o.agent.maxSteps ? { response: { tool_choice: "none" } } : {}) });
    this.await(turn);
  }

  /** Speech over the reply: its audio stops now, the response is cancelled, the model's items cut at what was heard. */
  private bargeIn(turn: RealtimeTurn): void {
    turn.tools.abort.abort(new Error("interrupted"));
    const played = turn.stopAudio();
    if (turn.responseActive) this.sendOwn({ type: "response.cancel" });
    turn.responseActive = false;
    turn.cutItems(played, true);
    this.endTurn(turn, "interrupted");
  }

  /** The session failed: the turn in progress (heard or being answered) ends as failed; the link reopens by itself. */
  private sessionLost(reason: string): void {
    if (this.closed) return;
    this.cancelRenew?.();
    this.cancelRenew = undefined;
    const heard = this.listening;
    this.listening = undefined;
    const turn = this.reply;
    if (turn && !turn.ended) {
      turn.tools.abort.abort(new Error("the session failed"));
      turn.stopAudio();
      this.endTurn(turn, "failed", reason);
    }
    if (heard) {
      this.o.events.eos(`in-${heard.n}`, "audio", "user.audio");
      this.endTurn(this.newTurn(heard.n, undefined), "failed", reason);
    }
    this.itemTurns.clear();
  }

  /** A turn is over: its events, its line, its metrics and what was heard of it in the history. */
  private endTurn(turn: RealtimeTurn, result: TurnOutcome, error?: string): void {
    if (turn.ended) return;
    if (result !== "failed") this.o.usage?.answered();
    const heard = turn.close(result);
    const out = `out-${turn.n}`;
    const { events } = this.o;
    if (turn.textStarted) events.done(out, "assistant.text", heard);
    if (result === "failed" && (!turn.textStarted || !turn.audioStarted))
      events.eos(out, "text", "assistant.text", { code: "failed", message: error ?? "failed" });
    if (turn.audioStarted)
      events.eos(
        out,
        "audio",
        "assistant.audio",
        result === "interrupted" ? { code: "interrupted" } : result === "failed" ? { code: "failed", message: error ?? "failed" } : undefined,
      );
    if (heard) this.remember(turn.n, "assistant", heard);
    const stages: Partial<Record<Stage, number>> = {};
    if (turn.firstAudioAt !== undefined) {
      if (turn.stoppedAt !== undefined) stages.speech_to_audio = turn.firstAudioAt - turn.stoppedAt;
      if (turn.createdAt !== undefined) stages.first_audio = turn.firstAudioAt - turn.createdAt;
    }
    const metrics: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(stages)) metrics[k] = Math.round(v * 10) / 10;
    Object.assign(metrics, { interrupted: result === "interrupted", reply_cut: turn.cut, engines: { realtime: this.o.agent.provider } });
    events.done(out, "turn.metrics", JSON.stringify(metrics));
    this.o.metrics.turn(result, stages, { transcription: this.o.agent.provider, speech: this.o.agent.provider });
    const trace = this.traces.get(turn.n);
    this.traces.delete(turn.n);
    if (trace && turn.firstAudioAt !== undefined)
      trace.stage("voice.playout", turn.firstAudioAt, this.o.clock.now(), { "perch.voice.interrupted": result === "interrupted" });
    trace?.end(result, stages, error);
    this.o.log(
      result === "failed" ? "warn" : "info",
      { turn: turn.n, result, ...metrics, ...(error ? { error } : {}), ...(trace?.traceId ? { trace_id: trace.traceId } : {}) },
      "voice turn",
    );
    // A session that answered a turn works: the next failure reconnects at once again.
    if (result === "answered" && turn.audioStarted) this.link.proven();
  }

  /** The history of what was said and heard, for a reopened session: in turn order, bounded. */
  private remember(n: number, role: "user" | "assistant", content: string): void {
    // A user's transcript may complete after its reply began: it goes before that reply.
    let at = this.history.length;
    while (at > 0 && (this.history[at - 1]!.n > n || (role === "user" && this.history[at - 1]!.n === n && this.history[at - 1]!.role === "assistant"))) at--;
    this.history.splice(at, 0, { n, role, content });
    const max = this.o.config.history_turns * 2;
    if (this.history.length > max) this.history.splice(0, this.history.length - max);
  }
}

/** A turn's tool observer that also traces each call (a span from its call to its result). */
function tracedTools(observer: ToolObserver, trace: TurnTrace | undefined): ToolObserver {
  if (!trace) return observer;
  const open = new Map<string, Traced[]>();
  return {
    ...(observer.ready ? { ready: () => observer.ready!() } : {}),
    called(name, args) {
      const list = open.get(name) ?? [];
      list.push(trace.tool(name, args));
      open.set(name, list);
      observer.called(name, args);
    },
    finished(name, outcome) {
      const span = open.get(name)?.shift();
      if (span) toolEnded(span, outcome.result, outcome.isError);
      observer.finished(name, outcome);
    },
  };
}

/** A count the provider reported (none, or not positive, is 0). */
function positive(v: number | undefined): number {
  return v !== undefined && v > 0 ? v : 0;
}
