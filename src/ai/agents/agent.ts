import type { AgentConfig, ModelConfig } from "../../config/config.ts";
import { toolEnded, toolSpan } from "../../observability/gen-ai-spans.ts";
import type { Traced } from "../../observability/tracing.ts";
import type { ChatChunk, ChatCompletion, ChatMessage, FinishReason, ToolCall, Usage } from "../../protocol/compat.ts";
import type { Caller } from "../caller.ts";
import { type ChatEvent, type ChatPiece, type ChatStats, ChatStream } from "../chat-stream.ts";
import { ChunkWriter } from "../chunks.ts";
import { GenerationError } from "../errors.ts";
import type { ProviderRequest } from "../providers/provider.ts";
import type { ChatRouter } from "../router.ts";
import { checkedToolCalls, InvalidToolCallError, ToolCallCollector } from "./tool-calls.ts";
import { type Toolbox, type ToolDefinition, type ToolKit, type ToolObserver, toolMessageText } from "./toolbox.ts";

export interface AgentRun {
  agent: AgentConfig;
  model: ModelConfig;
  caller: Caller;
  request: ProviderRequest;
  signal: AbortSignal;
  /** Sees the tool calls as they run (a voice turn's events). */
  observer?: ToolObserver | undefined;
  /** The span its model and tool calls go under, when the node traces. */
  trace?: Traced | undefined;
}

/**
 * Runs an agent: its instructions first, its own chat model, and its tools in a loop of at most
 * `max_steps` model calls. The last step offers no tools, so the model has to answer.
 */
export class AgentRunner {
  private readonly router: ChatRouter;
  private readonly tools: Toolbox;

  constructor(router: ChatRouter, tools: Toolbox) {
    this.router = router;
    this.tools = tools;
  }

  async complete(run: AgentRun): Promise<ChatCompletion> {
    const { agent, model } = run;
    const messages = initialMessages(run);
    const kit = this.tools.forRun(agent, model, run.caller);
    const total = emptyUsage();
    for (let step = 1; ; step++) {
      const offered = step < agent.max_steps ? kit.definitions() : [];
      const completion = await this.router.complete(model, stepRequest(run.request, messages, offered), {
        signal: run.signal,
        publicModel: agent.id,
        trace: run.trace,
      });
      addUsage(total, completion.usage);
      const message = completion.choices[0]?.message;
      let calls: ToolCall[];
      try {
        calls = checkedToolCalls(message?.tool_calls);
      } catch (err) {
        if (err instanceof InvalidToolCallError) throw new GenerationError("upstream_failed", err.message, { code: "upstream_error" });
        throw err;
      }
      // A call the model makes after its tools were withheld still gets an answer (a refusal) while steps remain.
      if (step >= agent.max_steps || calls.length === 0) {
        completion.usage = total;
        return completion;
      }
      messages.push({ role: "assistant", content: message?.content ?? null, tool_calls: calls });
      await this.runCalls(run, kit, calls, messages);
    }
  }

