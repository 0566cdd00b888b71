import type { SpeexModule } from "@echogarden/speex-resampler-wasm";
import { MAX_TOOL_CALLS_PER_STEP } from "../../ai/agents/tool-calls.ts";
import type { ToolKit, ToolObserver } from "../../ai/agents/toolbox.ts";
import { toolMessageText } from "../../ai/agents/toolbox.ts";
import { Resampler } from "../../audio/resampler.ts";
import type { VoiceConfig } from "../../config/config.ts";
import { failed, type ToolOutcome } from "../../mcp/results.ts";
import type { ChatMessage } from "../../protocol/compat.ts";
import type { VoiceClock } from "../clock.ts";
import { RECOGNITION_RATE, type TurnTranscription, type VoiceActivityPort } from "../engine-ports.ts";
import type { Stage, TurnResult, VoiceMetrics } from "../metrics.ts";
import { OPUS_RATE, OpusCodec } from "../opus.ts";
import type { VoiceEvents } from "../peer-events.ts";
import { Playout } from "../playout.ts";
import { AudioRecognition, type ListeningTurn, type TurnEnd } from "../recognition.ts";
import { SpokenText } from "../spoken.ts";
import { turnEndSilence } from "../turn-end.ts";
import { turnHangoverMs, Uplink } from "../uplink.ts";
import { AudioQueue } from "./audio-queue.ts";
import { errorOf, type RealtimeEventOf, type RealtimeEventType, type RealtimeServerEvent } from "./events.ts";
import { RealtimeLink } from "./link.ts";
import { historyItems, REALTIME_RATE, type RealtimeTool, type SessionSettings, sessionUpdate } from "./wire.ts";

/** Uplink audio goes to the model in appends of this much (voice.md §6: every 20–100 ms). */
const APPEND_SAMPLES = (REALTIME_RATE * 40) / 1000;
/** Audio the model sent ahead of playback waits here, at most this long (voice.md §6); beyond, the reply is cut. */
export const MAX_BUFFER_S = 60;
const MAX_BUFFER_BYTES = MAX_BUFFER_S * REALTIME_RATE * 2;
/** The reply's audio is resampled and handed to the playout only this far ahead of what it has sent (48 kHz samples). */
const PLAYOUT_AHEAD = (OPUS_RATE * 200) / 1000;
/** A tool gets this much beyond the agent's `tool_timeout_ms` before it is answered as failed whatever it does. */
const TOOL_GRACE_MS = 1_000;
/** Input transcripts awaited at most for this many items (an item whose transcript never comes is forgotten). */
const MAX_ITEMS = 64;
/** Output items one turn keeps (a reply is one or two): audio or text of further new item ids is ignored. */
export const MAX_REPLY_ITEMS = 16;
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

export interface RealtimeAgentInfo {
  id: string;
  instructions: string;
  voice: string;
  turnDetection: SessionSettings["turnDetection"];
  transcription: string | false;
  toolTimeoutMs: number;
  /** Model calls (responses) of one turn at most, as for text agents: the last one offers no tools. */
  maxSteps: number;
  /** The provider's id (`turn.metrics.engines.realtime`), WebSocket URL, key and `timeout_ms`. */
  provider: string;
  url: string;
  apiKey: string | undefined;
  timeoutMs: number;
}

export interface RealtimeOptions {
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
  payloadType: number;
  /** The audio level's header extension id, when negotiated (RFC 6464). */
  audioLevelId?: number | undefined;
  metrics: VoiceMetrics;
  clock: VoiceClock;
  /** Sends one Opus frame of a reply. */
  send: (opus: Buffer, first: boolean) => boolean;
  log: (level: "info" | "warn" | "debug", details: Record<string, unknown>, message: string) => void;
  /** Counts the session's use (usage.md §1): audio both ways (24 kHz samples), the tokens reported, answered turns. */
  usage?: RealtimeCounts;
}

