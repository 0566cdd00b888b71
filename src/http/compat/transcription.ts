import type { Hono } from "hono";
import { z } from "zod";
import type { Catalog } from "../../ai/catalog.ts";
import { multipart } from "../../ai/multipart.ts";
import type { RawAnswer } from "../../ai/providers/openai.ts";
import { type ChatRouter, embeddedFallback } from "../../ai/router.ts";
import { DEFAULT_MAX_AUDIO_SECONDS, type Transcript, type TranscriptionEngine } from "../../ai/speech/index.ts";
import { sseEvent } from "../../ai/sse.ts";
import { EMBEDDED_TRANSCRIPTION_MODEL } from "../../config/config.ts";
import type { Metrics } from "../metrics.ts";
import { transcriptionModel } from "./audio-models.ts";
import type { CompatEnv } from "./env.ts";
import { invalidParameter, OpenAIError, toOpenAIError } from "./errors.ts";
import { clientGone, largeBodySlot } from "./json.ts";
import { byteStream } from "./speech.ts";

const ROUTE = "/audio/transcriptions";

/** OpenAI's upload limit, 25 MB. */
export const MAX_AUDIO_BYTES = 25 * 1000 * 1000;

const FORMATS = ["json", "text", "srt", "vtt", "verbose_json"] as const;
type Format = (typeof FORMATS)[number];

/** The text fields of the multipart form (the file is checked on its own). */
export const TranscriptionFields = z.strictObject({
  model: z.string().min(1, "you must provide a model parameter"),
  language: z
    .string()
    .regex(/^[a-z]{2}$/, "language must be an ISO-639-1 code such as `en`")
    .optional(),
  prompt: z.string().optional(),
  temperature: z
    .string()
    .regex(/^\d+(\.\d+)?$/, "temperature must be a number from 0 to 1")
    .refine((t) => Number(t) <= 1, "temperature must be a number from 0 to 1")
    .optional(),
  response_format: z.enum(FORMATS).default("json"),
  "timestamp_granularities[]": z.array(z.enum(["segment", "word"])).default([]),
  stream: z.enum(["true", "false"]).optional(),
});
type Fields = z.infer<typeof TranscriptionFields>;

/** The form's text fields as an object: each once (granularities as a list), files only as `file`. */
function formFields(form: FormData): Record<string, unknown> {
  const fields: Record<string, unknown> = {};
  for (const key of new Set(form.keys())) {
    if (key === "file") continue;
    const values = form.getAll(key);
    if (values.some((v) => typeof v !== "string")) throw param(key, `${key} must be a text field`);
    if (key === "timestamp_granularities[]") fields[key] = values;
    else if (values.length > 1) throw param(key, `${key} was given more than once`);
    else fields[key] = values[0];
  }
  return fields;
}

/** One renderer per response format. */
const RENDERERS: Record<Format, (t: Transcript, f: Fields) => { body: string; contentType: string }> = {
  json: (t) => ({ body: JSON.stringify({ text: t.text }), contentType: "application/json" }),
  text: (t) => ({ body: `${t.text}\n`, contentType: "text/plain; charset=UTF-8" }),
  srt: (t) => ({ body: srt(t), contentType: "text/plain; charset=UTF-8" }),
  vtt: (t) => ({ body: vtt(t), contentType: "text/vtt; charset=utf-8" }),
  verbose_json: (t, f) => {
    const body: Record<string, unknown> = {
      task: "transcribe",
      language: t.language,
      duration: t.duration,
      text: t.text,
      segments: t.segments.map((s) => ({ id: s.id, seek: 0, start: s.start, end: s.end, text: s.text })),
    };
    if (f["timestamp_granularities[]"].includes("word")) body.words = t.words ?? [];
    return { body: JSON.stringify(body), contentType: "application/json" };
  },
};

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

const param = (name: string, message: string, code = "invalid_value") => new OpenAIError(400, message, { param: name, code });