  /** Resolves once the first step's stream has started; later steps stream on as the model answers. */
  async stream(run: AgentRun): Promise<ChatStream> {
    const { agent, model, request } = run;
    const messages = initialMessages(run);
    const kit = this.tools.forRun(agent, model, run.caller);
    const includeUsage = request.stream_options?.include_usage === true;
    const stats: ChatStats = {};
    const total = emptyUsage();
    const out = new ChunkWriter(agent.id, includeUsage);
    const upstreamRequest = (offered: ToolDefinition[]) => ({
      ...stepRequest(request, messages, offered),
      stream: true,
      stream_options: { include_usage: true },
    });
    let step = 1;
    let offered = step < agent.max_steps ? kit.definitions() : [];
    let current = await this.router.stream(model, upstreamRequest(offered), { signal: run.signal, publicModel: agent.id, trace: run.trace });
    const self = this;
    // Step by step, the model's pieces in, the agent's out (as many as came in): events, never bytes.
    async function* pieces(): AsyncGenerator<ChatPiece> {
      for (;;) {
        const calls = new ToolCallCollector();
        let finish: FinishReason | null = null;
        let content = "";
        for await (const piece of current.pieces()) {
          const parts: ChatEvent[] = [];
          for (const event of piece.events) {
            if (event.type !== "chunk") continue;
            const chunk: Partial<ChatChunk> = event.chunk;
            addUsage(total, chunk.usage);
            const choice = Array.isArray(chunk.choices) ? chunk.choices[0] : undefined;
            if (!choice || typeof choice !== "object") continue;
            const delta = choice.delta;
            if (typeof delta?.content === "string" && delta.content) {
              content += delta.content;
              stats.outputChars = (stats.outputChars ?? 0) + delta.content.length;
              parts.push(out.delta({ content: delta.content }));
            }
            try {
              calls.add(delta?.tool_calls);
            } catch (err) {
              if (!(err instanceof InvalidToolCallError)) throw err;
              // The provider's call ends here: its connection is closed when the stream is left.
              if (parts.length) yield { events: parts };
              throw new GenerationError("upstream_failed", err.message, { code: "upstream_error" });
            }
            if (typeof choice.finish_reason === "string") finish = choice.finish_reason;
          }
          if (parts.length) yield { events: parts };
        }
        const made = calls.list();
        if (step >= agent.max_steps || made.length === 0) {
          if (total.prompt_tokens > 0 || total.completion_tokens > 0) stats.usage = total;
          yield { events: out.finish(finish ?? "stop", total) };
          return;
        }
        messages.push({ role: "assistant", content: content || null, tool_calls: made });
        await self.runCalls(run, kit, made, messages);
        if (run.signal.aborted) return;
        step++;
        offered = step < agent.max_steps ? kit.definitions() : [];
        try {
          current = await self.router.stream(model, upstreamRequest(offered), { signal: run.signal, publicModel: agent.id, trace: run.trace });
        } catch (err) {
          if (run.signal.aborted) return;
          throw err instanceof GenerationError ? err : new GenerationError("upstream_failed", (err as Error).message, { code: "upstream_error" });
        }
      }
    }
    return new ChatStream(pieces(), stats);
  }

  /** Runs one step's calls side by side; their results (and images, for a model that takes them) join the messages. */
  private async runCalls(run: AgentRun, kit: ToolKit, calls: ToolCall[], messages: ChatMessage[]): Promise<void> {
    await run.observer?.ready?.();
    run.signal.throwIfAborted();
    const outcomes = await Promise.all(
      calls.map(async (call) => {
        // The events name the tool as configured, not in the provider's form (`device__set_volume`).
        const name = kit.displayName(call.function.name);
        run.observer?.called(name, call.function.arguments);
        const span = run.trace && toolSpan(run.trace, name, call.id, call.function.arguments);
        const outcome = await kit.run(call, run.signal);
        if (span) toolEnded(span, outcome.result, outcome.isError);
        run.observer?.finished(name, outcome);
        return outcome;
      }),
    );
    calls.forEach((call, i) => {
      messages.push({ role: "tool", tool_call_id: call.id, content: toolMessageText(outcomes[i]!, kit.images) });
    });
    const images = kit.images ? outcomes.flatMap((o) => o.images) : [];
    if (images.length) {
      messages.push({
        role: "user",
        content: [
          { type: "text", text: "The images the tools returned:" },
          ...images.map((i) => ({ type: "image_url" as const, image_url: { url: `data:${i.mimeType};base64,${i.data}` } })),
        ],
      });
    }
  }
}

function initialMessages(run: AgentRun): ChatMessage[] {
  const instructions = run.agent.instructions.trim();
  return instructions ? [{ role: "system", content: instructions }, ...run.request.messages] : [...run.request.messages];
}

function stepRequest(request: ProviderRequest, messages: ChatMessage[], tools: ToolDefinition[]): ProviderRequest {
  const r: ProviderRequest = { ...request, messages: [...messages] };
  if (tools.length) r.tools = tools;
  else delete r.tools;
  delete r.tool_choice;
  delete r.parallel_tool_calls;
  return r;
}

function emptyUsage(): Usage {
  return { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 };
}

/** Adds a provider's usage (untrusted: anything but finite numbers counts as 0). */
function addUsage(total: Usage, u: Usage | null | undefined): void {
  if (!u || typeof u !== "object") return;
  const n = (v: unknown) => (typeof v === "number" && Number.isFinite(v) ? v : 0);
  total.prompt_tokens += n(u.prompt_tokens);
  total.completion_tokens += n(u.completion_tokens);
  total.total_tokens += n(u.total_tokens);
}