export interface RealtimeCounts {
  audio(samples: number): void;
  tokens(input: number, output: number): void;
  answered(): void;
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

/** A turn's reply: from the end of the user's speech to the last of its audio sent. */
interface ReplyTurn {
  n: number;
  /** Clock time the user's speech ended (undefined: a reply nobody asked for). */
  stoppedAt: number | undefined;
  createdAt?: number;
  firstAudioAt?: number;
  /** The response whose events belong to this turn, while it is active. */
  responseId?: string;
  responseActive: boolean;
  /** `response.created` is awaited until this cancels it. */
  cancelWait?: () => void;
  /** The turn's output items by id, at most MAX_REPLY_ITEMS, in the order they came. */
  items: Map<string, AudioItem>;
  /** Characters of the reply's text kept (all its items): at most `voice.max_reply_chars`. */
  chars: number;
  pending: AudioQueue<AudioItem>;
  /** The last response is done: once `pending` is empty, the audio ends. */
  audioComplete: boolean;
  playout?: Playout;
  up?: Resampler;
  wake?: () => void;
  pumping: boolean;
  textStarted: boolean;
  audioStarted: boolean;
  cut: boolean;
  ended: boolean;
  /** The model call (response) of this turn under way, from 1: tools are offered while it is below `maxSteps`. */
  steps: number;
  /** Tool calls of the current response. */
  calls: Array<{ callId: string; name: string; outcome: Promise<ToolOutcome> }>;
  tools: AbortController;
  /** Resolves once the turn has ended (a next reply's audio waits for it when barge-in is off). */
  finished: Promise<void>;
  finish: () => void;
  /** The previous reply's end, when this one must wait for it. */
  after?: Promise<void>;
}

/** A turn being heard by the node's own voice activity (`turn_detection: node`); the model does the transcribing. */
interface NodeTurn extends ListeningTurn {
  n: number;
}

const NO_TRANSCRIPTION: TurnTranscription = { push() {}, pause() {}, soFar: () => Promise.resolve(""), finish: () => Promise.resolve("") };

/**
 * One device's conversation with a realtime model (voice.md §6): the device's audio at 24 kHz to
 * the model over one WebSocket, the model's audio paced to the device, its events turned into the
 * conversation's events, barge-in with truncation at what was heard, tools through the agent's
 * toolbox, and a session reopened with the history after any failure. Nothing here ends the
 * device's connection: a failure ends at most the turn in progress.
 */
export class RealtimeBridge {
  private readonly o: RealtimeOptions;
  private readonly link: RealtimeLink;
  /** The uplink decodes straight to the model's rate. */
  private readonly codec = new OpusCodec(REALTIME_RATE);
  private readonly uplink: Uplink;
  private readonly node: { recognition: AudioRecognition<NodeTurn>; down: Resampler } | undefined;
  private appendParts: Int16Array[] = [];
  private appendSamples = 0;
  private readonly history: Array<ChatMessage & { n: number }> = [];
  private turns = 0;
  /** The user's speech being heard (its turn number and input item). */
  private listening: { n: number } | undefined;
  /** The last turn number a reply was made for. */
  private answered = 0;
  private reply: ReplyTurn | undefined;
  /** Input items awaiting their transcript: the turn they belong to and the characters told so far. */
  private readonly itemTurns = new Map<string, { n: number; chars: number }>();
  /** Event ids of Perch's own cancels, truncates and deletes: an error answering one is expected. */
  private readonly ours = new Set<string>();
  /** When Perch last sent each kind of its own events (for errors from servers that echo no event id). */
  private readonly oursSentAt = new Map<string, number>();
  /** When an error event was last said at `warn`. */
  private errorSaidAt = Number.NEGATIVE_INFINITY;
  /** Output items beyond MAX_REPLY_ITEMS were ignored in this turn (said once a turn). */
  private itemsWarned = 0;
  private eventIds = 0;
  private toolsSent = "";
  private cancelRenew: (() => void) | undefined;
  private memory: string | undefined;
  private closed = false;

