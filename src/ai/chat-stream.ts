import type { ChatChunk, Usage } from "../protocol/compat.ts";
import { DONE_EVENT, readSse, sseText } from "../protocol/sse.ts";

/** One event of a streamed chat completion. A failure is not an event: reading the stream throws it. */
export type ChatEvent = { type: "chunk"; chunk: ChatChunk } | { type: "done" };

/**
 * Events handed on together (one read from the provider, one step of Perch's own writing).
 * `raw`: the server-sent event bytes exactly these events arrived as, when a pass-through provider
 * relayed them; the Compatible API sends those as they are instead of encoding `events` again.
 */
export interface ChatPiece {
  readonly events: readonly ChatEvent[];
  readonly raw?: Uint8Array;
}

/** Filled in as the stream passes: the usage chunk, when the provider sends one. */
export interface ChatStats {
  usage?: Usage;
  /** Characters of reply text seen (for an estimate of the tokens when the provider reports no usage). */
  outputChars?: number;
}

/**
 * A chat stream that has started (its first event arrived). Read once, one way: `events()` (typed,
 * one by one), `pieces()` (typed, as they came), or `sse()` (the bytes of the Compatible API).
 * Leaving it early ends the provider's call.
 */
export class ChatStream {
  readonly stats: ChatStats;
  private source: AsyncIterator<ChatPiece> | undefined;

  constructor(source: AsyncIterator<ChatPiece>, stats: ChatStats = {}) {
    this.source = source;
    this.stats = stats;
  }

  /** Calls `fn` once when the stream ends, however it ends (read to its end, failed, or left early). */
  onEnd(fn: () => void): this {
    const source = this.source;
    if (!source) throw new Error("a chat stream is read once");
    let called = false;
    const once = () => {
      if (called) return;
      called = true;
      fn();
    };
    this.source = {
      next: () =>
        source.next().then(
          (r) => {
            if (r.done) once();
            return r;
          },
          (err: unknown) => {
            once();
            throw err;
          },
        ),
      return: (value?: unknown) => Promise.resolve(source.return?.(value) ?? ({ done: true, value: undefined } as IteratorResult<ChatPiece>)).finally(once),
    };
    return this;
  }

  /** Calls `fn` with each piece as it is read, until `fn` returns true (it has seen what it watched for). */
  watch(fn: (piece: ChatPiece) => boolean): this {
    const source = this.source;
    if (!source) throw new Error("a chat stream is read once");
    let watching = true;
    this.source = {
      next: () =>
        source.next().then((r) => {
          if (watching && !r.done) watching = !fn(r.value);
          return r;
        }),
      ...(source.return ? { return: (value?: unknown) => source.return!(value) } : {}),
    };
    return this;
  }

  pieces(): AsyncIterableIterator<ChatPiece> {
    return mapped(this.take(), (p) => p);
  }

  events(): AsyncGenerator<ChatEvent> {
    return eventsOf(this.take());
  }

  /** Server-sent event bytes: a pass-through provider's own, encoded here otherwise. */
  sse(): AsyncIterableIterator<Uint8Array> {
    return mapped(this.take(), (p) => p.raw ?? encodeChatEvents(p.events));
  }

  private take(): AsyncIterator<ChatPiece> {
    const source = this.source;
    if (!source) throw new Error("a chat stream is read once");
    this.source = undefined;
    return source;
  }
}

async function* eventsOf(source: AsyncIterator<ChatPiece>): AsyncGenerator<ChatEvent> {
  let finished = false;
  try {
    for (;;) {
      const r = await source.next();
      if (r.done) {
        finished = true;
        return;
      }
      yield* r.value.events;
    }
  } finally {
    if (!finished) await source.return?.();
  }
}

/** A piece of a pass-through stream: its bytes, read as events only when asked (relaying never asks). */
export class RawChatPiece implements ChatPiece {
  readonly raw: Uint8Array;
  private read: ChatEvent[] | undefined;

  constructor(raw: Uint8Array) {
    this.raw = raw;
  }

  get events(): readonly ChatEvent[] {
    this.read ??= decodeChatEvents(this.raw);
    return this.read;
  }
}

/** The chat events of whole server-sent events; data that is not JSON is skipped. */
export function decodeChatEvents(raw: Uint8Array): ChatEvent[] {
  const out: ChatEvent[] = [];
  for (const { data } of readSse(Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength).toString("utf8"))) {
    if (data === "[DONE]") {
      out.push({ type: "done" });
      continue;
    }
    try {
      const chunk = JSON.parse(data) as unknown;
      if (chunk !== null && typeof chunk === "object") out.push({ type: "chunk", chunk: chunk as ChatChunk });
    } catch {
      // Not JSON: nothing to take from it.
    }
  }
  return out;
}

export function encodeChatEvents(events: readonly ChatEvent[]): Uint8Array {
  if (events.length === 1 && events[0]!.type === "done") return DONE_EVENT;
  let text = "";
  for (const e of events) text += e.type === "done" ? "data: [DONE]\n\n" : sseText(e.chunk);
  return Buffer.from(text);
}

/** `source`'s values through `f`, one promise per value; leaving it leaves `source`. */
function mapped<T, U>(source: AsyncIterator<T>, f: (value: T) => U): AsyncIterableIterator<U> {
  const map = (r: IteratorResult<T>): IteratorResult<U> => (r.done ? r : { done: false, value: f(r.value) });
  return {
    [Symbol.asyncIterator]() {
      return this;
    },
    next: () => source.next().then(map),
    return: async (value?: unknown) => {
      const r = await source.return?.(value);
      return r && !r.done ? map(r) : { done: true, value: undefined };
    },
  };
}
