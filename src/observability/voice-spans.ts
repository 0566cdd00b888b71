import { toolSpan } from "./gen-ai-spans.ts";
import type { Traced, Tracing } from "./tracing.ts";

/**
 * The trace of one voice turn (voice.md §8): a root `voice.turn` span from the speech's onset to
 * the turn's end, with children for the end of turn, the transcription, each model and tool call
 * (through the chat service, `traced`), each sentence's synthesis and the playout. The turn's
 * moments are on the conversation's clock (monotonic, a fake one in tests): they are placed on the
 * wall clock by the offset taken when the trace starts.
 */
export class TurnTrace {
  readonly traced: Traced;
  private readonly offset: number;
  private readonly speechEngine: string;
  private readonly seen = new Set<string>();

  private constructor(traced: Traced, offset: number, speechEngine: string) {
    this.traced = traced;
    this.offset = offset;
    this.speechEngine = speechEngine;
  }

  /** `now`: the conversation clock's time now; `onset`: when the turn's speech began on it. */
  static start(
    tracing: Tracing,
    o: {
      now: number;
      onset: number;
      n: number;
      agent: string;
      conversation?: string | undefined;
      /** The engines by part: `transcription` and `speech`, or `realtime`. */
      engines: Record<string, string>;
    },
  ): TurnTrace | undefined {
    const offset = Date.now() - o.now;
    const traced = tracing.root(
      "voice.turn",
      {
        "perch.voice.turn": o.n,
        "gen_ai.agent.id": o.agent,
        ...(o.conversation ? { "gen_ai.conversation.id": o.conversation } : {}),
        ...Object.fromEntries(Object.entries(o.engines).map(([part, engine]) => [`perch.voice.engine.${part}`, engine])),
      },
      undefined,
      o.onset + offset,
    );
    if (!traced) return undefined;
    return new TurnTrace(traced, offset, o.engines.speech ?? o.engines.realtime ?? "");
  }

  get traceId(): string {
    return this.traced.traceId;
  }

  /** A stage that is over: its span from `from` to `to` (clock times); `text`: words said in it (`include_text`). */
  stage(name: string, from: number, to: number, attributes?: Record<string, string | number | boolean>, text?: [string, string]): void {
    const span = this.traced.child(name, attributes, undefined, from + this.offset);
    if (text) span.text(text[0], text[1]);
    span.end(Math.max(from, to) + this.offset);
  }

  /** Whether this is the first time `what` is asked of this turn (a reply's first audio delta, not its hundreds). */
  first(what: string): boolean {
    if (this.seen.has(what)) return false;
    this.seen.add(what);
    return true;
  }

  /** A realtime session's server event (its type; ids, never words) at `at` (clock time). */
  sessionEvent(type: string, at: number, attributes?: Record<string, string>): void {
    this.traced.event(type, attributes, at + this.offset);
  }

  /** A tool call's span, started now (a realtime turn's: a text agent's come through the chat service). */
  tool(name: string, argumentsText: string): Traced {
    return toolSpan(this.traced, name, "", argumentsText);
  }

  /** One sentence's synthesis, started now. */
  synthesis(text: string): SynthesisSpan {
    const span = this.traced.child("voice.synthesis", { "perch.voice.engine": this.speechEngine, "perch.voice.characters": text.length });
    span.text("perch.voice.text", text);
    return new SynthesisSpan(span);
  }

  /** The turn's end: its outcome and the stages of its `turn.metrics` (ms). */
  end(result: string, stages: Record<string, number | undefined>, error?: string): void {
    this.traced.set("perch.voice.outcome", result);
    for (const [k, v] of Object.entries(stages)) if (v !== undefined) this.traced.set(`perch.voice.${k}_ms`, Math.round(v * 10) / 10);
    if (result === "failed") this.traced.fail("turn_failed", error);
    this.traced.end();
  }
}

/** A sentence's synthesis: its time to first audio, ended once (its audio done, failed or abandoned). */
export class SynthesisSpan {
  private readonly span: Traced;
  private readonly started = performance.now();
  private firstAudio = false;
  private ended = false;

  constructor(span: Traced) {
    this.span = span;
  }

  audio(): void {
    if (this.firstAudio || this.ended) return;
    this.firstAudio = true;
    this.span.set("perch.voice.time_to_first_audio_ms", Math.round((performance.now() - this.started) * 10) / 10);
  }

  end(failed?: unknown): void {
    if (this.ended) return;
    this.ended = true;
    if (failed) this.span.fail(failed instanceof Error ? failed.name : "error");
    this.span.end();
  }
}
