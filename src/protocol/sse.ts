/**
 * Server-sent events at the edges: the one encoder (`data: <json>` events, as the Compatible API
 * sends them, or named ones, `event: <name>`, as Side Control's), written by the one stream writer
 * (`src/http/stream.ts`), and the one reader (the `eventsource-parser` library).
 */
import { createParser, type EventSourceMessage } from "eventsource-parser";

export const DONE_EVENT = Buffer.from("data: [DONE]\n\n");

/** One event (named `event`, when given) of `value` as JSON. */
export function sseEvent(value: unknown, event?: string): Buffer {
  return Buffer.from(sseText(value, event));
}

/** One event as text, for joining several before they become bytes once. */
export function sseText(value: unknown, event?: string): string {
  return event === undefined ? `data: ${JSON.stringify(value)}\n\n` : `event: ${event}\ndata: ${JSON.stringify(value)}\n\n`;
}

/** A comment line: keeps a quiet stream's connection from being taken for idle. */
export const SSE_KEEP_ALIVE = Buffer.from(": keep-alive\n\n");

/** The events of `text`, read whole: an event not ended by a blank line is read as if it were. */
export function readSse(text: string): EventSourceMessage[] {
  const out: EventSourceMessage[] = [];
  const parser = createParser({ onEvent: (e) => out.push(e) });
  parser.feed(text);
  parser.reset({ consume: true });
  return out;
}

/** A reader fed a stream of text piece by piece: `onEvent` sees each event once it is whole. */
export function sseReader(onEvent: (event: EventSourceMessage) => void): { feed(text: string): void } {
  return createParser({ onEvent });
}
