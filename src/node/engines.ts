import type { SpeexModule } from "@echogarden/speex-resampler-wasm";
import { JsonThread } from "../ai/json-thread.ts";
import { createSpeechEngine, createTranscriptionEngine, type Scheduler, type SpeechEngine, type TranscriptionEngine } from "../ai/speech/index.ts";
import { loadResampler } from "../audio/resampler.ts";
import { defaultRecogniserProcesses, thisMachine } from "./recogniser-processes.ts";

/** What the configuration says of the engines (`engines` of config.ts); unset: by the machine. */
export interface EngineSettings {
  recogniser_processes?: number | undefined;
  fast_recognition_after_ms?: number | false | undefined;
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

  /** Flite for speech, Moonshine for transcription, sized by `settings` (else by the machine). */
  static embedded(settings: EngineSettings = {}): EngineHost & { speech: SpeechEngine & { warmUp(): Promise<void> }; transcription: TranscriptionEngine } {
    const speech = createSpeechEngine();
    const transcription = createTranscriptionEngine({
      processes: settings.recogniser_processes ?? defaultRecogniserProcesses(thisMachine()),
      ...(settings.fast_recognition_after_ms !== undefined ? { fastAfterMs: settings.fast_recognition_after_ms } : {}),
    });
    return new EngineHost({ speech, transcription }, settings) as ReturnType<typeof EngineHost.embedded>;
  }

  /** A host around engines made elsewhere: it starts the JSON thread and the resampler, and leaves the engines to their maker. */
  static of(parts: EngineParts): EngineHost {
    return new EngineHost(parts, undefined);
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
