/**
 * The OpenAI Realtime API as Perch speaks it (voice.md §6): GA event names only, the client events
 * Perch sends built in one place, and the server events it reads narrowed from untrusted JSON.
 */
import type { ChatMessage } from "../../protocol/compat.ts";

/** Both directions are 16-bit little-endian mono PCM at this rate. */
export const REALTIME_RATE = 24_000;
/** The transcription model when the agent names none. */
export const DEFAULT_INPUT_TRANSCRIPTION = "gpt-4o-mini-transcribe";

export type TurnDetection = "server_vad" | "semantic_vad" | "node";

export interface RealtimeTool {
  type: "function";
  name: string;
  description: string;
  parameters: Record<string, unknown>;
}

export interface SessionSettings {
  instructions: string;
  voice: string;
  turnDetection: TurnDetection;
  /** The model transcribing the user's speech, or false for none. */
  transcription: string | false;
  /** `voice.barge_in`: off sends `interrupt_response: false`. */
  bargeIn: boolean;
  tools: RealtimeTool[];
}

/** `session.update` as voice.md §6 writes it. */
export function sessionUpdate(s: SessionSettings, eventId: string): Record<string, unknown> {
  const format = { type: "audio/pcm", rate: REALTIME_RATE };
  const turnDetection = s.turnDetection === "node" ? null : { type: s.turnDetection, ...(s.bargeIn ? {} : { interrupt_response: false }) };
  return {
    type: "session.update",
    event_id: eventId,
    session: {
      type: "realtime",
      instructions: s.instructions,
      output_modalities: ["audio"],
      audio: {
        input: { format, transcription: s.transcription === false ? null : { model: s.transcription }, turn_detection: turnDetection },
        output: { format, voice: s.voice },
      },
      tools: s.tools,
    },
  };
}

/** The conversation so far as text items (a reopened session's history). */
export function historyItems(history: readonly ChatMessage[]): Array<Record<string, unknown>> {
  return history.flatMap((m) => {
    if (typeof m.content !== "string" || !m.content) return [];
    if (m.role === "user")
      return [{ type: "conversation.item.create", item: { type: "message", role: "user", content: [{ type: "input_text", text: m.content }] } }];
    if (m.role === "assistant")
      return [{ type: "conversation.item.create", item: { type: "message", role: "assistant", content: [{ type: "output_text", text: m.content }] } }];
    return [];
  });
}

/** A server event: its `type` and the fields Perch reads, each checked before use. */
export interface ServerEvent {
  type: string;
  raw: Record<string, unknown>;
}

/** Parses one text frame; undefined for anything that is not a JSON object with a string `type`. */
export function parseServerEvent(text: string): ServerEvent | undefined {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (typeof v !== "object" || v === null || Array.isArray(v)) return undefined;
  const raw = v as Record<string, unknown>;
  return typeof raw.type === "string" ? { type: raw.type, raw } : undefined;
}

export function str(o: Record<string, unknown> | undefined, key: string): string | undefined {
  const v = o?.[key];
  return typeof v === "string" ? v : undefined;
}

export function obj(o: Record<string, unknown> | undefined, key: string): Record<string, unknown> | undefined {
  const v = o?.[key];
  return typeof v === "object" && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
}

/** A provider's error code and message are kept this far. */
const MAX_ERROR_CODE_CHARS = 100;
const MAX_ERROR_MESSAGE_CHARS = 500;

/** An `error` event's parts (`error: {type, code, message, event_id}`). */
export function errorOf(e: ServerEvent): { code: string; message: string; eventId: string | undefined } {
  const error = obj(e.raw, "error");
  return {
    // Bounded: they go to the log and to the device's event (a provider's megabyte of message must not).
    code: (str(error, "code") ?? str(error, "type") ?? "error").slice(0, MAX_ERROR_CODE_CHARS),
    message: (str(error, "message") ?? "the model reported an error").slice(0, MAX_ERROR_MESSAGE_CHARS),
    eventId: str(error, "event_id"),
  };
}

/** The WebSocket URL of a provider's realtime endpoint for a model. */
export function realtimeUrl(baseUrl: string, upstreamModel: string): string {
  const url = new URL(`${baseUrl.replace(/\/+$/, "")}/realtime`);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  url.searchParams.set("model", upstreamModel);
  return url.toString();
}
