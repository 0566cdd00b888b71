import { type RemoteContext, type RemoteSpeech, remoteSpeech, remoteTranscription } from "../ai/remote-speech.ts";
import { embeddedFallback } from "../ai/router.ts";
import { languageCode } from "../ai/voice-models.ts";
import { concatInt16 } from "../audio/samples.ts";
import type { ModelConfig } from "../config/config.ts";
import type { SpeechChunk, SpeechPort, SynthesisRequest, TranscriptionPort, TurnTranscription, TurnTranscriptionOptions } from "./engine-ports.ts";

/**
 * A catalog speech model on its provider as a speech port: each sentence one streamed request
 * (src/ai/remote-speech.ts), its audio handed on as it arrives. When every provider of the model's
 * list failed before any audio and the list ends with the embedded engine, that one speaks the
 * sentence. The engine id is the model's provider.
 */
export function providerSpeech(remote: RemoteContext, model: ModelConfig, embedded: SpeechPort | undefined): SpeechPort {
  return {
    engine: model.provider,
    async *synthesize(r: SynthesisRequest): AsyncGenerator<SpeechChunk> {
      let speech: RemoteSpeech;
      try {
        speech = await remoteSpeech(remote, model, r.text, r.voice, r.signal);
      } catch (err) {
        if (!embedded || r.signal.aborted || !embeddedFallback(model, err)) throw err;
        yield* embedded.synthesize(r);
        return;
      }
      for await (const pcm of speech.samples) yield { pcm, sampleRate: speech.sampleRate };
    },
  };
}

/**
 * A catalog transcription model on its provider as a transcription port: the turn's audio is kept
 * and sent whole (a 16 kHz WAV) at the first pause; speech after it aborts that request and the
 * next pause sends again; the end of the turn awaits the request under way or sends one. Partial
 * text only from models marked `stream: true`.
 */
export function providerTranscription(remote: RemoteContext, model: ModelConfig, embedded: TranscriptionPort | undefined): TranscriptionPort {
  return {
    engine: model.provider,
    languages: "any",
    streamsPartials: model.stream,
    open: (o) => new ProviderTurn(remote, model, embedded, o),
  };
}

/** Quiet (as the conversation judges a pause): below this share of the turn's loudest chunk, or below this floor (of 32767). */
const QUIET_SHARE = 0.1;
const QUIET_FLOOR = 100;

class ProviderTurn implements TurnTranscription {
  private readonly remote: RemoteContext;
  private readonly model: ModelConfig;
  private readonly embedded: TranscriptionPort | undefined;
  private readonly o: TurnTranscriptionOptions;
  private readonly audio: Int16Array[] = [];
  private peak = 0;
  /** The recognition started at the last pause, while it still covers what was said. */
  private pending: { abort: AbortController; text: Promise<string> } | undefined;
  private finished = false;

  constructor(remote: RemoteContext, model: ModelConfig, embedded: TranscriptionPort | undefined, o: TurnTranscriptionOptions) {
    this.remote = remote;
    this.model = model;
    this.embedded = embedded;
    this.o = o;
  }

  push(pcm: Int16Array): void {
    this.audio.push(pcm);
    const level = rms(pcm);
    this.peak = Math.max(this.peak, level);
    // Speech after the pause: the recognition under way misses it.
    if (this.pending && level >= Math.max(QUIET_FLOOR, this.peak * QUIET_SHARE)) {
      this.pending.abort.abort(new Error("speech resumed"));
      this.pending = undefined;
    }
  }

  pause(): void {
    if (this.pending || this.finished || this.o.signal.aborted) return;
    this.pending = this.recognise();
  }

  async soFar(): Promise<string> {
    if (this.finished) throw new Error("the turn's transcription has finished");
    // At a pause, the recognition under way; during speech, one of its own (more speech must not abort it).
    return (await (this.pending ?? this.recognise()).text).trim();
  }

  async finish(): Promise<string> {
    this.finished = true;
    const pending = this.pending ?? this.recognise();
    this.pending = undefined;
    return await pending.text;
  }

  /** One request with everything heard so far; partial text (from a streaming model) as it comes. */
  private recognise(): { abort: AbortController; text: Promise<string> } {
    const abort = new AbortController();
    const signal = AbortSignal.any([this.o.signal, abort.signal]);
    const pcm = concatInt16(this.audio.splice(0));
    this.audio.push(pcm);
    let sofar = "";
    const options = {
      ...(this.o.language ? { language: languageCode(this.o.language) } : {}),
      ...(this.model.stream
        ? {
            onDelta: (delta: string) => {
              sofar += delta;
              if (!signal.aborted) this.o.partial(sofar);
            },
          }
        : {}),
    };
    const text = remoteTranscription(this.remote, this.model, pcm, options, signal).then(
      (r) => r.text,
      (err: unknown) => {
        if (!this.embedded || signal.aborted || !embeddedFallback(this.model, err)) throw err;
        // Every provider failed and the embedded recogniser closes the list: it hears the turn.
        const turn = this.embedded.open({ ...this.o, signal });
        turn.push(pcm);
        return turn.finish();
      },
    );
    // A recognition made stale by more speech is abandoned: its failure is nobody's.
    text.catch(() => {});
    return { abort, text };
  }
}

function rms(pcm: Int16Array): number {
  let sum = 0;
  for (const x of pcm) sum += x * x;
  return Math.sqrt(sum / Math.max(1, pcm.length));
}
