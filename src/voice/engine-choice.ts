import type { Catalog } from "../ai/catalog.ts";
import type { RemoteContext } from "../ai/remote-speech.ts";
import { voiceChain } from "../ai/voice-models.ts";
import type { AgentConfig, Config } from "../config/config.ts";
import type { SpeechPort, TranscriptionPort, VoiceEngines } from "./engine-ports.ts";
import { providerSpeech, providerTranscription } from "./provider-engines.ts";

export interface EngineChoiceOptions {
  /** The Compatible API's catalog: where an agent's `speech_model` and `transcription_model` are found. */
  catalog: Catalog;
  /** The node's own engines as ports (`tts-1`, `whisper-1`); absent when the process has none. */
  embedded: { speech?: SpeechPort; transcription?: TranscriptionPort };
  /** The catalog's models and how their providers are called (the Compatible API's router). */
  providers: { config: Pick<Config, "models">; remote: RemoteContext };
}

/** An agent's engines, or why its conversations cannot have them (a configuration error to report at start-up). */
export type EngineFor = (agent: AgentConfig) => VoiceEngines | string;

/**
 * The one place that decides which engines an agent's conversations use (voice.md §5): the
 * embedded ones, or the provider ports of the catalog's `speech` and `transcription` models (with
 * the embedded engine behind them when it closes their fallbacks), so a conversation never knows
 * which it was given.
 */
export function engineChooser(o: EngineChoiceOptions): EngineFor {
  const { config, remote } = o.providers;
  return (agent) => {
    const [speechModel] = voiceChain(config, agent, "speech");
    const [transcriptionModel] = voiceChain(config, agent, "transcription");
    const { speech, transcription } = o.embedded;
    if (speechModel?.kind !== "provider" && !speech) return "the embedded speech engine (tts-1) is not available";
    if (transcriptionModel?.kind !== "provider" && !transcription) return "the embedded transcription engine (whisper-1) is not available";
    return {
      speech: speechModel?.kind === "provider" ? providerSpeech(remote, speechModel.model, speech) : speech!,
      transcription: transcriptionModel?.kind === "provider" ? providerTranscription(remote, transcriptionModel.model, transcription) : transcription!,
    };
  };
}
