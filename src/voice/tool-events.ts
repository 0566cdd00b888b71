import type { ToolObserver } from "../ai/agents/toolbox.ts";
import type { VoiceEvents } from "./peer-events.ts";

/** A tool result's text on the event stream is cut here (tools.md §2). */
const MAX_RESULT_BYTES = 4096;

/** The first 4 KiB of `text`, cut on a character boundary. */
function cut(text: string): string {
  const bytes = Buffer.from(text);
  if (bytes.length <= MAX_RESULT_BYTES) return text;
  let end = MAX_RESULT_BYTES;
  while (end > 0 && (bytes[end]! & 0xc0) === 0x80) end--;
  return bytes.subarray(0, end).toString();
}

function parsed(argumentsText: string): unknown {
  // Long arguments are shown as their first 4 KiB of text, never parsed (the call is refused unparsed too when over its bound).
  if (argumentsText.length > MAX_RESULT_BYTES) return cut(argumentsText.slice(0, MAX_RESULT_BYTES));
  try {
    return argumentsText.trim() ? JSON.parse(argumentsText) : {};
  } catch {
    return argumentsText;
  }
}

/** A voice turn's tool calls as `TEXT_DONE tool.call` / `tool.result` events on its reply stream (`out-<n>`). */
export function toolEvents(events: VoiceEvents, streamId: string): ToolObserver {
  return {
    called: (name, argumentsText) => events.done(streamId, "tool.call", JSON.stringify({ name, arguments: parsed(argumentsText) })),
    finished: (name, outcome) => events.done(streamId, "tool.result", JSON.stringify({ name, is_error: outcome.isError, text: cut(outcome.text) })),
  };
}
