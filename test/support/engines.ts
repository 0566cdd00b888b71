import type { SpeechEngine, TranscriptionEngine } from "../../src/ai/speech/index.ts";

// Until the embedded engines land on this branch: engines that answer the routes' calls with fixed
// audio and text, so that the HTTP side (validation, formats, SSE) can be tested. Replaced by the
// real engines when they land.
const speech: SpeechEngine = {
  voices: ["alloy", "echo", "fable", "onyx", "nova", "shimmer"],
  async *synthesize(o) {
    for (const word of o.text.split(/\s+/)) yield Buffer.from(word);
  },
};
const transcription: TranscriptionEngine = {
  languages: ["en"],
  async transcribe() {
    return { language: "en", duration: 0.1, text: "", segments: [] };
  },
};

export function engines(): { speech: SpeechEngine; transcription?: TranscriptionEngine } {
  return { speech, transcription };
}
