/** The engine's queue is full; the surface answers 429. */
export class EngineBusyError extends Error {
  constructor(message = "the speech engine is busy; try again shortly") {
    super(message);
    this.name = "EngineBusyError";
  }
}

/** The input is not audio ffmpeg can decode (corrupt, truncated, or holding no audio stream). */
export class AudioDecodeError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "AudioDecodeError";
  }
}

/** A language the engine cannot recognise. */
export class UnsupportedLanguageError extends Error {
  readonly language: string;

  constructor(language: string, supported: readonly string[]) {
    super(`language ${JSON.stringify(language)} is not supported; supported: ${supported.join(", ")}`);
    this.name = "UnsupportedLanguageError";
    this.language = language;
  }
}

/** The reason an aborted signal carries, or a standard AbortError when it carries none. */
export function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("This operation was aborted", "AbortError");
}
