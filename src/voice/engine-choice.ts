import type { Catalog } from "../ai/catalog.ts";
import type { AgentConfig } from "../config/config.ts";
import type { SpeechPort, TranscriptionPort, VoiceEngines } from "./engine-ports.ts";

export interface EngineChoiceOptions {
  /** The Compatible API's catalog: where an agent's `speech_model` and `transcription_model` are found. */
  catalog: Catalog;
  /** The node's own engines as ports (`tts-1`, `whisper-1`); absent when the process has none. */
  embedded: { speech?: SpeechPort; transcription?: TranscriptionPort };
}

/** An agent's engines, or why its conversations cannot have them (a configuration error to report at start-up). */
export type EngineFor = (agent: AgentConfig) => VoiceEngines | string;

/**
 * The one place that decides which engines an agent's conversations use (voice.md §5). Today every
 * agent has the embedded ones; the provider ports of the catalog's `speech` and `transcription`
 * models are resolved here too, so a conversation never knows which it was given.
 */
export function engineChooser(o: EngineChoiceOptions): EngineFor {
  return (_agent) => {
    const { speech, transcription } = o.embedded;
    if (!speech) return "the embedded speech engine (tts-1) is not available";
    if (!transcription) return "the embedded transcription engine (whisper-1) is not available";
    return { speech, transcription };
  };
}
