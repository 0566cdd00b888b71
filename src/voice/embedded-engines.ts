import type { Heard } from "../ai/speech/moonshine.ts";
import { MoonshineEngine } from "../ai/speech/recogniser.ts";
import { FliteSpeechEngine } from "../ai/speech/speech.ts";
import {
  EMBEDDED,
  RECOGNITION_RATE,
  type SpeechChunk,
  type SpeechPort,
  type SynthesisRequest,
  type TranscriptionPort,
  type TurnTranscription,
  type TurnTranscriptionOptions,
  type VoiceActivityPort,
} from "./engine-ports.ts";
import { contentWords } from "./turn-end.ts";

/** flite speaks a whole sentence at once; it is handed on in pieces this long, so that playout pulls it as it plays. */
const PIECE_S = 0.25;
/** Partial words while speaking only in turns longer than this (a short question's final comes at once). */
const PARTIALS_AFTER_S = 3;
/**
 * Words are sure (`soFar({ sure: true })`) when Moonshine wrote them far more willingly than any
 * backchannel: their mean log-probability per token beats the best of BACKCHANNEL_TEXTS, scored by
 * the model against the same audio (teacher-forced), by at least SURE_MARGIN, and is at least
 * SURE_FLOOR. Moonshine hears words in half a hum ("mm-hmm" → "And in nature,", "Amen.", "I'm
 * here, Jim.") as surely as the starts of real requests ("Okay stop." −0.70, "Hold on." −0.50), so
 * no floor alone separates them; but it also finds "Mm-hmm." nearly as likely for a hum, and most
 * unlikely for "Stop." (docs/decisions.md, issue 50's Hearing; `npm run bench -- backchannel`).
 * Over ten voices, 400/600/800 ms into the sound and whole, a hum's words beat the likeliest
 * backchannel by −0.2 to 2.3 (92 % below 1.6), real requests' by 0.6 to 4.4 (91 % at 1.6 or more).
 * The turn logic also wants sure words heard again while the sound goes on (activity.ts).
 */
const SURE_MARGIN = 1.6;
const SURE_FLOOR = -0.9;
/** Whether words heard with `heard.logprob` are sure against the scores of BACKCHANNEL_TEXTS for the same audio. */
export function sureOf(heard: Pick<Heard, "logprob">, backchannels: readonly number[]): boolean {
  return heard.logprob >= SURE_FLOOR && heard.logprob - Math.max(...backchannels) >= SURE_MARGIN;
}

/**
 * The ways Moonshine writes a hum or a backchannel: of nineteen spellings scored, these were the
 * likeliest for 99 % of the sounds (the others never more than 0.3 likelier); each costs a row of
 * the scoring's decoder pass.
 */
export const BACKCHANNEL_TEXTS = ["Mm-hmm.", "Uh-huh.", "Mm-mm.", "M. M.", "Huh?", "Hm."];

/** The embedded synthesiser (flite) as a speech port. */
export function embeddedSpeech(engine: Pick<FliteSpeechEngine, "speak">): SpeechPort {
  return {
    engine: EMBEDDED,
    async *synthesize(r: SynthesisRequest): AsyncGenerator<SpeechChunk> {
      const { samples, sampleRate } = await engine.speak(r.text, r.voice, r.signal, r.maxWaitMs !== undefined ? { maxWaitMs: r.maxWaitMs } : {});
      const step = Math.round(PIECE_S * sampleRate);
      for (let at = 0; at < samples.length; at += step) {
        r.signal.throwIfAborted();
        yield { pcm: samples.subarray(at, at + step), sampleRate };
      }
    },
  };
}

/** Admits one partial recognition at a time in the process (a final must never wait behind many partials). */
export class PartialGate {
  private running = 0;
  private readonly max: number;

  constructor(max = 1) {
    this.max = max;
  }

  tryAcquire(): (() => void) | undefined {
    if (this.running >= this.max) return undefined;
    this.running++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.running--;
    };
  }
}

