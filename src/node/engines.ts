import { createSpeechEngine, createTranscriptionEngine, type SpeechEngine, type TranscriptionEngine } from "../ai/speech/index.ts";
import { defaultRecogniserProcesses, thisMachine } from "./recogniser-processes.ts";

let engines: { speech: ReturnType<typeof createSpeechEngine>; transcription: TranscriptionEngine } | undefined;

/** What the configuration says of the engines (`engines` of config.ts); unset: by the machine. */
export interface EngineSettings {
  recogniser_processes?: number | undefined;
  fast_recognition_after_ms?: number | false | undefined;
}

/**
 * The embedded engines, one pair per process (each has its own queue and workers), however many
 * nodes it starts: the first caller's settings apply.
 */
export function embeddedEngines(settings: EngineSettings = {}): {
  speech: SpeechEngine & { warmUp(): Promise<void> };
  transcription: TranscriptionEngine;
} {
  engines ??= {
    speech: createSpeechEngine(),
    transcription: createTranscriptionEngine({
      processes: settings.recogniser_processes ?? defaultRecogniserProcesses(thisMachine()),
      ...(settings.fast_recognition_after_ms !== undefined ? { fastAfterMs: settings.fast_recognition_after_ms } : {}),
    }),
  };
  return engines;
}
