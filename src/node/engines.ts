import { createSpeechEngine, createTranscriptionEngine, type SpeechEngine, type TranscriptionEngine } from "../ai/speech/index.ts";

let engines: { speech: ReturnType<typeof createSpeechEngine>; transcription: TranscriptionEngine } | undefined;

/**
 * The embedded engines, one pair per process (each has its own queue and workers), however many
 * nodes it starts: the first caller's settings apply.
 */
export function embeddedEngines(settings: { recogniserProcesses?: number } = {}): {
  speech: SpeechEngine & { warmUp(): Promise<void> };
  transcription: TranscriptionEngine;
} {
  engines ??= { speech: createSpeechEngine(), transcription: createTranscriptionEngine({ processes: settings.recogniserProcesses ?? 1 }) };
  return engines;
}