/** The embedded recogniser (Moonshine) as a transcription port; `gate` is shared by the process's conversations. */
export function embeddedTranscription(engine: Pick<MoonshineEngine, "createIncrementalRecogniser" | "languages">, gate: PartialGate): TranscriptionPort {
  return {
    engine: EMBEDDED,
    languages: engine.languages,
    streamsPartials: true,
    open: (o) => new EmbeddedTurn(engine.createIncrementalRecogniser(), gate, o),
  };
}

/** The embedded detector (Silero) as the voice activity port. */
export function embeddedVoiceActivity(engine: Pick<MoonshineEngine, "createVad">): VoiceActivityPort {
  return { create: (o) => engine.createVad(o) };
}

/**
 * One turn on the incremental recogniser: it recognises on its own after a short silence (and
 * `finish()` reuses that); a pause asks for the same at once; in long turns, partial words go out
 * while the user speaks, one recognition at a time in the process.
 */
class EmbeddedTurn implements TurnTranscription {
  private readonly recogniser: ReturnType<MoonshineEngine["createIncrementalRecogniser"]>;
  private readonly gate: PartialGate;
  private readonly o: TurnTranscriptionOptions;
  private samples = 0;
  private running = false;

  constructor(recogniser: EmbeddedTurn["recogniser"], gate: PartialGate, o: TurnTranscriptionOptions) {
    this.recogniser = recogniser;
    this.gate = gate;
    this.o = o;
  }

  push(pcm: Int16Array): void {
    this.recogniser.push(pcm);
    this.samples += pcm.length;
    if (this.samples >= PARTIALS_AFTER_S * RECOGNITION_RATE) this.partial(this.gate.tryAcquire());
  }

  pause(): void {
    // The recognition at a pause is (likely) the final transcript itself: it is not gated, and it goes ahead of other work.
    this.partial(() => {}, true);
  }

  async soFar(o: { sure?: boolean } = {}): Promise<string> {
    this.o.signal.throwIfAborted();
    const heard = await this.recogniser.heardSoFar();
    this.o.signal.throwIfAborted();
    const text = heard.text.trim();
    // Only words need the model's word for them: no words are no barge-in anyway.
    if (!o.sure || contentWords(text) === 0) return text;
    if (heard.logprob < SURE_FLOOR) return "";
    const scores = await this.recogniser.scoreHeard(heard, BACKCHANNEL_TEXTS);
    this.o.signal.throwIfAborted();
    return sureOf(heard, scores) ? text : "";
  }

  async finish(): Promise<string> {
    this.o.signal.throwIfAborted();
    const text = await this.recogniser.finish(this.o.maxWaitMs !== undefined ? { maxWaitMs: this.o.maxWaitMs } : {});
    this.o.signal.throwIfAborted();
    return text.trim();
  }

  private partial(release: (() => void) | undefined, speculative = false): void {
    if (!release) return;
    if (this.running || this.o.signal.aborted) {
      release();
      return;
    }
    this.running = true;
    (speculative ? this.recogniser.speculate() : this.recogniser.partial()).then(
      (text) => {
        release();
        this.running = false;
        if (!this.o.signal.aborted) this.o.partial(text);
      },
      () => {
        release();
        this.running = false;
      },
    );
  }
}

/** The process's engines as voice ports, for those that are the embedded ones (they alone speak raw samples and hear live audio). */
export function embeddedPorts(
  speech: unknown,
  transcription: unknown,
): { speech?: SpeechPort; transcription?: TranscriptionPort; activity?: VoiceActivityPort } {
  return {
    ...(speech instanceof FliteSpeechEngine ? { speech: embeddedSpeech(speech) } : {}),
    ...(transcription instanceof MoonshineEngine
      ? { transcription: embeddedTranscription(transcription, new PartialGate()), activity: embeddedVoiceActivity(transcription) }
      : {}),
  };
}
