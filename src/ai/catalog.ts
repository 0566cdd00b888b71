import type { AgentConfig, Config, ModelConfig } from "../config/config.ts";
import { type Caller, mayUse } from "./caller.ts";

export type CatalogEntry =
  | { kind: "chat"; id: string; model: ModelConfig }
  | { kind: "agent"; id: string; agent: AgentConfig; model: ModelConfig }
  /** `model` for an upstream model; without it, the embedded engine. */
  | { kind: "speech"; id: string; voices: readonly string[]; model?: ModelConfig }
  | { kind: "transcription"; id: string; languages: readonly string[]; model?: ModelConfig }
  /** A speech-to-speech model (voice.md §6): voice agents only, never `/chat/completions`. */
  | { kind: "realtime"; id: string; model: ModelConfig };

/** What the embedded engines offer; undefined when an engine is absent. */
export interface EmbeddedModels {
  speech?: { voices: readonly string[] };
  transcription?: { languages: readonly string[] };
}

/** Every model id clients may send: configured chat models, agents, and the embedded engines' `tts-1` and `whisper-1`. */
export class Catalog {
  private readonly entries = new Map<string, CatalogEntry>();
  /** When the catalog was built, as `created` in `/models` (seconds). */
  readonly created = Math.floor(Date.now() / 1000);

  constructor(config: Pick<Config, "models" | "agents">, embedded: EmbeddedModels) {
    if (embedded.speech) this.entries.set("tts-1", { kind: "speech", id: "tts-1", voices: embedded.speech.voices });
    if (embedded.transcription) this.entries.set("whisper-1", { kind: "transcription", id: "whisper-1", languages: embedded.transcription.languages });
    const models = new Map(config.models.map((m) => [m.id, m]));
    for (const m of config.models) {
      // Upstream speech and transcription models take any voice and language: the provider checks them.
      if (m.kind === "chat") this.entries.set(m.id, { kind: "chat", id: m.id, model: m });
      else if (m.kind === "speech") this.entries.set(m.id, { kind: "speech", id: m.id, voices: [], model: m });
      else if (m.kind === "realtime") this.entries.set(m.id, { kind: "realtime", id: m.id, model: m });
      else this.entries.set(m.id, { kind: "transcription", id: m.id, languages: [], model: m });
    }
    for (const a of config.agents) this.entries.set(a.id, { kind: "agent", id: a.id, agent: a, model: models.get(a.model)! });
  }

  /** The entry `id` names, when `caller` may use it. */
  get(caller: Caller, id: string): CatalogEntry | undefined {
    const entry = this.entries.get(id);
    return entry && mayUse(caller, id) ? entry : undefined;
  }

  /** Every entry `caller` may use, in configuration order. */
  list(caller: Caller): CatalogEntry[] {
    return [...this.entries.values()].filter((e) => mayUse(caller, e.id));
  }

  /** Whether any chat model is configured at all (for a helpful 404). */
  get hasChat(): boolean {
    return [...this.entries.values()].some((e) => e.kind === "chat");
  }
}
