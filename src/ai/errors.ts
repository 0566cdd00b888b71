import { type ErrorKind, PerchError } from "../errors.ts";

export type { ErrorKind } from "../errors.ts";

/** Why a generation failed (chat, speech, transcription): a `PerchError` with OpenAI-style lower-case codes. */
export class GenerationError extends PerchError {
  constructor(
    kind: ErrorKind,
    message: string,
    o: { param?: string | null; code?: string | null; status?: number; retryAfter?: number; cause?: unknown } = {},
  ) {
    const { status, ...rest } = o;
    super(kind, message, { ...rest, ...(status !== undefined ? { upstreamStatus: status } : {}) });
  }
}
