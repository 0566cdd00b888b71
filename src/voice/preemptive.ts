import type { VoiceClock } from "./clock.ts";
import { words } from "./turn-end.ts";

/**
 * The model's text for a reply, started before the turn ended (voice.md §7's preemptive reply).
 * `release` is awaited before any tool of the reply runs: it resolves once the reply is used and
 * rejects when it is discarded, so a discarded reply runs no tool.
 */
export type PreparedText = (signal: AbortSignal, release: () => Promise<void>) => Promise<AsyncIterable<string>>;

/**
 * A reply asked of the model in a pause, with the words so far. It is read ahead into memory
 * (at most `maxChars` characters: the reply is cut there anyway) and shown to nobody: no event,
 * no entry, no tool, until `adopt()` hands it to the turn's reply; `discard()` aborts it and it
 * leaves nothing behind.
 */
export class PreparedReply {
  /** The words it answers (as `sameWords` compares them). */
  readonly text: string;
  /** When its first text arrived (clock), once it did. */
  firstAt: number | undefined;
  private readonly abort = new AbortController();
  private readonly clock: VoiceClock;
  private readonly maxChars: number;
  private readonly pieces: string[] = [];
  private chars = 0;
  private end: { error?: unknown } | undefined;
  private wake: (() => void) | undefined;
  private readonly released: Promise<void>;
  private open!: () => void;
  private refuse!: (err: Error) => void;
  private state: "waiting" | "adopted" | "discarded" = "waiting";

  constructor(text: string, run: PreparedText, o: { clock: VoiceClock; maxChars: number }) {
    this.text = text;
    this.clock = o.clock;
    this.maxChars = o.maxChars;
    this.released = new Promise<void>((resolve, reject) => {
      this.open = resolve;
      this.refuse = reject;
    });
    this.released.catch(() => {});
    void this.read(run);
  }

  get discarded(): boolean {
    return this.state === "discarded";
  }

  /** Whether the turn ended with the words this reply answers. */
  answers(transcript: string): boolean {
    return sameWords(this.text, transcript);
  }

  /** Ends the request; nothing of it is seen. */
  discard(): void {
    if (this.state !== "waiting") return;
    this.state = "discarded";
    const reason = new Error("the preemptive reply was discarded");
    this.refuse(reason);
    this.abort.abort(reason);
    this.wake?.();
  }

  /** The reply's text for the turn: what was read ahead, then the rest as it comes; its tools may run from now. */
  adopt(): (signal: AbortSignal) => Promise<AsyncIterable<string>> {
    this.state = "adopted";
    this.open();
    return async (signal) => {
      const stop = () => this.abort.abort(signal.reason);
      if (signal.aborted) stop();
      else signal.addEventListener("abort", stop, { once: true });
      return this.replay();
    };
  }

  private async read(run: PreparedText): Promise<void> {
    try {
      const stream = await run(this.abort.signal, () => this.released);
      for await (const piece of stream) {
        if (this.abort.signal.aborted) break;
        if (!piece) continue;
        this.firstAt ??= this.clock.now();
        this.pieces.push(piece);
        this.chars += piece.length;
        this.wake?.();
        if (this.chars > this.maxChars) break;
      }
      this.end = {};
    } catch (error) {
      this.end = { error };
    }
    this.wake?.();
  }

  private async *replay(): AsyncGenerator<string> {
    for (let i = 0; ; ) {
      if (i < this.pieces.length) {
        yield this.pieces[i++]!;
        continue;
      }
      if (this.end) {
        if (this.end.error !== undefined) throw this.end.error;
        return;
      }
      if (this.abort.signal.aborted) throw this.abort.signal.reason;
      await new Promise<void>((resolve) => {
        this.wake = resolve;
      });
      this.wake = undefined;
    }
  }
}

/** The same words, whatever the case and punctuation ("What time is it?" = "what time is it"). */
export function sameWords(a: string, b: string): boolean {
  return words(a).join(" ") === words(b).join(" ");
}
