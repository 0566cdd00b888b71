import type { Context, Hono } from "hono";
import { z } from "zod";
import { callerKey, usageWho } from "../../ai/caller.ts";
import type { Catalog } from "../../ai/catalog.ts";
import type { Transcript } from "../../ai/speech/index.ts";
import type { TranscriptionService } from "../../ai/transcription.ts";
import type { UsageMeter } from "../../domain/usage-meter.ts";
import { sseEvent } from "../../protocol/sse.ts";
import type { Metrics } from "../metrics.ts";
import { EVENT_STREAM, streamed } from "../stream.ts";
import { transcriptionModel } from "./audio-models.ts";
import { type CompatEnv, callerOf } from "./env.ts";
import { invalidParameter, OpenAIError, sseErrorEvent, toOpenAIError } from "./errors.ts";
import { clientGone, type JsonBodies } from "./json.ts";
import { relayed, settle } from "./speech.ts";

const ROUTE = "/audio/transcriptions";

/** OpenAI's upload limit, 25 MB. */
export const MAX_AUDIO_BYTES = 25 * 1000 * 1000;

const FORMATS = ["json", "text", "srt", "vtt", "verbose_json"] as const;
type Format = (typeof FORMATS)[number];

/** The multipart form: its text fields and its one file. */
export const TranscriptionForm = z
  .strictObject({
    model: z.string({ error: "you must provide a model parameter" }).min(1, "you must provide a model parameter"),
    file: z.instanceof(File, { error: "attach exactly one audio file as `file`" }),
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
    "timestamp_granularities[]": z.array(z.enum(["segment", "word"], { error: "timestamp_granularities[] takes segment and word" })).default([]),
    stream: z.enum(["true", "false"]).optional(),
  })
  .refine((f) => !f["timestamp_granularities[]"].includes("word") || f.response_format === "verbose_json", {
    path: ["timestamp_granularities[]"],
    message: "word timestamps need response_format verbose_json",
  });
type Form = z.infer<typeof TranscriptionForm>;

/** The form as an object: each text field once (granularities as a list), `file` only when it is one file. */
function formFields(form: FormData): Record<string, unknown> {
  const fields: Record<string, unknown> = {};
  for (const key of new Set(form.keys())) {
    const values = form.getAll(key);
    if (key === "file") {
      if (values.length === 1) fields.file = values[0];
      continue;
    }
    if (values.some((v) => typeof v !== "string")) throw param(key, `${key} must be a text field`);
    if (key === "timestamp_granularities[]") fields[key] = values;
    else if (values.length > 1) throw param(key, `${key} was given more than once`);
    else fields[key] = values[0];
  }
  return fields;
}

/** A form that fails the schema: the field named as the form names it, missing ones as OpenAI reports them. */
function formError(error: z.ZodError): OpenAIError {
  const e = invalidParameter(error);
  if (e.param === "model" || e.param === "file") return param(e.param, e.message.replace(/^Invalid value for '\w+': /, ""), "missing_required_parameter");
  if (e.param?.startsWith("timestamp_granularities[]")) return param("timestamp_granularities[]", e.message.replace(/^Invalid value for '[^']+': /, ""));
  return e;
}

/** One renderer per response format. */
const RENDERERS: Record<Format, (t: Transcript, f: Form) => { body: string; contentType: string }> = {
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

const param = (name: string, message: string, code = "invalid_value") => new OpenAIError(400, message, { param: name, code });

/** Reads the multipart body (an upload over 1 MiB takes one of the caller's large-body slots, see json.ts). */
async function readForm(c: Context<CompatEnv>, bodies: JsonBodies): Promise<FormData> {
  if (!/^multipart\/form-data/i.test(c.req.header("content-type") ?? ""))
    throw new OpenAIError(400, "Send the audio as multipart/form-data.", { code: "invalid_content_type" });
  const slot = bodies.slot(c, Number(c.req.header("content-length") ?? 0));
  try {
    const form = await c.req.formData();
    if (!(c.env as { outgoing?: unknown } | undefined)?.outgoing) slot?.();
    return form;
  } catch {
    slot?.();
    throw new OpenAIError(400, "The multipart body cannot be parsed.", { code: "invalid_multipart" });
  }
}

/** `POST /audio/transcriptions`: the form validated, the service called, the answer rendered or streamed. */
export function registerTranscriptionRoute(
  app: Hono<CompatEnv>,
  catalog: Catalog,
  service: TranscriptionService,
  metrics: Metrics,
  bodies: JsonBodies,
  usage: UsageMeter,
): void {
  app.post(ROUTE, async (c) => {
    const started = performance.now();
    const form = await readForm(c, bodies);
    const parsed = TranscriptionForm.safeParse(formFields(form));
    if (!parsed.success) throw formError(parsed.error);
    const f = parsed.data;
    const entry = transcriptionModel(catalog, callerOf(c), f.model);
    if (f.file.size > MAX_AUDIO_BYTES)
      throw new OpenAIError(413, `The audio file is over ${MAX_AUDIO_BYTES} bytes (25 MB).`, { param: "file", code: "file_too_large" });
    // A usage limit reached refuses the request (usage.md §2); the audio's seconds count once it is answered.
    const admitted = usage.admit(usageWho(callerOf(c)), entry.id);
    const admission = admitted instanceof Promise ? await admitted : admitted;
    let seconds: number | undefined;
    const done = (status: number, error?: string) => {
      settle(admission, status, { audio_ms: Math.round((seconds ?? 0) * 1000) });
      metrics.observeAi(ROUTE, entry.id, status, (performance.now() - started) / 1000, error);
    };
    try {
      seconds = await fileSeconds(f.file);
    } catch {
      seconds = 0;
    }
    const request = {
      form,
      file: f.file,
      language: f.language,
      prompt: f.prompt,
      words: f["timestamp_granularities[]"].includes("word"),
      stream: f.stream === "true",
    };
    let outcome: Awaited<ReturnType<TranscriptionService["transcribe"]>>;
    try {
      outcome = await service.transcribe(entry, request, clientGone(c), callerKey(callerOf(c)));
    } catch (err) {
      const e = toOpenAIError(err);
      done(e.status, e.type);
      throw e;
    }
    if (outcome.kind === "transcript" && outcome.transcript.duration > 0) seconds = outcome.transcript.duration;
    if (outcome.kind === "relayed") return relayed(c, outcome.answer, done);
    if (outcome.kind === "events") return streamed(c, EVENT_STREAM, outcome.events, { failed: sseErrorEvent, encode: sseEvent, done });
    done(200);
    const rendered = RENDERERS[f.response_format](outcome.transcript, f);
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

/**
 * The seconds of audio a file holds, for counting (usage.md §1) before a provider's answer says
 * nothing of it: a WAV's from its header, any other format's estimated at 128 kbit/s; the
 * embedded engine's transcript gives its decoded duration instead.
 */
async function fileSeconds(file: File): Promise<number> {
  const head = Buffer.from(await file.slice(0, 64).arrayBuffer());
  if (head.length >= 44 && head.toString("latin1", 0, 4) === "RIFF" && head.toString("latin1", 8, 12) === "WAVE") {
    const byteRate = head.readUInt32LE(28);
    if (byteRate > 0) return Math.max(0, file.size - 44) / byteRate;
  }
  return file.size / 16_000;
}
