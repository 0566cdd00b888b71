/**
 * The OpenAI Realtime API as Perch speaks it (voice.md §6): GA event names only, the client events
 * Perch sends built in one place (the server events it reads: ./events.ts).
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

/** The WebSocket URL of a provider's realtime endpoint for a model. */
export function realtimeUrl(baseUrl: string, upstreamModel: string): string {
  const url = new URL(`${baseUrl.replace(/\/+$/, "")}/realtime`);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  url.searchParams.set("model", upstreamModel);
  return url.toString();
}
