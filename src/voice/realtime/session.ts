import type { SpeexModule } from "@echogarden/speex-resampler-wasm";
import type { Toolbox } from "../../ai/agents/toolbox.ts";
import type { Config } from "../../config/config.ts";
import type { VoiceClock } from "../clock.ts";
import type { VoiceActivityPort } from "../engine-ports.ts";
import type { VoiceMetrics } from "../metrics.ts";
import type { VoiceEvents } from "../peer-events.ts";
import type { AudioPort } from "../port.ts";
import { toolEvents } from "../tool-events.ts";
import type { RealtimeUsage } from "../usage.ts";
import { type RealtimeAgentInfo, RealtimeBridge } from "./bridge.ts";
import { DEFAULT_INPUT_TRANSCRIPTION, realtimeUrl } from "./wire.ts";

const DEFAULT_BASE_URL = "https://api.openai.com/v1";
const DEFAULT_VOICE = "alloy";
/** The bridge's clock: the uplink's jitter buffer and the node's end of turn. */
const TICK_MS = 20;

/** The agents whose model is realtime, with what their sessions need (keys from the environment). */
export function realtimeAgents(config: Pick<Config, "agents" | "models" | "providers">, env: NodeJS.ProcessEnv): Map<string, RealtimeAgentInfo> {
  const out = new Map<string, RealtimeAgentInfo>();
  for (const a of config.agents) {
    const model = config.models.find((m) => m.id === a.model);
    if (model?.kind !== "realtime") continue;
    const provider = config.providers.find((p) => p.id === model.provider);
    if (!provider) continue;
    out.set(a.id, {
      id: a.id,
      instructions: a.instructions,
      voice: a.voice ?? DEFAULT_VOICE,
      turnDetection: a.turn_detection ?? "server_vad",
      transcription: a.input_transcription ?? DEFAULT_INPUT_TRANSCRIPTION,
      toolTimeoutMs: a.tool_timeout_ms,
      maxSteps: a.max_steps,
      provider: provider.id,
      url: realtimeUrl(provider.base_url ?? DEFAULT_BASE_URL, model.upstream_model),
      apiKey: provider.api_key_env ? env[provider.api_key_env] : undefined,
      timeoutMs: provider.timeout_ms,
    });
  }
  return out;
}

export interface RealtimeVoiceOptions {
  port: AudioPort;
  events: VoiceEvents;
  config: Config;
  agents: ReadonlyMap<string, RealtimeAgentInfo>;
  /** The agent answering the device now (any kind), or undefined when its voice is off. */
  agentId: () => string | undefined;
  /** The device's memory for an agent (read once a conversation), to follow its instructions. */
  notes?: (agentId: string) => Promise<string | undefined>;
  toolbox: Toolbox;
  activity: VoiceActivityPort | undefined;
  resampler: SpeexModule;
  metrics: VoiceMetrics;
  clock: VoiceClock;
  log: (level: "info" | "warn" | "debug", details: Record<string, unknown>, message: string) => void;
  /** The device's usage: no session is open while a limit is reached (usage.md §3); the sessions' use counted. */
  usage?: RealtimeUsage;
}

/**
 * A connection's speech-to-speech side: while the device's agent is realtime, a bridge to its
 * model (opened as soon as that agent is known, so the first turn pays no handshake); another
 * agent, or voice off, closes it. The device's packets reach the bridge only then.
 */
export class RealtimeVoice {
  private readonly o: RealtimeVoiceOptions;
  private bridge: { id: string; b: RealtimeBridge } | undefined;
  private readonly stopTicker: () => void;
  private refused: string | undefined;
  private closed = false;

  constructor(o: RealtimeVoiceOptions) {
    this.o = o;
    this.stopTicker = o.clock.every(TICK_MS, () => {
      try {
        this.sync();
        this.bridge?.b.tick();
      } catch (err) {
        o.log("warn", { err }, "realtime voice tick failed");
      }
    });
    this.sync();
  }

  /** Whether a realtime conversation is going on now. */
  get active(): boolean {
    return this.bridge !== undefined;
  }

  packet(bytes: Buffer): void {
    if (this.closed || !this.bridge) return;
    try {
      this.bridge.b.packet(bytes);
    } catch (err) {
      this.o.log("warn", { err }, "realtime uplink packet failed");
    }
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.stopTicker();
    this.bridge?.b.close();
    this.bridge = undefined;
  }

  private sync(): void {
    if (this.closed) return;
    const chosen = this.o.agentId();
    // While a usage limit is reached no session is open: the device's turns get the agent's limited reply instead (src/voice/service.ts).
    const id = chosen !== undefined && this.o.agents.has(chosen) && this.o.usage?.limited(chosen) ? undefined : chosen;
    const agent = id !== undefined ? this.o.agents.get(id) : undefined;
    if (this.bridge && this.bridge.id === agent?.id) return;
    this.bridge?.b.close();
    this.bridge = undefined;
    if (!agent || this.refused === agent.id) return;
    const { o } = this;
    const model = o.config.models.find((m) => m.id === o.config.agents.find((a) => a.id === agent.id)?.model)!;
    const agentConfig = o.config.agents.find((a) => a.id === agent.id)!;
    try {
      this.bridge = {
        id: agent.id,
        b: new RealtimeBridge({
          agent,
          config: o.config.voice,
          events: o.events,
          tools: o.toolbox.forRun(agentConfig, model, { kind: "device", publicKey: o.port.publicKey }),
          toolEvents: (n) => toolEvents(o.events, `out-${n}`),
          activity: o.activity,
          ...(o.notes ? { notes: () => o.notes!(agent.id) } : {}),
          resampler: o.resampler,
          payloadType: o.port.payloadType,
          audioLevelId: o.port.audioLevelId,
          metrics: o.metrics,
          clock: o.clock,
          send: (opus, first) => o.port.sendFrame(opus, first),
          log: o.log,
          ...(o.usage ? { usage: o.usage.counts(agent.id) } : {}),
        }),
      };
      this.refused = undefined;
    } catch (err) {
      // Said once per agent, not every tick.
      this.refused = agent.id;
      o.log("warn", { err, agent: agent.id }, "this realtime agent cannot converse");
    }
  }
}
