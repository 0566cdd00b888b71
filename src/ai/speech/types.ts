import type { LoadFailure, LoadState } from "./loading.ts";
import type { Scheduler } from "./scheduler.ts";

export type SpeechFormat = "mp3" | "opus" | "aac" | "flac" | "wav" | "pcm";

export const SPEECH_FORMATS: readonly SpeechFormat[] = ["mp3", "opus", "aac", "flac", "wav", "pcm"];

/** The `Content-Type` of each format, as the contract lists them. */
export const SPEECH_CONTENT_TYPES: Readonly<Record<SpeechFormat, string>> = {
  mp3: "audio/mpeg",
  opus: "audio/ogg",
  aac: "audio/aac",
  flac: "audio/flac",
  wav: "audio/wav",
  pcm: "audio/pcm",
};

export interface SynthesizeOptions {
  text: string;
  voice: string;
  format: SpeechFormat;
  /** 0.25–4.0; 1 is the voice's own pace. */
  speed: number;
  signal?: AbortSignal;
  /** Whose request (fair queuing among callers); one caller for all when absent. */
  caller?: string;
  /** Refused with EngineBusyError (a 429) when its first sentence cannot start within this many ms. */
  maxWaitMs?: number;
}

export interface SpeechEngine {
  /** alloy, echo, fable, onyx, nova, shimmer */
  voices: readonly string[];
  /** Output sample rate of every format (pcm is raw 16-bit little-endian mono at this rate). */
  sampleRate?: number;
  /**
   * Encoded audio, produced progressively. Throws EngineBusyError when its queue is full: at once
   * when the queue is already full at the call, else from the first `next()` if it filled since.
   */
  synthesize(o: SynthesizeOptions): AsyncIterable<Uint8Array>;
  /** Its queues, for `/metrics`. */
  readonly schedulers?: readonly Scheduler[];
  /** Starts its workers and runs each voice once, so that no request pays for it (idempotent). */
  warmUp?(): Promise<void>;
  /** Where its workers' start stands (`/metrics`). */
  loadStates?(): Array<{ engine: string; state: LoadState }>;
  /** Stops its workers. */
  close?(): Promise<void>;
}

export interface TranscriptWord {
  word: string;
  start: number;
  end: number;
}

export interface TranscriptSegment {
  id: number;
  /** Seconds from the start of the audio. */
  start: number;
  end: number;
  text: string;
}

export interface Transcript {
  language: string;
  /** Seconds of decoded audio. */
  duration: number;
  text: string;
  segments: TranscriptSegment[];
  /** Every recognised word with its timing (for `timestamp_granularities[]=word`). */
  words?: TranscriptWord[];
}

export interface TranscribeOptions {
  audio: Uint8Array;
  /** ISO-639-1; anything outside `languages` throws UnsupportedLanguageError. */
  language?: string;
  /** Accepted for compatibility; Moonshine has no way to use it. */
  prompt?: string;
  /** Longer decoded audio is refused with AudioTooLongError (default 600 s; see decode.ts). */
  maxSeconds?: number;
  signal?: AbortSignal;
  /** Whose request (fair queuing among callers); one caller for all when absent. */
  caller?: string;
  /** Refused with EngineBusyError (a 429) when its recognition cannot start within this many ms. */
  maxWaitMs?: number;
}

/** Called as a transcription goes: once the audio is decoded (`onStart`), then as each segment is recognised. */
export interface TranscribeProgress {
  onStart?: (duration: number) => void;
  onSegment?: (segment: TranscriptSegment) => void;
}

export interface TranscriptionEngine {
  /** ["en"] for Moonshine */
  languages: readonly string[];
  /** Whether `words` carries per-word timings. */
  wordTimestamps?: boolean;
  /**
   * Decodes any supported container (decode.ts) and recognises it. Throws AudioDecodeError for a
   * corrupt file (AudioTooLongError past `maxSeconds`), EngineBusyError when the queue is full,
   * UnsupportedLanguageError; all of them before `progress.onStart`.
   */
  transcribe(o: TranscribeOptions, progress?: TranscribeProgress): Promise<Transcript>;
  /** Starts loading the models in the background (idempotent); resolves when they are ready. */
  start?(): Promise<void>;
  /** The same for the recognition model alone, and for the voice activity model alone. */
  startRecognition?(): Promise<void>;
  startActivity?(): Promise<void>;
  /** Where each part's loading stands (`/metrics`). */
  loadStates?(): Array<{ engine: string; state: LoadState }>;
  /** Told of each failed load of a part (once per attempt). */
  onLoadFailed?: ((f: LoadFailure) => void) | undefined;
  /** Its queues, for `/metrics`. */
  readonly schedulers?: readonly Scheduler[];
  /** Stops its workers and processes. */
  close?(): Promise<void>;
}
