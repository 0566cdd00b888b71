import type { SpeexModule } from "@echogarden/speex-resampler-wasm";
import type { Logger } from "pino";
import type { Registry } from "prom-client";
import type { Toolbox, ToolObserver } from "../ai/agents/toolbox.ts";
import type { ChatService } from "../ai/chat.ts";
import type { OpusRate } from "../audio/opus.ts";
import type { Config } from "../config/config.ts";
import type { Domain } from "../domain/index.ts";
import type { Traced, Tracing } from "../observability/tracing.ts";
import type { ChatMessage, ChatRequest } from "../protocol/compat.ts";
import { DeviceAgentChoice } from "./agent-choice.ts";
import { AudioThreads, defaultAudioThreads } from "./audio-threads.ts";
import { systemClock } from "./clock.ts";
import { Conversation } from "./conversation.ts";
import type { EngineFor } from "./engine-choice.ts";
import type { VoiceActivityPort, VoiceEngines } from "./engine-ports.ts";
import { MemoryKeeper } from "./memory-keeper.ts";
import type { MemoryRewriter } from "./memory-rewriter.ts";
import { VoiceMetrics } from "./metrics.ts";
import type { FrameEncoder } from "./opus.ts";
import { VoiceEvents } from "./peer-events.ts";
import type { AudioPort, VoiceHost, VoiceSession } from "./port.ts";
import { RealtimeActivity } from "./realtime/activity.ts";
import { type RealtimeAgentInfo, realtimeAgents } from "./realtime/agents.ts";
import { observeRecording, TurnRecorder } from "./recording.ts";
import { toolEvents } from "./tool-events.ts";
import { observeTranscript } from "./transcript.ts";
import { deviceRealtimeUsage, deviceTurnUsage, LimitedReplies, type RealtimeUsage } from "./usage.ts";

export interface VoiceServiceOptions {
  config: Config;
  domain: Domain;
  chat: ChatService;
  /** The node's voice activity detector. */
  activity: VoiceActivityPort;
  /** Each agent's engines (src/voice/engine-choice.ts). */
  engineFor: EngineFor;
  resampler: SpeexModule;
  registry: Registry;
  logger: Logger;
  /** The agents' tools (a realtime agent's function calls run through it; a text agent's through `chat`). */
  toolbox: Toolbox;
  /** Where providers' keys are read (realtime agents). */
  env?: NodeJS.ProcessEnv;
  /** Rewrites devices' memories after their conversations (agents with `memory`). */
  memory?: MemoryRewriter;
  /** The node's tracing: each turn a trace. */
  tracing?: Tracing | undefined;
}

/** Voice conversations of this node: one per active connection, sharing the process's engines. */
export class VoiceService implements VoiceHost {
  private readonly o: VoiceServiceOptions;
  private readonly metrics: VoiceMetrics;
  private readonly open_ = new Set<Conversation>();
  /** Agents whose model is realtime (voice.md §6): their conversations' part is a realtime session (src/voice/realtime/activity.ts), not the engines. */
  private readonly realtime: Map<string, RealtimeAgentInfo>;
  /** Each agent's engines, chosen once; an agent whose engines are missing does not converse. */
  private readonly engines = new Map<string, VoiceEngines>();
  /** A realtime agent's engines for its limited reply, when it is limited (its speech and transcription models). */
  private readonly limitedEngines = new Map<string, VoiceEngines>();
  /** Each agent's limited reply, synthesised once and kept (usage.md §3). */
  private readonly limitedReplies: LimitedReplies;
  /** The threads that decode the uplinks (started with the first conversation; none when `voice.audio_threads` is 0). */
  private threads_: AudioThreads | undefined;

  constructor(o: VoiceServiceOptions) {
    this.o = o;
    this.metrics = new VoiceMetrics(o.registry, () => this.size);
    this.realtime = realtimeAgents(o.config, o.env ?? process.env);
    this.limitedReplies = new LimitedReplies(o.config.agents);
    for (const agent of o.config.agents) {
      if (this.realtime.has(agent.id)) {
        const engines = o.engineFor(agent);
        if (typeof engines !== "string") this.limitedEngines.set(agent.id, engines);
        continue;
      }
      const engines = o.engineFor(agent);
      if (typeof engines === "string") o.logger.warn({ agent: agent.id, reason: engines }, "this agent cannot converse");
      else this.engines.set(agent.id, engines);
    }
  }

  /** Conversations held now (voice off is none). */
  get size(): number {
    let n = 0;
    for (const c of this.open_) if (c.active) n++;
    return n;
  }

