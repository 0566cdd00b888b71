import { EventEmitter, on } from "node:events";
import { EMBEDDED_TRANSCRIPTION_MODEL } from "../config/config.ts";
import type { CatalogEntry } from "./catalog.ts";
import { GenerationError } from "./errors.ts";
import { encodeForm } from "./multipart.ts";
import type { RawAnswer } from "./providers/openai.ts";
import { type ChatRouter, embeddedFallback } from "./router.ts";
import { DEFAULT_MAX_AUDIO_SECONDS, type Transcript, type TranscriptionEngine } from "./speech/index.ts";

const PATH = "/audio/transcriptions";

/** A transcription as asked for, its form already validated (field names as OpenAI's form has them). */
export interface TranscriptionRequest {
  /** The form as it came: relayed to an upstream model with only `model` replaced. */
  form: FormData;
  file: File;
  language?: string | undefined;
  prompt?: string | undefined;
  words: boolean;
  stream: boolean;
}

/** Events of a streamed transcription (`stream=true`), as OpenAI sends them. */
export type TranscriptEvent = { type: "transcript.text.delta"; delta: string } | { type: "transcript.text.done"; text: string };

export type TranscriptionOutcome =
  | { kind: "relayed"; answer: RawAnswer }
  | { kind: "transcript"; transcript: Transcript }
  /** Recognition is under way: the audio was decoded (a failure before it was thrown instead). */
  | { kind: "events"; events: AsyncIterator<TranscriptEvent> };

/** The containers the contract accepts; what the content says wins, then the part's type, then the file name. */
const EXTENSIONS = new Set(["flac", "mp3", "mp4", "mpeg", "mpga", "m4a", "ogg", "oga", "opus", "wav", "webm"]);
const MEDIA_TYPES = /^(audio|video)\/(flac|x-flac|mpeg|mp3|mp4|x-m4a|m4a|ogg|opus|wav|x-wav|wave|vnd\.wave|webm)$/;

function knownContainer(b: Uint8Array): boolean {
  const ascii = (at: number, s: string) => Buffer.from(b.subarray(at, at + s.length)).toString("latin1") === s;
  return (
    ascii(0, "fLaC") ||
    ascii(0, "OggS") ||
    (ascii(0, "RIFF") && ascii(8, "WAVE")) ||
    ascii(4, "ftyp") ||
    ascii(0, "ID3") ||
    (b[0] === 0xff && ((b[1] ?? 0) & 0xe0) === 0xe0) ||
    (b[0] === 0x1a && b[1] === 0x45 && b[2] === 0xdf && b[3] === 0xa3)
  );
}

function acceptedFile(file: File, bytes: Uint8Array): boolean {
  if (knownContainer(bytes)) return true;
  if (MEDIA_TYPES.test(file.type.split(";")[0]!.trim().toLowerCase())) return true;
  return EXTENSIONS.has(file.name.split(".").pop()?.toLowerCase() ?? "");
}

const invalid = (param: string, message: string, code = "invalid_value") => new GenerationError("invalid", message, { param, code });

/** Speech to text on a catalog's transcription model: the embedded recogniser, or an upstream model's answer relayed. */
export class TranscriptionService {
  private readonly engine: TranscriptionEngine | undefined;
  private readonly router: ChatRouter;
  private readonly maxAudioSeconds: number;
  private readonly maxQueueWaitMs: number | undefined;

  constructor(o: { engine: TranscriptionEngine | undefined; router: ChatRouter; maxAudioSeconds?: number | undefined; maxQueueWaitMs?: number | undefined }) {
    this.engine = o.engine;
    this.router = o.router;
    this.maxAudioSeconds = o.maxAudioSeconds ?? DEFAULT_MAX_AUDIO_SECONDS;
    this.maxQueueWaitMs = o.maxQueueWaitMs;
  }

