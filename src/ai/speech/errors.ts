/** The engine's queue is full; the surface answers 429. */
export class EngineBusyError extends Error {
  constructor(message = "the speech engine is busy; try again shortly") {
    super(message);
    this.name = "EngineBusyError";
  }
}

/** The input is not audio we can decode (corrupt, truncated, in no accepted container, or holding no audio stream). */
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

/** The decoded audio is longer than the server's limit (a 400 naming the limit). */
export class AudioTooLongError extends AudioDecodeError {
  readonly maxSeconds: number;

  constructor(maxSeconds: number) {
    super(`the audio is longer than the limit of ${maxSeconds} seconds`);
    this.name = "AudioTooLongError";
    this.maxSeconds = maxSeconds;
  }
}