  /** The node's audio threads, started at the first conversation that needs them. */
  get threads(): AudioThreads | undefined {
    const size = this.o.config.voice.audio_threads ?? defaultAudioThreads();
    if (size === 0) return undefined;
    this.threads_ ??= new AudioThreads(size, (details, message) => this.o.logger.warn(details, message));
    return this.threads_;
  }

  /** Ends the audio threads (the node is closing; its connections are closed first). */
  async close(): Promise<void> {
    await this.threads_?.close();
    this.threads_ = undefined;
  }

  open(devicePort: AudioPort): VoiceSession {
    // The conversation's entries for the device's Side Control, read from the events it sends.
    // Only the error's message: a row the store refused may be quoted in its details, and transcripts stay out of logs above debug.
    const recorder = this.o.domain.conversations.open(devicePort.publicKey, (err) =>
      this.o.logger.warn({ error: err instanceof Error ? err.message : String(err), peer: devicePort.publicKey }, "a conversation entry could not be stored"),
    );
    const keeper = this.keeper(devicePort.publicKey);
    const transcript = observeTranscript(devicePort, (entry) => {
      this.o.logger.debug({ peer: devicePort.publicKey, conversation: recorder.id, ...entry }, "conversation entry");
      recorder.add(entry);
      keeper?.entry(entry);
    });
    const key = devicePort.publicKey;
    // What happened in each turn, after its entries: its metrics, and its two sides when the agent records (voice.md §8).
    const turns = new TurnRecorder({
      policy: () => this.recordingPolicy(choice.chosenId()),
      store: (r) => recorder.recording(r.turn, r.side, r.audio, r.durationMs, r.retentionDays),
      metrics: (turn, json) => recorder.metrics(turn, json),
      warn: (err) => this.o.logger.warn({ error: err instanceof Error ? err.message : String(err), peer: key }, "a turn's recording could not be made"),
    });
    const port = observeRecording(transcript.port, turns);
    const events = new VoiceEvents(port);
    const choice = new DeviceAgentChoice({
      key,
      read: () => this.o.domain.peers.voiceAgent(key),
      bus: this.o.domain.ctx.events.bus,
      defaultAgent: this.o.config.voice.agent,
      agents: this.o.config.agents,
      engines: this.engines,
      onReadError: (err) => this.o.logger.warn({ err, peer: key }, "could not read the device's voice agent; trying again"),
    });
    let conversation: Conversation;
    const meter = this.o.domain.usage.meter;
    const realtimeUsage = this.realtime.size > 0 ? deviceRealtimeUsage(meter, key) : undefined;
    // A realtime agent at its limit: its session is closed, and the text pipeline answers with its limited reply.
    const limitedRealtime = () => {
      const id = choice.chosenId();
      const engines = id !== undefined ? this.limitedEngines.get(id) : undefined;
      if (!id || !engines || !realtimeUsage?.limited(id)) return undefined;
      return { id, voice: engines.speech.engine === "embedded" ? "alloy" : (this.realtime.get(id)?.voice ?? "alloy"), engines };
    };
    const realtimeAgents = this.realtime;
    try {
      conversation = new Conversation({
        port,
        // With transcripts stored, a device back from a drained node (or a dropped link) continues its conversation (fleet.md §3).
        ...(this.o.domain.conversations.storing
          ? { earlier: this.o.domain.conversations.continuing(key, this.o.config.voice.history_turns).catch(() => []) }
          : {}),
        config: this.o.config.voice,
        activity: this.o.activity,
        resampler: this.o.resampler,
        metrics: this.metrics,
        logger: this.o.logger,
        agent: () => choice.current() ?? limitedRealtime(),
        ...(realtimeAgents.size > 0
          ? {
              realtime: {
                // While a usage limit is reached no session is open: the device's turns get the agent's limited reply instead (limitedRealtime).
                chosen: () => {
                  const id = choice.chosenId();
                  return id !== undefined && realtimeAgents.has(id) && !realtimeUsage?.limited(id) ? id : undefined;
                },
                open: (agentId, out) => this.realtimeActivity(key, events, realtimeAgents.get(agentId)!, out, keeper, realtimeUsage, recorder.id),
              },
            }
          : {}),
        threads: this.threads,
        usage: deviceTurnUsage(meter, key, this.limitedReplies),
        limited: () => {
          const agent = choice.chosenId();
          return agent !== undefined && meter.limitedCached({ id: `device:${key}`, device: key }, agent);
        },
        ...(this.o.tracing ? { tracing: { tracing: this.o.tracing, conversation: recorder.id } } : {}),
        ...(this.recording
          ? { tap: { heard: (pcm: Int16Array, rate: OpusRate) => turns.heard(pcm, rate), silence: (n: number, rate: OpusRate) => turns.silence(n, rate) } }
          : {}),
        run: async (agentId, messages, signal, n, release, trace) => {
          // The memory as notes after the agent's instructions (read when the conversation began).
          const notes = await keeper?.notes(agentId);
          // A reply prepared in a pause (voice.md §7) runs its tools only once it is used.
          const tools = { ...toolEvents(events, `out-${n}`), ...(release ? { ready: release } : {}) };
          return this.reply(port.publicKey, agentId, notes ? [notes, ...messages] : messages, signal, tools, trace);
        },
      });
    } catch (err) {
      // Nothing of this connection's stays subscribed or open when its conversation cannot start.
      choice.close();
      transcript.close();
      turns.close();
      recorder.close();
      keeper?.close();
      throw err;
    }
    this.open_.add(conversation);
    return {
      hearing: () => conversation.hearing,
      close: () => {
        this.open_.delete(conversation);
        choice.close();
        conversation.close();
        transcript.close();
        turns.close();
        recorder.close();
        keeper?.close();
      },
    };
  }

