/**
 * The embedded engines' failures, as kinds of GenerationError: each surface maps every kind in
 * one place (the Compatible API's `toOpenAIError`), never engine by engine.
 */
import { GenerationError } from "../errors.ts";

/** The engine's queue is full (or cannot start the work in time): `rate_limited` (429 with Retry-After on the Compatible API). */
export class EngineBusyError extends GenerationError {
  constructor(message = "The speech engine is busy; try again shortly.", retryAfter = 1) {
    super("rate_limited", message, { code: "engine_busy", retryAfter });
    this.name = "EngineBusyError";
  }
}

/** The upload is not audio we can decode (corrupt, truncated, in no accepted container, or holding no audio stream). */
export class AudioDecodeError extends GenerationError {
  /** What is wrong with the file, without the sentence around it. */
  readonly reason: string;

  constructor(reason: string, o: { message?: string; code?: string } = {}) {
    super("invalid", o.message ?? `The audio file could not be decoded: ${reason}`, { param: "file", code: o.code ?? "invalid_audio" });
    this.name = "AudioDecodeError";
    this.reason = reason;
  }
}

/** The decoded audio is longer than the server's limit (a 400 naming the limit). */
export class AudioTooLongError extends AudioDecodeError {
  readonly maxSeconds: number;

  constructor(maxSeconds: number) {
    super(`the audio is longer than the limit of ${maxSeconds} seconds`, {
      message: `The audio is longer than this server's limit of ${maxSeconds} seconds.`,
      code: "audio_too_long",
    });
    this.name = "AudioTooLongError";
    this.maxSeconds = maxSeconds;
  }
}

/** A language the engine cannot recognise. */
export class UnsupportedLanguageError extends GenerationError {
  readonly language: string;

  constructor(language: string, supported: readonly string[]) {
    super("invalid", `language ${JSON.stringify(language)} is not supported; supported: ${supported.join(", ")}`, {
      param: "language",
      code: "unsupported_language",
    });
    this.name = "UnsupportedLanguageError";
    this.language = language;
  }
}

/** The reason an aborted signal carries, or a standard AbortError when it carries none. */
export function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("This operation was aborted", "AbortError");
}

/** An embedded engine could not load its model: 503 naming the engine, tried again after `retryAfter` seconds. */
export class EngineLoadError extends GenerationError {
  readonly engine: string;
  constructor(engine: string, model: string, cause: unknown, retryInMs: number) {
    const reason = cause instanceof Error ? cause.message : String(cause);
    const retryAfter = Math.max(1, Math.ceil(retryInMs / 1000));
    super("unavailable", `The embedded ${engine} engine (${model}) could not load its model: ${reason}. It is tried again in ${retryAfter} s.`, {
      code: "engine_unavailable",
      retryAfter,
      cause,
    });
    this.name = "EngineLoadError";
    this.engine = engine;
  }
}