/** `POST /audio/transcriptions` on the embedded recogniser: multipart fields as the official clients send them. */
export function registerTranscriptionRoute(
  app: Hono<CompatEnv>,
  catalog: Catalog,
  engine: TranscriptionEngine | undefined,
  router: ChatRouter,
  metrics: Metrics,
  maxAudioSeconds = DEFAULT_MAX_AUDIO_SECONDS,
): void {
  app.post(ROUTE, async (c) => {
    const started = performance.now();
    const type = c.req.header("content-type") ?? "";
    if (!/^multipart\/form-data/i.test(type)) throw new OpenAIError(400, "Send the audio as multipart/form-data.", { code: "invalid_content_type" });
    // An upload over 1 MiB takes one of the caller's large-body slots (see json.ts).
    const slot = largeBodySlot(c, Number(c.req.header("content-length") ?? 0));
    let form: FormData;
    try {
      form = await c.req.formData();
      if (!(c.env as { outgoing?: unknown } | undefined)?.outgoing) slot?.();
    } catch {
      slot?.();
      throw new OpenAIError(400, "The multipart body cannot be parsed.", { code: "invalid_multipart" });
    }
    const parsed = TranscriptionFields.safeParse(formFields(form));
    if (!parsed.success) {
      const e = invalidParameter(parsed.error);
      if (e.code === "invalid_value" && e.param === "model") throw param("model", "you must provide a model parameter", "missing_required_parameter");
      // The form field's name, not the element's path in the list.
      if (e.param?.startsWith("timestamp_granularities[]")) throw param("timestamp_granularities[]", "timestamp_granularities[] takes segment and word");
      throw e;
    }
    const fields = parsed.data;
    const { model, language, prompt, stream } = fields;
    const format = fields.response_format;
    const entry = transcriptionModel(catalog, c.get("caller"), model);
    const id = entry.id;
    // The catalog offers the embedded model only when its engine exists.
    if (!entry.model && !engine) throw new OpenAIError(503, "No transcription engine is available on this server.", { code: "engine_unavailable" });
    const languages = entry.model ? undefined : engine!.languages;
    const wordTimestamps = entry.model ? true : engine!.wordTimestamps === true;

    const files = form.getAll("file");
    const file = files[0];
    if (!file || typeof file === "string" || files.length > 1) throw param("file", "attach exactly one audio file as `file`", "missing_required_parameter");
    if (file.size > MAX_AUDIO_BYTES)
      throw new OpenAIError(413, `The audio file is over ${MAX_AUDIO_BYTES} bytes (25 MB).`, { param: "file", code: "file_too_large" });
    const audio = new Uint8Array(await file.arrayBuffer());
    if (audio.length === 0) throw param("file", "the audio file is empty");
    if (!acceptedFile(file, audio))
      throw param("file", "Unsupported file format: send flac, mp3, mp4, mpeg, mpga, m4a, ogg, opus, wav or webm.", "unsupported_format");

    /** Why a model with these abilities cannot take the request (or undefined when it can). */
    const refusal = (languages: readonly string[] | undefined, wordTimestamps: boolean, id: string): OpenAIError | undefined => {
      if (language !== undefined && languages && !languages.includes(language)) {
        return param("language", `language \`${language}\` is not supported by ${id}; supported: ${languages.join(", ")}`, "unsupported_language");
      }
      if (fields["timestamp_granularities[]"].includes("word") && (format !== "verbose_json" || !wordTimestamps)) {
        return param("timestamp_granularities[]", wordTimestamps ? "word timestamps need response_format verbose_json" : `${id} has no word timestamps`);
      }
      return undefined;
    };
    const refused = refusal(languages, wordTimestamps, id);
    if (refused) throw refused;
    const signal = clientGone(c);
    const done = (status: number, error?: string) => metrics.observeAi(ROUTE, id, status, (performance.now() - started) / 1000, error);

    if (entry.model) {
      // The validated fields go on as they came, with the upstream model's name.
      const fields = [...form.entries()].filter((e): e is [string, string] => e[0] !== "model" && typeof e[1] === "string");
      const upload = { name: file.name || "audio", type: file.type || "application/octet-stream", bytes: audio };
      let answer: RawAnswer | undefined;
      try {
        answer = await router.relay(entry.model, ROUTE, (name) => multipart([["model", name], ...fields], upload), signal);
      } catch (err) {
        // The embedded recogniser closing the model's fallbacks answers when every provider failed, if it can serve the request.
        const embedded =
          engine && embeddedFallback(entry.model, err) && !refusal(engine.languages, engine.wordTimestamps === true, EMBEDDED_TRANSCRIPTION_MODEL);
        if (!embedded) {
          const e = toOpenAIError(err);
          done(e.status, e.type);
          throw e;
        }
      }
      if (answer)
        return c.body(byteStream(answer.body[Symbol.asyncIterator](), done), 200, { "content-type": answer.contentType, "transfer-encoding": "chunked" });
    }

    // Engine failures (busy, undecodable, too long, language) are kinds of GenerationError, mapped in one place.
    const failure = (err: unknown): OpenAIError => toOpenAIError(err);
    const options = {
      audio,
      ...(language !== undefined ? { language } : {}),
      ...(prompt !== undefined ? { prompt } : {}),
      maxSeconds: maxAudioSeconds,
      signal,
    };

    if (stream === "true") {
      // Events leave as segments are recognised; errors before the audio is decoded are plain HTTP
      // errors, later ones an `error` event that ends the stream.
      let controller!: ReadableStreamDefaultController<Uint8Array>;
      const body = new ReadableStream<Uint8Array>({ start: (c) => (controller = c) }, { highWaterMark: 0 });
      const send = (value: unknown) => {
        try {
          controller.enqueue(sseEvent(value));
        } catch {}
      };
      let first = true;
      let started!: () => void;
      const decoded = new Promise<void>((resolve) => (started = resolve));
      const work = engine!.transcribe(options, {
        onStart: () => started(),
        onSegment: (s) => {
          send({ type: "transcript.text.delta", delta: first ? s.text : ` ${s.text}` });
          first = false;
        },
      });
      const ending = work.then(
        (t) => {
          done(200);
          send({ type: "transcript.text.done", text: t.text });
          controller.close();
        },
        (err: unknown) => {
          const e = failure(err);
          done(e.status, e.type);
          send({ type: "error", error: { message: e.message, type: e.type, param: e.param, code: e.code } });
          controller.close();
        },
      );
      // Whichever comes first: the audio decoded (stream from here) or a failure before it (an HTTP error).
      const early = await Promise.race([
        decoded.then(() => undefined),
        work.then(
          () => undefined,
          (err: unknown) => ({ err }),
        ),
      ]);
      if (early) {
        void ending;
        const e = failure(early.err);
        throw e;
      }
      return c.body(body, 200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache" });
    }

    let transcript: Transcript;
    try {
      transcript = await engine!.transcribe(options);
    } catch (err) {
      const e = failure(err);
      done(e.status, e.type);
      throw e;
    }
    done(200);
    const rendered = RENDERERS[format](transcript, fields);
    return c.body(rendered.body, 200, { "content-type": rendered.contentType });
  });
}

function timestamp(seconds: number, separator: "," | "."): string {
  const ms = Math.max(0, Math.round(seconds * 1000));
  const pad = (n: number, w = 2) => String(n).padStart(w, "0");
  return `${pad(Math.floor(ms / 3_600_000))}:${pad(Math.floor(ms / 60_000) % 60)}:${pad(Math.floor(ms / 1000) % 60)}${separator}${pad(ms % 1000, 3)}`;
}

function srt(t: Transcript): string {
  return t.segments.map((s, i) => `${i + 1}\n${timestamp(s.start, ",")} --> ${timestamp(s.end, ",")}\n${s.text.trim()}\n`).join("\n");
}

function vtt(t: Transcript): string {
  return `WEBVTT\n\n${t.segments.map((s) => `${timestamp(s.start, ".")} --> ${timestamp(s.end, ".")}\n${s.text.trim()}\n`).join("\n")}`;
}