  /** Whether some agent records its turns (then the uplink's audio is tapped). */
  private get recording(): boolean {
    return this.o.domain.conversations.storing && this.o.config.agents.some((a) => a.record?.audio);
  }

  /** The recording retention of the agent answering now; undefined when it does not record. */
  private recordingPolicy(agentId: string | undefined): { retentionDays: number } | undefined {
    const agent = agentId === undefined ? undefined : this.o.config.agents.find((a) => a.id === agentId);
    return agent?.record?.audio && this.o.domain.conversations.storing ? { retentionDays: agent.record.retention_days } : undefined;
  }

  /** A realtime agent's part of a device's conversation: its session, its tools for this device, the device's memory as notes. */
  private realtimeActivity(
    key: string,
    events: VoiceEvents,
    agent: RealtimeAgentInfo,
    out: { encoder: FrameEncoder; send: (opus: Buffer, first: boolean) => boolean },
    keeper: MemoryKeeper | undefined,
    usage: RealtimeUsage | undefined,
    conversation: string,
  ): RealtimeActivity {
    const { config } = this.o;
    const agentConfig = config.agents.find((a) => a.id === agent.id)!;
    const model = config.models.find((m) => m.id === agentConfig.model)!;
    return new RealtimeActivity({
      agent,
      config: config.voice,
      events,
      tools: this.o.toolbox.forRun(agentConfig, model, { kind: "device", publicKey: key }),
      toolEvents: (n) => toolEvents(events, `out-${n}`),
      activity: this.o.activity,
      // The device's memory as notes after the agent's instructions, as text agents have it.
      notes: async () => {
        const notes = await keeper?.notes(agent.id);
        return typeof notes?.content === "string" ? notes.content : undefined;
      },
      resampler: this.o.resampler,
      encoder: out.encoder,
      metrics: this.metrics,
      clock: systemClock,
      send: out.send,
      log: (level, details, message) => this.o.logger[level]({ peer: key, ...details }, message),
      ...(usage ? { usage: usage.counts(agent.id) } : {}),
      ...(this.o.tracing ? { tracing: { tracing: this.o.tracing, conversation } } : {}),
    });
  }

  /** The memory of a connection's conversations, when some agent remembers. */
  private keeper(key: string): MemoryKeeper | undefined {
    const rewriter = this.o.memory;
    if (!rewriter || !this.o.config.agents.some((a) => a.memory?.enabled)) return undefined;
    const { domain } = this.o;
    return new MemoryKeeper({
      deviceKey: key,
      agents: this.o.config.agents,
      read: () => domain.memory.forConversation(key),
      rewrite: (job) => void rewriter.submit(job),
      now: () => domain.ctx.clock.now(),
      clock: systemClock,
      onReadError: (err) => this.o.logger.warn({ error: err instanceof Error ? err.message : String(err), peer: key }, "could not read the device's memory"),
    });
  }

  /** The agent's answer through the Compatible API's own agent code, with the device as the caller; text deltas. */
  private async reply(
    publicKey: string,
    agentId: string,
    messages: ChatMessage[],
    signal: AbortSignal,
    tools: ToolObserver,
    trace?: Traced,
  ): Promise<AsyncIterable<string>> {
    const request = { model: agentId, messages, stream: true } as ChatRequest;
    const result = await this.o.chat.chat({ kind: "device", publicKey }, request, signal, tools, trace);
    if (result.kind !== "stream") throw new Error("the agent did not stream");
    const events = result.stream.events();
    return (async function* () {
      // A provider's failure is thrown by the stream itself, never an event.
      for await (const event of events) {
        if (event.type !== "chunk") continue;
        const text = event.chunk.choices?.[0]?.delta?.content;
        if (text) yield text;
      }
    })();
  }
}
