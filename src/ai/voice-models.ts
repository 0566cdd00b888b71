import { type AgentConfig, type Config, ConfigError, EMBEDDED_SPEECH_MODEL, EMBEDDED_TRANSCRIPTION_MODEL, type ModelConfig } from "../config/config.ts";

/** One model of an agent's speech or transcription chain: the embedded engine, or a catalog model on a provider. */
export type VoiceModel = { kind: "embedded"; id: string } | { kind: "provider"; id: string; model: ModelConfig };

/** What the embedded engines of this process offer (absent: no such engine). */
export interface EmbeddedVoice {
  voices?: readonly string[];
  languages?: readonly string[];
}

/** The models an agent's conversations try in order for `kind`: its own model, then that model's fallbacks. */
export function voiceChain(config: Pick<Config, "models">, agent: AgentConfig, kind: "speech" | "transcription"): VoiceModel[] {
  const embedded = kind === "speech" ? EMBEDDED_SPEECH_MODEL : EMBEDDED_TRANSCRIPTION_MODEL;
  const first = kind === "speech" ? agent.speech_model : agent.transcription_model;
  if (first === embedded) return [{ kind: "embedded", id: embedded }];
  const models = new Map(config.models.map((m) => [m.id, m]));
  const model = models.get(first)!;
  return [model.id, ...model.fallbacks].map((id) => (id === embedded ? { kind: "embedded", id } : { kind: "provider", id, model: models.get(id)! }));
}

/** The language subtag of a BCP-47 tag (`pt-BR` → `pt`), as transcription APIs take it. */
export function languageCode(tag: string): string {
  return tag.split("-")[0]!.toLowerCase();
}

/**
 * Start-up checks of each agent's voice engines that need the embedded engines' abilities: a voice
 * the embedded synthesiser lacks, or a language the embedded recogniser cannot hear, anywhere in
 * the agent's chains (a fallback is used as the first model would be).
 */
export function checkVoiceModels(config: Pick<Config, "models" | "agents">, embedded: EmbeddedVoice): void {
  const realtime = new Set(config.models.filter((m) => m.kind === "realtime").map((m) => m.id));
  config.agents.forEach((a, i) => {
    // A realtime agent's voice is its model's, passed as is (voice.md §6).
    if (realtime.has(a.model)) return;
    const speech = voiceChain(config, a, "speech");
    if (a.voice !== undefined && embedded.voices && speech.some((m) => m.kind === "embedded") && !embedded.voices.includes(a.voice)) {
      throw new ConfigError(
        `invalid configuration at agents.${i}.voice: unknown voice ${a.voice} for agent ${a.id}; ${EMBEDDED_SPEECH_MODEL} has ${embedded.voices.join(", ")}`,
      );
    }
    const hears = embedded.languages;
    if (a.language === undefined || !hears) return;
    const chain = voiceChain(config, a, "transcription");
    if (!chain.some((m) => m.kind === "embedded") || hears.includes(languageCode(a.language))) return;
    const which =
      a.transcription_model === EMBEDDED_TRANSCRIPTION_MODEL
        ? `${EMBEDDED_TRANSCRIPTION_MODEL} (the embedded recogniser) hears`
        : `${a.transcription_model} falls back to ${EMBEDDED_TRANSCRIPTION_MODEL} (the embedded recogniser), which hears`;
    throw new ConfigError(
      `invalid configuration at agents.${i}.language: agent ${a.id} speaks ${a.language}, but its transcription model ${which} only ${hears.join(", ")}`,
    );
  });
}
