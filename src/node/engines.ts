import type { SpeexModule } from "@echogarden/speex-resampler-wasm";
import { JsonThread } from "../ai/json-thread.ts";
import { createSpeechEngine, createTranscriptionEngine, type Scheduler, type SpeechEngine, type TranscriptionEngine } from "../ai/speech/index.ts";
import type { LoadFailure, LoadState } from "../ai/speech/loading.ts";
import { voiceChain } from "../ai/voice-models.ts";
import { loadResampler } from "../audio/resampler.ts";
import type { Config } from "../config/config.ts";
import { defaultRecogniserProcesses, thisMachine } from "./recogniser-processes.ts";

/** What the configuration says of the engines (`engines` of config.ts); unset: by the machine. */
export interface EngineSettings {
  recogniser_processes?: number | undefined;
  fast_recognition_after_ms?: number | false | undefined;
  preload?: boolean | readonly EngineName[] | undefined;
}

/** The embedded engines a node may start: the recogniser processes, the voice activity process, flite's workers (the names of their queues). */
export const ENGINE_NAMES = ["recognition", "voice_activity", "speech"] as const;
export type EngineName = (typeof ENGINE_NAMES)[number];

/**
 * The engines a node starts with it: those `engines.preload` names, and those its voice
 * conversations use (with WebRTC on and an agent: the detector, which hears every conversation;
 * the recogniser and flite when an agent's transcription or speech model is the embedded one).
 * Every other engine starts on its first use (a Compatible API request for `whisper-1` or `tts-1`,
 * a provider's fallback to them), which waits for it.
 */
export function enginesAtStart(config: Pick<Config, "agents" | "models" | "webrtc" | "engines">): Set<EngineName> {
  const { preload } = config.engines;
  const out = new Set<EngineName>(preload === true ? ENGINE_NAMES : preload === false || preload === undefined ? [] : preload);
  if (!config.webrtc.enabled || config.agents.length === 0) return out;
  out.add("voice_activity");
  // A realtime agent's model hears and speaks itself (voice.md §6).
  const realtime = new Set(config.models.filter((m) => m.kind === "realtime").map((m) => m.id));
  for (const agent of config.agents) {
    if (realtime.has(agent.model)) continue;
    if (voiceChain(config, agent, "transcription")[0]?.kind === "embedded") out.add("recognition");
    if (voiceChain(config, agent, "speech")[0]?.kind === "embedded") out.add("speech");
  }
  return out;
}

/** Speech engines given to a host instead of the embedded ones (tests' fakes, a shared recogniser). */
export interface EngineParts {
  speech?: SpeechEngine | undefined;
  transcription?: TranscriptionEngine | undefined;
}

/**
 * What a node runs beside its event loop: the speech engines (each with its own queue and
 * workers), the JSON thread and the resampler's module. One per node, made by the node from its
 * settings and passed to its parts; nothing of it is shared with another node unless a caller
 * hands the same host to both on purpose. `close` ends what the host itself started.
 */
export class EngineHost {
  readonly speech: SpeechEngine | undefined;
  readonly transcription: TranscriptionEngine | undefined;
  /** JSON of large bodies, off the event loop. */
  readonly json = new JsonThread();
  /** The settings the embedded engines were made with (undefined when they were given). */
  readonly settings: EngineSettings | undefined;
  private readonly owned: boolean;
  private speex: Promise<SpeexModule> | undefined;

  private constructor(parts: EngineParts, settings: EngineSettings | undefined) {
    this.speech = parts.speech;
    this.transcription = parts.transcription;
    this.settings = settings;
    this.owned = settings !== undefined;
  }

  /** Flite for speech, Moonshine for transcription, sized by `settings` (else by the machine); none of their workers starts before `load` or a first use. */
  static embedded(
    settings: EngineSettings = {},
    warn?: (message: string) => void,
  ): EngineHost & { speech: SpeechEngine & { warmUp(): Promise<void> }; transcription: TranscriptionEngine } {
    const speech = createSpeechEngine(warn ? { warn } : {});
    const transcription = createTranscriptionEngine({
      ...(warn ? { warn } : {}),
      processes: settings.recogniser_processes ?? defaultRecogniserProcesses(thisMachine()),
      ...(settings.fast_recognition_after_ms !== undefined ? { fastAfterMs: settings.fast_recognition_after_ms } : {}),
    });
    return new EngineHost({ speech, transcription }, settings) as ReturnType<typeof EngineHost.embedded>;
  }

  /** A host around engines made elsewhere: it starts the JSON thread and the resampler, and leaves the engines to their maker. */
  static of(parts: EngineParts): EngineHost {
    return new EngineHost(parts, undefined);
  }

  /**
   * Starts the engines of `names` this host has (once each: an engine already started is not
   * started again); each promise resolves when its engine is ready. `speech` is flite's warm-up.
   */
  load(names: ReadonlySet<EngineName>): Array<{ engine: EngineName; ready: Promise<void> }> {
    const { speech, transcription } = this;
    const out: Array<{ engine: EngineName; ready: Promise<void> }> = [];
    const start = (engine: EngineName, work: (() => Promise<void>) | undefined) => {
      if (names.has(engine) && work) out.push({ engine, ready: work() });
    };
    start("recognition", transcription?.startRecognition?.bind(transcription));
    start("voice_activity", transcription?.startActivity?.bind(transcription));
    start("speech", speech?.warmUp?.bind(speech));
    return out;
  }

  /** Tells `fn` of each failed load of an engine (once per attempt; a failed load is tried again with back-off). */
  watchLoads(fn: (f: LoadFailure) => void): void {
    if (this.transcription) this.transcription.onLoadFailed = fn;
  }

  /** Where each engine's loading stands (`/metrics`: `perch_engine_state`). */
  states(): Array<{ engine: string; state: LoadState }> {
    return [...(this.transcription?.loadStates?.() ?? []), ...(this.speech?.loadStates?.() ?? [])];
  }

  /** The queues of this host's engines (`/metrics`). */
  schedulers(): Scheduler[] {
    return [...(this.speech?.schedulers ?? []), ...(this.transcription?.schedulers ?? [])];
  }

  /** The Speex module of this host, loaded once. */
  resampler(): Promise<SpeexModule> {
    this.speex ??= loadResampler();
    return this.speex;
  }

  async close(): Promise<void> {
    await this.json.close();
    if (this.owned) await Promise.all([this.transcription?.close?.(), this.speech?.close?.()]);
  }
}