  /** `caller` shares the embedded recogniser fairly among callers (callerKey). */
  async transcribe(
    entry: Extract<CatalogEntry, { kind: "transcription" }>,
    r: TranscriptionRequest,
    signal: AbortSignal,
    caller?: string,
  ): Promise<TranscriptionOutcome> {
    const audio = new Uint8Array(await r.file.arrayBuffer());
    if (audio.length === 0) throw invalid("file", "the audio file is empty");
    if (!acceptedFile(r.file, audio))
      throw invalid("file", "Unsupported file format: send flac, mp3, mp4, mpeg, mpga, m4a, ogg, opus, wav or webm.", "unsupported_format");
    const engine = this.engine;
    if (entry.model) {
      try {
        return { kind: "relayed", answer: await this.router.relay(entry.model, PATH, (name) => withModel(r.form, name), signal) };
      } catch (err) {
        // The embedded recogniser closing the model's fallbacks answers when every provider failed, if it can serve the request.
        if (!engine || !embeddedFallback(entry.model, err) || refusal(engine, r, EMBEDDED_TRANSCRIPTION_MODEL)) throw err;
      }
    } else {
      // The catalog offers the embedded model only when its engine exists.
      if (!engine) throw new GenerationError("unavailable", "No transcription engine is available on this server.", { code: "engine_unavailable" });
      const refused = refusal(engine, r, entry.id);
      if (refused) throw refused;
    }
    const options = {
      audio,
      language: r.language,
      prompt: r.prompt,
      maxSeconds: this.maxAudioSeconds,
      signal,
      ...(caller !== undefined ? { caller } : {}),
      ...(this.maxQueueWaitMs !== undefined ? { maxWaitMs: this.maxQueueWaitMs } : {}),
    };
    if (!r.stream) return { kind: "transcript", transcript: await engine.transcribe(options) };
    return { kind: "events", events: await recognitionEvents(engine, options) };
  }
}

/** Why the engine cannot take the request (a language it lacks, word timings it has not), or undefined when it can. */
function refusal(engine: TranscriptionEngine, r: TranscriptionRequest, id: string): GenerationError | undefined {
  if (r.language !== undefined && !engine.languages.includes(r.language)) {
    return invalid("language", `language \`${r.language}\` is not supported by ${id}; supported: ${engine.languages.join(", ")}`, "unsupported_language");
  }
  if (r.words && engine.wordTimestamps !== true) return invalid("timestamp_granularities[]", `${id} has no word timestamps`);
  return undefined;
}

/** The form with the upstream model's name, encoded by Node's own `FormData` (its boundary in the content type). */
function withModel(form: FormData, name: string): Promise<{ body: Buffer; contentType: string }> {
  const upstream = new FormData();
  for (const [key, value] of form) if (key !== "model") upstream.append(key, value);
  upstream.set("model", name);
  return encodeForm(upstream);
}

/**
 * The recogniser's segments as events, pulled by the response. Resolves once the audio is decoded;
 * a failure before that (busy, undecodable, too long) rejects instead, so it is an HTTP error, and
 * a later one is thrown from the events.
 */
async function recognitionEvents(
  engine: TranscriptionEngine,
  options: Parameters<TranscriptionEngine["transcribe"]>[0],
): Promise<AsyncIterator<TranscriptEvent>> {
  const emitter = new EventEmitter();
  // Events are buffered until the response pulls them; "end" ends the iteration, "error" throws from it.
  const events = on(emitter, "event", { close: ["end"] });
  let first = true;
  let decoded!: () => void;
  const started = new Promise<void>((resolve) => (decoded = resolve));
  const work = engine.transcribe(options, {
    onStart: () => decoded(),
    onSegment: (s) => {
      emitter.emit("event", { type: "transcript.text.delta", delta: first ? s.text : ` ${s.text}` });
      first = false;
    },
  });
  work.then(
    (t) => {
      emitter.emit("event", { type: "transcript.text.done", text: t.text });
      emitter.emit("end");
    },
    (err: unknown) => emitter.emit("error", err),
  );
  await Promise.race([started, work]);
  return {
    next: async () => {
      const r = await events.next();
      return r.done ? r : { done: false, value: (r.value as [TranscriptEvent])[0] };
    },
    return: async () => {
      await events.return?.();
      return { done: true, value: undefined };
    },
  };
}
