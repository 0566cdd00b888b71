import type { Context, Hono } from "hono";
import { z } from "zod";
import { callerKey, usageWho } from "../../ai/caller.ts";
import type { Catalog } from "../../ai/catalog.ts";
import type { RawAnswer } from "../../ai/providers/openai.ts";
import { type ChatRouter, embeddedFallback } from "../../ai/router.ts";
import { MAX_BYTES_PER_SECOND, SPEECH_CONTENT_TYPES, type SpeechEngine } from "../../ai/speech/index.ts";
import type { Admission, UsageMeter } from "../../domain/usage-meter.ts";
import { sseEvent } from "../../protocol/sse.ts";
import type { Metrics } from "../metrics.ts";
import { asIs, EVENT_STREAM, type StreamEnd, startingWith, streamed } from "../stream.ts";
import { speechModel } from "./audio-models.ts";
import { type CompatEnv, callerOf } from "./env.ts";
import { invalidParameter, OpenAIError, sseErrorEvent, toOpenAIError } from "./errors.ts";
import { clientGone, type JsonBodies } from "./json.ts";
import { readAhead } from "./read-ahead.ts";

const ROUTE = "/audio/speech";
/**
 * Audio produced ahead of a client, in seconds: beyond it (and what the pipes and sockets hold)
 * synthesis waits for the client, so that one that stops reading stops costing CPU. A request
 * holds no engine slot between its sentences, so a slow reader delays nobody else.
 */
export const READ_AHEAD_SECONDS = 10;

export const SpeechRequest = z.strictObject({
  model: z.string().min(1),
  input: z.string().min(1).max(4096),
  voice: z.string().min(1),
  response_format: z.enum(["mp3", "opus", "aac", "flac", "wav", "pcm"]).default("mp3"),
  speed: z.number().min(0.25).max(4).default(1),
  stream_format: z.enum(["audio", "sse"]).default("audio"),
  instructions: z.string().optional(),
});

/** `POST /audio/speech`: validated here; the embedded engine's audio, or an upstream model's, streamed as it is produced. */
export function registerSpeechRoute(
  app: Hono<CompatEnv>,
  catalog: Catalog,
  engine: SpeechEngine | undefined,
  router: ChatRouter,
  metrics: Metrics,
  bodies: JsonBodies,
  usage: UsageMeter,
  maxQueueWaitMs?: number,
): void {
  app.post(ROUTE, async (c) => {
    const started = performance.now();
    const parsed = SpeechRequest.safeParse(await bodies.readOf(c));
    if (!parsed.success) throw invalidParameter(parsed.error);
    const r = parsed.data;
    const entry = speechModel(catalog, callerOf(c), r.model);
    const model = entry.id;
    const signal = clientGone(c);
    // A usage limit reached refuses the request (usage.md §2); the characters count once it is answered.
    const admitted = usage.admit(usageWho(callerOf(c)), model);
    const admission = admitted instanceof Promise ? await admitted : admitted;
    const observe = (status: number, error?: string) => metrics.observeAi(ROUTE, model, status, (performance.now() - started) / 1000, error);
    const done = (status: number, error?: string) => {
      settle(admission, status, { speech_chars: r.input.length });
      observe(status, error);
    };
    try {
      return await speak();
    } catch (err) {
      admission.abandon();
      throw err;
    }
    async function speak(): Promise<Response> {
      if (entry.model) {
        const upstream = entry.model;
        let answer: RawAnswer | undefined;
        try {
          answer = await router.relay(upstream, ROUTE, (name) => ({ body: JSON.stringify({ ...r, model: name }), contentType: "application/json" }), signal);
        } catch (err) {
          // The embedded engine closing the model's fallbacks answers when every provider failed.
          if (!engine || !embeddedFallback(upstream, err)) {
            const e = toOpenAIError(err);
            done(e.status, e.type);
            throw e;
          }
        }
        if (answer) return relayed(c, answer, done);
      }
      if (!engine) throw new OpenAIError(503, "No speech engine is available on this server.", { code: "engine_unavailable" });
      if (r.instructions !== undefined) {
        throw new OpenAIError(400, `model \`${model}\` does not take instructions`, { param: "instructions", code: "unsupported_parameter" });
      }
      if (!engine.voices.includes(r.voice)) {
        throw new OpenAIError(400, `Unknown voice \`${r.voice}\`; this model has ${engine.voices.join(", ")}.`, { param: "voice", code: "invalid_value" });
      }
      let it: AsyncIterator<Uint8Array>;
      try {
        const synthesis = engine
          .synthesize({
            text: r.input,
            voice: r.voice,
            format: r.response_format,
            speed: r.speed,
            signal,
            caller: callerKey(callerOf(c)),
            ...(maxQueueWaitMs !== undefined ? { maxWaitMs: maxQueueWaitMs } : {}),
          })
          [Symbol.asyncIterator]();
        // The first piece is awaited before answering, so that an overloaded engine is still a 429.
        const first = await synthesis.next();
        // Then a few seconds of audio are read ahead of the client (see READ_AHEAD_SECONDS).
        it = startingWith(first, readAhead(synthesis, READ_AHEAD_SECONDS * MAX_BYTES_PER_SECOND[r.response_format]));
      } catch (err) {
        const e = toOpenAIError(err);
        done(e.status, e.type);
        throw e;
      }
      if (r.stream_format === "audio") return streamed(c, SPEECH_CONTENT_TYPES[r.response_format], it, { encode: asIs, done });
      const input = Math.ceil(r.input.length / 4);
      return streamed(c, EVENT_STREAM, it, {
        failed: sseErrorEvent,
        encode: (audio) => sseEvent({ type: "speech.audio.delta", audio: Buffer.from(audio).toString("base64") }),
        last: () => sseEvent({ type: "speech.audio.done", usage: { input_tokens: input, output_tokens: 0, total_tokens: input } }),
        done,
      });
    }
  });
}

/** A speech or transcription request's end: answered (its counts added) when its answer was a 200, else not counted. */
export function settle(admission: Admission, status: number, counts: Parameters<Admission["add"]>[0]): void {
  if (status === 200) {
    admission.add(counts);
    admission.answered();
  } else admission.abandon();
}

/** A provider's relayed answer, pulled as the client reads; one that breaks off is aborted. */
export function relayed(c: Context, answer: RawAnswer, done: StreamEnd): Response {
  return streamed(c, answer.contentType, answer.body[Symbol.asyncIterator](), { encode: asIs, done });
}
