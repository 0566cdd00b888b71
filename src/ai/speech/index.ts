// Interface of the embedded speech engines, built on the `speech` branch; this file is replaced by
// that module when it lands on main. It holds only the contract's types and errors: no engine.
export type SpeechFormat = "mp3" | "opus" | "aac" | "flac" | "wav" | "pcm";
export interface SpeechEngine {
  voices: readonly string[];
  synthesize(o: { text: string; voice: string; format: SpeechFormat; speed: number; signal?: AbortSignal }): AsyncIterable<Uint8Array>;
}
export interface TranscriptSegment {
  id: number;
  start: number;
  end: number;
  text: string;
}
export interface TranscriptWord {
  word: string;
  start: number;
  end: number;
}
export interface Transcript {
  language: string;
  duration: number;
  text: string;
  segments: TranscriptSegment[];
  words?: TranscriptWord[];
}
export interface TranscriptionEngine {
  languages: readonly string[];
  wordTimestamps?: boolean;
  transcribe(o: { audio: Uint8Array; language?: string; prompt?: string; signal?: AbortSignal }): Promise<Transcript>;
}
export class EngineBusyError extends Error {}
export class AudioDecodeError extends Error {}