  constructor(o: RealtimeOptions) {
    this.o = o;
    this.uplink = new Uplink({
      codec: this.codec,
      payloadType: o.payloadType,
      audioLevelId: o.audioLevelId,
      // The model's own detector (or the node's) ends the turn on the silence after speech: it must not wait in the look-back.
      hangoverMs: turnHangoverMs(o.config.turn),
      pcm: (pcm) => this.hear(pcm),
      now: () => o.clock.now(),
    });
    if (o.agent.turnDetection === "node") {
      if (!o.activity) throw new Error("turn_detection node needs the node's voice activity detection (the embedded recogniser)");
      const down = new Resampler(o.resampler, REALTIME_RATE, RECOGNITION_RATE);
      const recognition = new AudioRecognition<NodeTurn>({
        vad: o.activity.create({ minSpeechMs: o.config.turn.min_speech_ms, minSilenceMs: o.config.turn.silence_ms }),
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
      this.node = { recognition, down };
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

  /** One RTP packet of the device's uplink. */
  packet(bytes: Buffer): void {
    if (!this.closed) this.uplink.packet(bytes);
  }

  /** Every 20 ms: the jitter buffer, the node's end of turn. */
  tick(): void {
    if (this.closed) return;
    this.uplink.tick();
    this.node?.recognition.tick();
  }

  close(): void {
    if (this.closed) return;
    if (this.reply && !this.reply.ended) this.endTurn(this.reply, "interrupted");
    this.closed = true;
    this.cancelRenew?.();
    this.link.close();
    this.node?.recognition.close();
    this.node?.down.close();
    this.codec.close();
    this.history.length = 0;
  }

  /** The device's audio at 24 kHz: appended in pieces of APPEND_SAMPLES; dropped while no session is open. */
  private hear(pcm: Int16Array): void {
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

  /** Each server event Perch reads, by its type: the session's reactions, one line each where it can. */
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
      if (turn && e.item?.id && e.item.type === "message") this.item(turn, e.item.id);
    },
    "response.output_audio.delta": (e) => this.audio(e.response_id, e.item_id ?? "", e.delta ?? ""),
    "response.output_audio_transcript.delta": (e) => this.replyDelta(e),
    "response.output_audio_transcript.done": (e) => this.replyDone(e),
    "response.function_call_arguments.done": (e) => {
      const turn = this.current(e.response_id);
      // A call in the last step (no tools offered) or beyond a step's bound is not run, as for text agents.
      if (turn && !turn.cut && e.call_id && e.name && turn.steps < this.o.agent.maxSteps && turn.calls.length < MAX_TOOL_CALLS_PER_STEP) {
        this.callTool(turn, e.call_id, e.name, e.arguments ?? "");
      }
    },
    "response.done": (e) => this.responseDone(e.response),
    error: (e) => this.modelError(errorOf(e)),
  };

  private event(e: RealtimeServerEvent): void {
    if (this.closed) return;
    (this.on[e.type] as (e: RealtimeServerEvent) => void)(e);
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

  private replyDelta(e: RealtimeEventOf<"response.output_audio_transcript.delta">): void {
    const turn = this.current(e.response_id);
    const delta = e.delta;
    if (!turn || !delta) return;
    const item = this.item(turn, e.item_id ?? "");
    if (!item) return;
    // The reply's text is kept up to `voice.max_reply_chars` (the model's whole reply: all its items); beyond, the reply is cut.
    const kept = delta.slice(0, Math.max(0, this.o.config.max_reply_chars - turn.chars));
    item.text += kept;
    turn.chars += kept.length;
    const wasCut = turn.cut;
    if (kept.length < delta.length) this.cutReply(turn);
    // Past a cut the words are kept (what share was heard is counted on them) but not told.
    if (wasCut || !kept) return;
    if (!turn.textStarted) {
      turn.textStarted = true;
      this.o.events.bos(`out-${turn.n}`, "text", "assistant.text");
    }
    this.o.events.delta(`out-${turn.n}`, "assistant.text", kept);
  }

  private replyDone(e: RealtimeEventOf<"response.output_audio_transcript.done">): void {
    const turn = this.current(e.response_id);
    const transcript = e.transcript;
    if (!turn || transcript === undefined) return;
    const item = this.item(turn, e.item_id ?? "");
    if (!item) return;
    const room = this.o.config.max_reply_chars - (turn.chars - item.text.length);
    const text = transcript.slice(0, Math.max(0, room));
    turn.chars += text.length - item.text.length;
    item.text = text;
    if (text.length < transcript.length) this.cutReply(turn);
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
  private current(responseId: string | undefined): ReplyTurn | undefined {
    const turn = this.reply;
    if (!turn || turn.ended) return undefined;
    if (responseId !== undefined && responseId !== turn.responseId) return undefined;
    return turn;
  }

  /** The turn's item of this id, made on first sight; undefined beyond MAX_REPLY_ITEMS (its audio and text are ignored). */
  private item(turn: ReplyTurn, id: string): AudioItem | undefined {
    let item = turn.items.get(id);
    if (!item) {
      if (turn.items.size >= MAX_REPLY_ITEMS) {
        if (this.itemsWarned !== turn.n) {
          this.itemsWarned = turn.n;
          this.o.log("warn", { turn: turn.n, max: MAX_REPLY_ITEMS }, "the realtime model sent more output items than a reply keeps; the rest are ignored");
        }
        return undefined;
      }
      item = { id, text: "", received: 0, start: 0, written: 0 };
      turn.items.set(id, item);
    }
    return item;
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
      turn.tools.abort(new Error("the model reported an error"));
      if (turn.responseActive) this.sendOwn({ type: "response.cancel" });
      turn.responseActive = false;
      turn.playout?.stop();
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

  private newTurn(n: number, stoppedAt: number | undefined): ReplyTurn {
    let finish!: () => void;
    const finished = new Promise<void>((resolve) => {
      finish = resolve;
    });
    const previous = this.reply;
    const turn: ReplyTurn = {
      n,
      stoppedAt,
      responseActive: false,
      items: new Map(),
      chars: 0,
      pending: new AudioQueue<AudioItem>(),
      audioComplete: false,
      pumping: false,
      textStarted: false,
      audioStarted: false,
      cut: false,
      ended: false,
      steps: 1,
      calls: [],
      tools: new AbortController(),
      finished,
      finish,
      // Barge-in off: the previous reply plays to its end before this one's audio starts.
      ...(previous && !previous.ended ? { after: previous.finished } : {}),
    };
    this.answered = Math.max(this.answered, n);
    this.reply = turn;
    return turn;
  }

  /** `response.created` is awaited for at most the provider's `timeout_ms`; then the turn fails and the session is reopened. */
  private await(turn: ReplyTurn): void {
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

  // ---- the model's replies --------------------------------------------------------------------

  private responseCreated(id: string): void {
    let turn = this.reply;
    if (!turn || turn.ended) {
      // A response nobody's speech asked for (or its speech_stopped was missed): a turn of its own.
      const n = this.listening && this.listening.n > this.answered ? this.listening.n : ++this.turns;
      turn = this.newTurn(n, undefined);
    }
    turn.cancelWait?.();
    turn.cancelWait = undefined;
    turn.responseId = id;
    turn.responseActive = true;
    turn.audioComplete = false;
    turn.createdAt ??= this.o.clock.now();
  }

  private audio(responseId: string | undefined, itemId: string, delta: string): void {
    const turn = this.reply;
    if (!turn || turn.ended || responseId !== turn.responseId) return;
    const item = this.item(turn, itemId);
    if (!item) return;
    if (turn.cut) {
      // Counted, not decoded: a model that keeps sending past the cut costs little.
      item.received += Math.floor(base64Bytes(delta) / 2);
      this.o.usage?.audio(Math.floor(base64Bytes(delta) / 2));
      return;
    }
    let bytes = Buffer.from(delta, "base64");
    if (bytes.length % 2) bytes = bytes.subarray(0, bytes.length - 1);
    if (bytes.length === 0) return;
    item.received += bytes.length / 2;
    this.o.usage?.audio(bytes.length / 2);
    if (turn.pending.bytes + bytes.length > MAX_BUFFER_BYTES) {
      // The model speaks faster than the device plays beyond the buffer: the reply is cut here.
      this.cutReply(turn);
      return;
    }
    turn.pending.push(item, bytes);
    if (!turn.pumping) void this.pump(turn);
    else this.wake(turn);
  }

  /** The reply goes no further (its audio beyond the buffer, or its text beyond `max_reply_chars`): the response is cancelled, what waits is played. */
  private cutReply(turn: ReplyTurn): void {
    if (turn.cut) return;
    turn.cut = true;
    if (turn.responseActive) this.sendOwn({ type: "response.cancel" });
    turn.audioComplete = true;
    this.wake(turn);
    // Nothing of it is playing (its text came ahead of its audio): it ends now, whatever the model still sends.
    if (!turn.pumping && !turn.playout && !turn.ended) this.endTurn(turn, "answered");
  }

  private wake(turn: ReplyTurn): void {
    const w = turn.wake;
    turn.wake = undefined;
    w?.();
  }

  /** Feeds the turn's audio to its playout as playback makes room, resampled to 48 kHz. */
  private async pump(turn: ReplyTurn): Promise<void> {
    turn.pumping = true;
    try {
      if (turn.after) await turn.after;
      if (turn.ended) return;
      turn.up = new Resampler(this.o.resampler, REALTIME_RATE, OPUS_RATE);
      const playout = new Playout({
        codec: this.codec,
        clock: this.o.clock,
        send: (opus, first) => {
          this.o.metrics.frameSent();
          return this.o.send(opus, first);
        },
        late: () => this.o.metrics.frameLate(),
        // Only the model's audio is sent: a truncation at what was sent is then exact.
        fillGaps: false,
        started: () => {
          turn.audioStarted = true;
          turn.firstAudioAt = this.o.clock.now();
          this.o.events.bos(`out-${turn.n}`, "audio", "assistant.audio", "audio/opus");
        },
      });
      turn.playout = playout;
      let written = 0;
      for (;;) {
        if (turn.ended) return;
        const block = turn.pending.shift();
        if (!block) {
          if (turn.audioComplete) break;
          await new Promise<void>((resolve) => {
            turn.wake = resolve;
          });
          continue;
        }
        const chunk = block.bytes;
        const pcm =
          chunk.byteOffset % 2 === 0 ? new Int16Array(chunk.buffer, chunk.byteOffset, chunk.length / 2) : new Int16Array(new Uint8Array(chunk).buffer);
        const out = turn.up.process(pcm);
        const item = block.tag;
        if (item.written === 0) item.start = written;
        item.written += out.length;
        written += out.length;
        playout.write(out);
        await playout.room(PLAYOUT_AHEAD);
      }
      // The resampler's tail, and a breath of silence after the reply.
      playout.write(turn.up.process(new Int16Array(REALTIME_RATE / 10)));
      playout.end();
      await playout.done;
      if (turn.ended) return;
      // A cut reply: the model's items end where the device's audio did.
      if (turn.cut) this.cutItems(turn, playout.played, false);
      this.endTurn(turn, "answered");
    } catch (err) {
      if (!turn.ended) this.endTurn(turn, "failed", `the reply's audio failed: ${(err as Error).message}`);
    } finally {
      turn.pumping = false;
    }
  }

  private responseDone(response: RealtimeEventOf<"response.done">["response"]): void {
    const turn = this.reply;
    const id = response?.id;
    const used = response?.usage;
    if (used) this.o.usage?.tokens(num(used.input_tokens), num(used.output_tokens));
    if (!turn || turn.ended || id !== turn.responseId) return;
    turn.responseActive = false;
    const status = response?.status;
    if (status === "cancelled" && !turn.cut) {
      // The provider cancelled it (its own detector heard speech, with barge-in Perch's to decide): the reply ends here.
      turn.playout?.stop();
      this.cutItems(turn, turn.playout?.played ?? 0, true);
      this.endTurn(turn, "interrupted");
      return;
    }
    if (status === "failed") {
      const error = response?.status_details?.error;
      this.link.fail(`the model's response failed: ${error?.message ?? error?.code ?? "no reason given"}`);
      return;
    }
    const calls = turn.calls;
    turn.calls = [];
    if (calls.length > 0 && !turn.cut) {
      void this.answerCalls(turn, calls);
      return;
    }
    turn.audioComplete = true;
    if (turn.pumping) this.wake(turn);
    else if (!turn.playout) this.endTurn(turn, "answered");
  }

  // ---- tools ----------------------------------------------------------------------------------

  private callTool(turn: ReplyTurn, callId: string, name: string, args: string): void {
    const observer = this.o.toolEvents(turn.n);
    const shown = this.o.tools.displayName(name);
    observer.called(shown, args);
    const limit = this.o.agent.toolTimeoutMs + TOOL_GRACE_MS;
    const outcome = new Promise<ToolOutcome>((resolve) => {
      // A tool that never answers still gets an answer: the model is not left waiting.
      const cancel = this.o.clock.after(limit, () => resolve(failed(`the tool did not answer within ${limit} ms`, "timeout")));
      this.o.tools
        .run({ id: callId, type: "function", function: { name, arguments: args } }, turn.tools.signal)
        .then(resolve, (err: unknown) => resolve(failed(`the tool failed: ${(err as Error)?.message ?? String(err)}`)))
        .finally(cancel);
    }).then((o) => {
      if (!turn.tools.signal.aborted) observer.finished(shown, o);
      return o;
    });
    turn.calls.push({ callId, name, outcome });
  }

  /** The calls' outputs, then `response.create`: the model answers with them. */
  private async answerCalls(turn: ReplyTurn, calls: ReplyTurn["calls"]): Promise<void> {
    const outcomes = await Promise.all(calls.map((c) => c.outcome));
    if (turn.ended || this.closed || turn.tools.signal.aborted) return;
    calls.forEach((c, i) => {
      this.link.send({
        type: "conversation.item.create",
        item: { type: "function_call_output", call_id: c.callId, output: toolMessageText(outcomes[i]!, false) },
      });
    });
    // The last step offers no tools, so that the model has to answer.
    turn.steps++;
    this.link.send({ type: "response.create", ...(turn.steps >= this.o.agent.maxSteps ? { response: { tool_choice: "none" } } : {}) });
    this.await(turn);
  }

  // ---- barge-in, failures, the end of a turn ----------------------------------------------------

  /** Speech over the reply: its audio stops now, the response is cancelled, the model's items cut at what was heard. */
  private bargeIn(turn: ReplyTurn): void {
    turn.tools.abort(new Error("interrupted"));
    const played = turn.playout?.stop() ?? 0;
    turn.pending.clear();
    if (turn.responseActive) this.sendOwn({ type: "response.cancel" });
    turn.responseActive = false;
    this.cutItems(turn, played, true);
    this.endTurn(turn, "interrupted");
  }

  /** The model's items of the turn cut at what the device heard: truncated there, or deleted when none of one was sent. */
  private cutItems(turn: ReplyTurn, played: number, interrupted: boolean): void {
    for (const item of turn.items.values()) {
      if (!interrupted && item.received === 0) continue;
      const heard = Math.max(0, Math.min(item.written, played - item.start));
      // A cut reply's items heard whole stay whole (an interrupted response may hold more than came).
      if (!interrupted && heard >= item.received * (OPUS_RATE / REALTIME_RATE) - OPUS_RATE / 50) continue;
      if (heard <= 0) this.sendOwn({ type: "conversation.item.delete", item_id: item.id });
      else this.sendOwn({ type: "conversation.item.truncate", item_id: item.id, content_index: 0, audio_end_ms: Math.floor((heard * 1000) / OPUS_RATE) });
    }
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
      turn.tools.abort(new Error("the session failed"));
      turn.playout?.stop();
      this.endTurn(turn, "failed", reason);
    }
    if (heard) {
      this.o.events.eos(`in-${heard.n}`, "audio", "user.audio");
      this.endTurn(this.newTurn(heard.n, undefined), "failed", reason);
    }
    this.itemTurns.clear();
  }

  private endTurn(turn: ReplyTurn, result: Exclude<TurnResult, "empty">, error?: string): void {
    if (turn.ended) return;
    turn.ended = true;
    if (result !== "failed") this.o.usage?.answered();
    turn.cancelWait?.();
    turn.cancelWait = undefined;
    this.wake(turn);
    const played = turn.playout?.played ?? 0;
    if (result !== "answered") turn.playout?.stop();
    turn.up?.close();
    turn.pending.clear();
    const spoken = new SpokenText();
    const whole = result === "answered" && !turn.cut;
    // An item none of whose audio came was not heard, whatever its words.
    for (const item of turn.items.values()) if (whole || item.received > 0) spoken.add(item.text, item.received * (OPUS_RATE / REALTIME_RATE));
    const heard = (whole ? spoken.text : spoken.heard(played)).trim();
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
    this.o.log(result === "failed" ? "warn" : "info", { turn: turn.n, result, ...metrics, ...(error ? { error } : {}) }, "voice turn");
    // A session that answered a turn works: the next failure reconnects at once again.
    if (result === "answered" && turn.audioStarted) this.link.proven();
    turn.finish();
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

/** The bytes a base64 string decodes to. */
function base64Bytes(s: string): number {
  const pad = s.endsWith("==") ? 2 : s.endsWith("=") ? 1 : 0;
  return Math.max(0, Math.floor((s.length * 3) / 4) - pad);
}

/** A count the provider reported (none, or not positive, is 0). */
function num(v: number | undefined): number {
  return v !== undefined && v > 0 ? v : 0;
}
