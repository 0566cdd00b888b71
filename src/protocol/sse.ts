/**
 * Server-sent events at the edges: the one writer (`data: <json>` events, as the Compatible API
 * sends them) and the one reader (the `eventsource-parser` library).
 */
import { createParser, type EventSourceMessage } from "eventsource-parser";

export const DONE_EVENT = Buffer.from("data: [DONE]\n\n");

export function sseEvent(value: unknown): Buffer {
  return Buffer.from(sseText(value));
}

/** One event as text, for joining several before they become bytes once. */
export function sseText(value: unknown): string {
  return `data: ${JSON.stringify(value)}\n\n`;
}

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
