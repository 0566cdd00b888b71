/**
 * The embedded engines behind the Compatible API's speech and transcription routes, all installed
 * by `npm install`: flite for speech, Moonshine (with Silero's voice activity detection) for
 * transcription, ffmpeg for every encoding and decoding.
 */
import { MoonshineEngine, type MoonshineEngineOptions } from "./recogniser.ts";
import { FliteSpeechEngine, type SpeechEngineOptions } from "./speech.ts";

export {
  DECODED_SAMPLE_RATE,
  DEFAULT_MAX_AUDIO_SECONDS,
  type DecodedAudio,
  type DecodeOptions,
  decodeAudio,
  toInt16,
} from "./decode.ts";
export { AudioDecodeError, AudioTooLongError, EngineBusyError, UnsupportedLanguageError } from "./errors.ts";
export { ffmpegPath, MAX_BYTES_PER_SECOND } from "./ffmpeg.ts";
export { IncrementalRecogniser, LiveVad, MoonshineEngine, type MoonshineEngineOptions } from "./recogniser.ts";
export { type ClassStats, type JobClass, OverloadedError, Scheduler } from "./scheduler.ts";
export { FliteSpeechEngine, MAX_INPUT_CHARACTERS, MAX_SPEED, MIN_SPEED, type SpeechEngineOptions, VOICES } from "./speech.ts";
export * from "./types.ts";
export type { VadEvent, VadOptions } from "./vad.ts";

/** One per process: each engine has its own queue and worker threads. Call `warmUp()` at start-up to keep the first request fast. */
export function createSpeechEngine(options?: SpeechEngineOptions): FliteSpeechEngine {
  return new FliteSpeechEngine(options);
}

/** One per process; its models load in worker threads from `start()` (or the first request) on. */
export function createTranscriptionEngine(options?: MoonshineEngineOptions): MoonshineEngine {
  return new MoonshineEngine(options);
}
