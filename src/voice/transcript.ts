import type { VoiceEvent } from "./peer-events.ts";
import type { AudioPort } from "./port.ts";

/** One finished part of a conversation, as the voice events tell it. */
export type TranscriptEntry =
  | { turn: number; role: "user"; text: string }
  | { turn: number; role: "assistant"; text: string; interrupted?: true }
  | { turn: number; role: "tool"; text: string; tool: { name: string; is_error: boolean } };

/**
 * The conversation's transcript, read from the voice events it sends (voice.md §3, tools.md §2), as
 * objects before the transport encodes them, and nothing else, so that the conversation's internals can change freely: the final user
 * transcript (`TEXT_DONE user.transcript`), the reply (`TEXT_DONE assistant.text`: what was
 * spoken, interrupted when the turn's `turn.metrics` or its audio's end says so) and each tool
 * call (`tool.result`). Returns the port the conversation should use, and a `close` that hands on
 * a reply still waiting for its turn's end (the connection closed during it: interrupted).
 */
export function observeTranscript(port: AudioPort, entry: (e: TranscriptEntry) => void): { port: AudioPort; close(): void } {
  const reading = new TranscriptReader(entry);
  const observed: AudioPort = {
    publicKey: port.publicKey,
    payloadType: port.payloadType,
    audioLevelId: port.audioLevelId,
    onPacket: (cb) => port.onPacket(cb),
    sendFrame: (opus, first) => port.sendFrame(opus, first),
    sendEvent: (event) => {
      const sent = port.sendEvent(event);
      // The device may have no event stream open: its controllers hear the conversation all the same.
      reading.event(event);
      return sent;
    },
  };
  return { port: observed, close: () => reading.close() };
}

class TranscriptReader {
  private readonly entry: (e: TranscriptEntry) => void;
  /** Replies told (`assistant.text` done) whose turn has not ended yet, by turn. */
  private readonly replies = new Map<number, { text: string; interrupted: boolean }>();

  constructor(entry: (e: TranscriptEntry) => void) {
    this.entry = entry;
  }

  event(e: VoiceEvent): void {
    if (e.type === "eos") {
      const reply = this.replies.get(turnOf(e.streamId, "out-"));
      if (reply && e.label === "assistant.audio" && e.error?.code === "interrupted") reply.interrupted = true;
      return;
    }
    if (e.type !== "done") return;
    const { streamId, label, text } = e;
    if (label === "user.transcript") {
      const turn = turnOf(streamId, "in-");
      if (turn > 0 && text.trim()) this.entry({ turn, role: "user", text });
      return;
    }
    const turn = turnOf(streamId, "out-");
    if (turn <= 0) return;
    if (label === "assistant.text") this.replies.set(turn, { text, interrupted: false });
    else if (label === "turn.metrics") this.endTurn(turn, metricsSayInterrupted(text));
    else if (label === "tool.result") {
      const r = parseObject(text);
      if (r && typeof r.name === "string") {
        this.entry({ turn, role: "tool", text: typeof r.text === "string" ? r.text : "", tool: { name: r.name, is_error: r.is_error === true } });
      }
    }
  }

  close(): void {
    for (const turn of [...this.replies.keys()]) this.endTurn(turn, true);
  }

  private endTurn(turn: number, interrupted: boolean): void {
    const reply = this.replies.get(turn);
    if (!reply) return;
    this.replies.delete(turn);
    if (!reply.text) return;
    this.entry(
      reply.interrupted || interrupted ? { turn, role: "assistant", text: reply.text, interrupted: true } : { turn, role: "assistant", text: reply.text },
    );
  }
}

/** n of a stream id `<prefix>n`; 0 when it is not one. */
function turnOf(streamId: string, prefix: string): number {
  if (!streamId.startsWith(prefix)) return 0;
  const n = Number(streamId.slice(prefix.length));
  return Number.isSafeInteger(n) && n > 0 ? n : 0;
}

function metricsSayInterrupted(text: string): boolean {
  return parseObject(text)?.interrupted === true;
}

function parseObject(text: string): Record<string, unknown> | undefined {
  try {
    const v = JSON.parse(text) as unknown;
    return typeof v === "object" && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}
