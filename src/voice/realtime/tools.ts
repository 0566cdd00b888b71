import { MAX_TOOL_CALLS_PER_STEP } from "../../ai/agents/tool-calls.ts";
import { type ToolKit, type ToolObserver, toolMessageText } from "../../ai/agents/toolbox.ts";
import { failed, type ToolOutcome } from "../../mcp/results.ts";
import type { VoiceClock } from "../clock.ts";

/** A tool gets this much beyond the agent's `tool_timeout_ms` before it is answered as failed whatever it does. */
const TOOL_GRACE_MS = 1_000;

export interface RealtimeToolsOptions {
  /** The agent's tools for this device. */
  kit: ToolKit;
  /** The turn's `tool.call` / `tool.result` events. */
  observer: ToolObserver;
  /** The agent's `tool_timeout_ms`. */
  timeoutMs: number;
  clock: VoiceClock;
}

interface Call {
  callId: string;
  outcome: Promise<ToolOutcome>;
}

/**
 * The tool runner of one realtime turn: each function call of a response run through the agent's
 * toolbox as it comes (bounded per step as for text agents, answered as failed past its time
 * whatever the tool does), and, once the response is done, the calls' outputs as the items the
 * model answers with. Aborted with the turn (a barge-in, a failure): no result is told after.
 */
export class RealtimeTools {
  /** Aborted when the turn stops early: the tools' signal. */
  readonly abort = new AbortController();
  private readonly o: RealtimeToolsOptions;
  /** Calls of the current response. */
  private calls: Call[] = [];

  constructor(o: RealtimeToolsOptions) {
    this.o = o;
  }

  /** Whether another call of this response is run (a step's bound, as for text agents). */
  get room(): boolean {
    return this.calls.length < MAX_TOOL_CALLS_PER_STEP;
  }

  get aborted(): boolean {
    return this.abort.signal.aborted;
  }

  /** Runs one call now; its outcome is awaited when the response is done. */
  call(callId: string, name: string, args: string): void {
    const { kit, observer, clock } = this.o;
    const shown = kit.displayName(name);
    observer.called(shown, args);
    const signal = this.abort.signal;
    const limit = this.o.timeoutMs + TOOL_GRACE_MS;
    const outcome = new Promise<ToolOutcome>((resolve) => {
      // A tool that never answers still gets an answer: the model is not left waiting.
      const cancel = clock.after(limit, () => resolve(failed(`the tool did not answer within ${limit} ms`, "timeout")));
      kit
        .run({ id: callId, type: "function", function: { name, arguments: args } }, signal)
        .then(resolve, (err: unknown) => resolve(failed(`the tool failed: ${(err as Error)?.message ?? String(err)}`)))
        .finally(cancel);
    }).then((o) => {
      if (!signal.aborted) observer.finished(shown, o);
      return o;
    });
    this.calls.push({ callId, outcome });
  }

  /** The calls of the response that is done (none: the model answered without tools); the next response starts afresh. */
  take(): Call[] {
    const calls = this.calls;
    this.calls = [];
    return calls;
  }

  /** The calls' outputs as `conversation.item.create` events, once all are answered. */
  async outputs(calls: Call[]): Promise<Array<Record<string, unknown>>> {
    const outcomes = await Promise.all(calls.map((c) => c.outcome));
    return calls.map((c, i) => ({
      type: "conversation.item.create",
      item: { type: "function_call_output", call_id: c.callId, output: toolMessageText(outcomes[i]!, false) },
    }));
  }
}
