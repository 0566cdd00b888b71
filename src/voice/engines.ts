/**
 * The engines a conversation uses, as it uses them: the process's shared recogniser (voice
 * activity and incremental recognition, 16 kHz) and speech synthesiser. Each queues its work
 * with bounds of its own; a conversation never holds more than one job of each kind at a time.
 */

/** Seconds from the first sample pushed to the detector. */
export type VadEvent = { type: "start"; at: number } | { type: "end"; start: number; at: number };

export interface LiveVad {
  /** 16 kHz mono; calls must not overlap. */
  push(pcm: Int16Array): Promise<VadEvent[]>;
  /** Ends speech still going on. */
  flush(): VadEvent[];
}

export interface LiveRecogniser {
  push(pcm: Int16Array): void;
  /** The text so far (recognised again only when enough new audio arrived). */
  partial(): Promise<string>;
  /** The same at a pause (likely the final text): ahead of other work, as a final transcript. */
  speculate(): Promise<string>;
  /** The final text of everything pushed; throws EngineBusyError when it cannot start within `maxWaitMs`. */
  finish(o?: { maxWaitMs?: number }): Promise<string>;
}

export interface Recognition {
  createVad(o: { minSpeechMs: number; minSilenceMs: number }): LiveVad;
  createIncrementalRecogniser(): LiveRecogniser;
}

export interface Speaker {
  readonly voices: readonly string[];
  /** 16-bit mono samples of one sentence, ahead of other work; throws EngineBusyError when it cannot start within `maxWaitMs`. */
  speak(text: string, voice: string, signal?: AbortSignal, o?: { maxWaitMs?: number }): Promise<{ samples: Int16Array; sampleRate: number }>;
}

/** The rate the recogniser hears. */
export const ENGINE_RATE = 16_000;

/** The process's engines as a conversation needs them, or why they cannot serve one. */
export function voiceEngines(speech: unknown, transcription: unknown): { recognition: Recognition; speaker: Speaker } | string {
  const s = speech as Partial<Speaker> | undefined;
  const t = transcription as Partial<Recognition> | undefined;
  if (typeof s?.speak !== "function" || !Array.isArray(s.voices))
    return "the speech engine cannot give raw samples (voice conversations need the embedded one)";
  if (typeof t?.createVad !== "function" || typeof t.createIncrementalRecogniser !== "function") {
    return "the transcription engine has no live recognition (voice conversations need the embedded recogniser)";
  }
  return { recognition: t as Recognition, speaker: s as Speaker };
}
