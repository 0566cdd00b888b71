/**
 * The engine ports of a voice conversation (voice.md §5): what the conversation needs from speech
 * synthesis and from speech recognition, and nothing more. Each port has an embedded
 * implementation (flite; Moonshine, in src/voice/embedded-engines.ts) and one over an
 * OpenAI-compatible provider (`/audio/speech` with `pcm`, `/audio/transcriptions` with a WAV).
 * Voice activity detection is always the node's own (Silero), so it has a port of its own with
 * only the embedded implementation.
 *
 * Every call takes an AbortSignal: a barge-in or the end of the connection aborts it, and an
 * implementation then stops its work and releases what it holds (a provider sees its request's
 * connection closed). Failures are thrown (or rejected); they end one turn, never the conversation.
 */

/** Which engine answered, for `turn.metrics.engines` and the `engine` label: `"embedded"` or the provider's id. */
export type EngineId = string;

/** The engine id of the node's own engines. */
export const EMBEDDED: EngineId = "embedded";

/** The rate every 16-bit mono PCM given to recognition is at (the uplink resamples to it). */
export const RECOGNITION_RATE = 16_000;

/** A piece of synthesised speech: 16-bit mono PCM at `sampleRate`. */
export interface SpeechChunk {
  pcm: Int16Array;
  /** Hz; the same for every chunk of one sentence (a change is a failure of the engine). */
  sampleRate: number;
}

export interface SynthesisRequest {
  /** One sentence (at most a few hundred characters: see src/voice/sentences.ts). */
  text: string;
  /** Passed to the engine as is (the embedded one knows six; a provider checks its own). */
  voice: string;
  /** Aborted at a barge-in or when the reply is cut: the stream ends by throwing the abort reason. */
  signal: AbortSignal;
  /**
   * The embedded engine refuses (EngineBusyError: an `overloaded` turn) a sentence it cannot start
   * within this many ms, rather than answer late; providers' calls do not queue there and ignore it.
   */
  maxWaitMs?: number;
}

/**
 * Speech synthesis: a sentence in a voice → its audio, streamed. The conversation pulls the stream
 * only as fast as the device plays it (back-pressure: at most a few seconds ahead), so an
 * implementation must not read ahead without bound: a provider reads its HTTP body as it is pulled.
 */
export interface SpeechPort {
  readonly engine: EngineId;
  /**
   * The sentence's audio, in order; ends when the sentence is spoken. Throws from the iteration on
   * a failure (an error status, a stall, a wrong format) and on abort.
   */
  synthesize(request: SynthesisRequest): AsyncIterable<SpeechChunk>;
}

export interface TurnTranscriptionOptions {
  /** BCP-47 (the agent's `language`), when the agent names one. */
  language?: string;
  /** Aborted when the turn is abandoned (barge-in, the connection's end): every request in flight ends. */
  signal: AbortSignal;
  /** The embedded engine refuses (EngineBusyError: an `overloaded` turn) a final recognition it cannot start within this many ms. */
  maxWaitMs?: number;
  /**
   * The text recognised so far (the whole of it, not the new words), from engines that stream
   * partial text; called as often as the engine likes. The conversation sends only what extends
   * what it already sent.
   */
  partial: (textSoFar: string) => void;
}

/**
 * One turn's recognition: the turn's audio goes in as it is heard, and the final text comes out at
 * the end of the turn. Between the two, the engine may recognise speculatively (at `pause()`), so
 * that the final text is usually under way when the turn ends.
 */
export interface TurnTranscription {
  /** 16 kHz (RECOGNITION_RATE) mono audio of the turn, in order, from just before speech began. */
  push(pcm: Int16Array): void;
  /**
   * The user went quiet (a likely end of turn, before the detector's silence confirms it): the
   * engine may start recognising everything pushed so far. Audio pushed after a pause that is not
   * silence makes that recognition stale: the engine aborts it and may start again at the next pause.
   */
  pause(): void;
  /**
   * The text of everything pushed so far (trimmed), recognised now or reused from a recognition
   * that covers it: the words at a pause (voice.md §7's end of turn and preemptive reply), or of
   * speech over a reply (is it a barge-in?). With `sure`, only words the engine is sure of: ""
   * when it is not (the embedded recogniser judges by its model's probability of the words, which
   * hears words in half a hum; a provider's text is taken as it comes). Rejects when the turn was
   * abandoned or the engine failed.
   */
  soFar(o?: { sure?: boolean }): Promise<string>;
  /** The final text of everything pushed (trimmed; "" when nothing was said). Called once. */
  finish(): Promise<string>;
}

/** Speech recognition: a turn's audio → its text. */
export interface TranscriptionPort {
  readonly engine: EngineId;
  /**
   * The languages (BCP-47 primary subtags, e.g. `en`) it can hear, or `"any"` when it is the
   * provider's to say (an agent's `language` outside the list is a start-up error).
   */
  readonly languages: readonly string[] | "any";
  /** Whether it calls `partial` while the user speaks. */
  readonly streamsPartials: boolean;
  /** A recognition for one turn. */
  open(o: TurnTranscriptionOptions): TurnTranscription;
}

/**
 * Seconds from the first sample given to the detector. `start` and `end`: speech (voice.md §2's
 * `min_speech_ms`, its silence); with `onsets`, also `onset`, the first frame of voice activity that
 * may become speech, and `noise`, that activity ended before it was speech.
 */
export type VadEvent =
  | { type: "start"; at: number }
  | { type: "end"; start: number; at: number }
  | { type: "onset"; at: number }
  | { type: "noise"; at: number };

/** Voice activity of one conversation's uplink (always embedded: Silero). */
export interface VoiceActivity {
  /** 16 kHz mono; calls must not overlap. */
  push(pcm: Int16Array): Promise<VadEvent[]>;
  /** Ends speech still going on (at the last audio pushed). */
  flush(): VadEvent[];
}

export interface VoiceActivityPort {
  create(o: { minSpeechMs: number; minSilenceMs: number; onsets?: boolean }): VoiceActivity;
}

/** The engines one agent's conversations use. */
export interface VoiceEngines {
  transcription: TranscriptionPort;
  speech: SpeechPort;
}
