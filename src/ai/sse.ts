/** The one server-sent event writer of the Compatible API (chat chunks, speech and transcription events), as bytes. */

export const DONE_EVENT = Buffer.from("data: [DONE]\n\n");

export function sseEvent(value: unknown): Buffer {
  return Buffer.from(`data: ${JSON.stringify(value)}\n\n`);
}

/** The `data:` payloads of the whole events in `block`: parsed JSON, or the string `[DONE]`. */
export function parseEvents(block: Uint8Array): unknown[] {
  const out: unknown[] = [];
  for (const line of Buffer.from(block.buffer, block.byteOffset, block.byteLength).toString("utf8").split("\n")) {
    if (!line.startsWith("data:")) continue;
    const data = line.slice(5).trim();
    if (data === "[DONE]") out.push("[DONE]");
    else if (data) {
      try {
        out.push(JSON.parse(data));
      } catch {
        // Not JSON: nothing to take from it.
      }
    }
  }
  return out;
}
