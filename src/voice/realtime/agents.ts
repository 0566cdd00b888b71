import type { Config } from "../../config/config.ts";
import { DEFAULT_INPUT_TRANSCRIPTION, realtimeUrl, type SessionSettings } from "./wire.ts";

/** A realtime agent (voice.md §6) as its sessions need it. */
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

const DEFAULT_BASE_URL = "https://api.openai.com/v1";
const DEFAULT_VOICE = "alloy";

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
