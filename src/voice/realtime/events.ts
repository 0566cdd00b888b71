/**
 * The server events of the OpenAI Realtime API that Perch reads (voice.md §6, GA names), as one
 * zod discriminated union: the only place their shape is written. A provider is untrusted: a
 * field of the wrong type reads as absent (each field `.catch`es), an event of another type is
 * no event, so that what the session handles is always typed and never throws on what came.
 */
import { z } from "zod";

/** A string field: absent when missing or of another type. */
const text = z.string().optional().catch(undefined);
/** A count or a time: absent unless a finite number. */
const number = z.number().finite().optional().catch(undefined);
/** A nested object read only for some fields: absent when it is not an object. */
const part = <T extends z.ZodRawShape>(shape: T) => z.object(shape).optional().catch(undefined);

const event = <T extends string, S extends z.ZodRawShape>(type: T, shape: S) => z.object({ type: z.literal(type), ...shape });

export const RealtimeServerEvent = z.discriminatedUnion("type", [
  event("session.created", { session: part({ expires_at: number }) }),
  event("input_audio_buffer.speech_started", { item_id: text }),
  event("input_audio_buffer.speech_stopped", {}),
  event("input_audio_buffer.committed", { item_id: text }),
  event("conversation.item.input_audio_transcription.delta", { item_id: text, delta: text }),
  event("conversation.item.input_audio_transcription.completed", { item_id: text, transcript: text }),
  event("conversation.item.input_audio_transcription.failed", { item_id: text }),
  event("response.created", { response: part({ id: text }) }),
  event("response.output_item.added", { response_id: text, item: part({ id: text, type: text }) }),
  event("response.output_audio.delta", { response_id: text, item_id: text, delta: text }),
  event("response.output_audio_transcript.delta", { response_id: text, item_id: text, delta: text }),
  event("response.output_audio_transcript.done", { response_id: text, item_id: text, transcript: text }),
  event("response.function_call_arguments.done", { response_id: text, call_id: text, name: text, arguments: text }),
  event("response.done", {
    response: part({
      id: text,
      status: text,
      usage: part({ input_tokens: number, output_tokens: number }),
      status_details: part({ error: part({ code: text, message: text }) }),
    }),
  }),
  event("error", { error: part({ type: text, code: text, message: text, event_id: text }) }),
]);

export type RealtimeServerEvent = z.infer<typeof RealtimeServerEvent>;
export type RealtimeEventType = RealtimeServerEvent["type"];
/** The event of one type. */
export type RealtimeEventOf<T extends RealtimeEventType> = Extract<RealtimeServerEvent, { type: T }>;

/** One text frame as an event Perch reads; undefined for anything else (not JSON, not an object, a type Perch does not read). */
export function parseServerEvent(frame: string): RealtimeServerEvent | undefined {
  let value: unknown;
  try {
    value = JSON.parse(frame);
  } catch {
    return undefined;
  }
  const parsed = RealtimeServerEvent.safeParse(value);
  return parsed.success ? parsed.data : undefined;
}

/** A provider's error code and message are kept this far. */
const MAX_ERROR_CODE_CHARS = 100;
const MAX_ERROR_MESSAGE_CHARS = 500;

/** An `error` event's parts, bounded: they go to the log and to the device's event (a provider's megabyte of message must not). */
export function errorOf(e: RealtimeEventOf<"error">): { code: string; message: string; eventId: string | undefined } {
  const { error } = e;
  return {
    code: (error?.code ?? error?.type ?? "error").slice(0, MAX_ERROR_CODE_CHARS),
    message: (error?.message ?? "the model reported an error").slice(0, MAX_ERROR_MESSAGE_CHARS),
    eventId: error?.event_id,
  };
}
