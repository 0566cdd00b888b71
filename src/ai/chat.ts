import { estimateTokens } from "../domain/usage-limits.ts";
import type { UsageMeter } from "../domain/usage-meter.ts";
import type { Traced } from "../observability/tracing.ts";
import type { ChatCompletion, ChatRequest, Usage } from "../protocol/compat.ts";
import { AgentRunner } from "./agents/agent.ts";
import type { Toolbox, ToolObserver } from "./agents/toolbox.ts";
import { type Caller, usageWho } from "./caller.ts";
import type { Catalog, CatalogEntry } from "./catalog.ts";
import type { ChatStream } from "./chat-stream.ts";
import { GenerationError } from "./errors.ts";
import type { ChatRouter } from "./router.ts";

/** A catalog entry that completes chats: a model or an agent. */
export type ChatEntry = Extract<CatalogEntry, { kind: "chat" | "agent" }>;

export type ChatResult = { kind: "completion"; completion: ChatCompletion } | { kind: "stream"; stream: ChatStream };

export interface ChatServiceOptions {
  router: ChatRouter;
  catalog: Catalog;
  tools: Toolbox;
  /** Counts every call's tokens for its caller (usage.md §1). */
  usage?: UsageMeter;
}

/** Chat completions for a caller: resolves the model or agent, checks what it accepts, and runs it. */
export class ChatService {
  private readonly catalog: Catalog;
  private readonly router: ChatRouter;
  private readonly agents: AgentRunner;
  private readonly usage: UsageMeter | undefined;

  constructor(o: ChatServiceOptions) {
    this.usage = o.usage;
    this.catalog = o.catalog;
    this.router = o.router;
    this.agents = new AgentRunner(this.router, o.tools);
  }

  /** The chat model or agent `id` as `caller` may use it; throws `model_not_found` otherwise. */
  resolve(caller: Caller, id: string): ChatEntry {
    const entry = this.catalog.get(caller, id);
    if (!entry) {
      const hint = this.catalog.hasChat
        ? ""
        : " No chat model is configured on this server: add a provider under `providers` and a chat model under `models` in the configuration file (PERCH_CONFIG).";
      throw new GenerationError("not_found", `The model \`${id}\` does not exist or you do not have access to it.${hint}`, {
        param: "model",
        code: "model_not_found",
      });
    }
    if (entry.kind === "realtime" || (entry.kind === "agent" && entry.model.kind === "realtime")) {
      const what = entry.kind === "agent" ? `the agent \`${id}\` converses speech to speech (its model is realtime)` : `\`${id}\` is a realtime model`;
      throw new GenerationError("invalid", `${what}: it answers voice conversations only, not chat completions`, {
        param: "model",
        code: "model_not_supported",
      });
    }
    if (entry.kind !== "chat" && entry.kind !== "agent") {
      throw new GenerationError("invalid", `\`${id}\` is a ${entry.kind} model: it cannot complete chats`, { param: "model", code: "invalid_model" });
    }
    return entry;
  }

  /** `observer` sees an agent's tool calls as they run; `trace`: the span the calls go under, when the node traces. */
  async chat(caller: Caller, request: ChatRequest, signal: AbortSignal, observer?: ToolObserver, trace?: Traced): Promise<ChatResult> {
    return await this.run(this.resolve(caller, request.model), caller, request, signal, observer, trace);
  }

  /** `chat` of a model or agent already resolved for `caller` (`resolve`). */
  async run(entry: ChatEntry, caller: Caller, request: ChatRequest, signal: AbortSignal, observer?: ToolObserver, trace?: Traced): Promise<ChatResult> {
    const result = await this.call(entry, caller, request, signal, observer, trace);
    const meter = this.usage;
    if (!meter) return result;
    // Tokens as the provider reported them; estimated from the text (and flagged) where it reported none.
    const count = (usage: Usage | null | undefined, outputChars: () => number) => {
      const reported = usage && (usage.prompt_tokens > 0 || usage.completion_tokens > 0);
      meter.record(
        usageWho(caller),
        entry.id,
        reported
          ? { input_tokens: usage.prompt_tokens || 0, output_tokens: usage.completion_tokens || 0 }
          : { input_tokens: estimateTokens(inputChars(request)), output_tokens: estimateTokens(outputChars()), estimated: true },
      );
    };
    if (result.kind === "completion") {
      const c = result.completion;
      count(c.usage, () => {
        const content = c.choices?.[0]?.message?.content;
        return typeof content === "string" ? content.length : 0;
      });
    } else {
      const { stats } = result.stream;
      result.stream.onEnd(() => count(stats.usage, () => stats.outputChars ?? 0));
    }
    return result;
  }

  private async call(
    entry: ChatEntry,
    caller: Caller,
    request: ChatRequest,
    signal: AbortSignal,
    observer?: ToolObserver,
    trace?: Traced,
  ): Promise<ChatResult> {
    checkParts(request, entry.model.input);
    const o = { signal, publicModel: entry.id, trace };
    if (entry.kind === "agent") {
      if (request.tools?.length) throw new GenerationError("invalid", "an agent runs its own tools: `tools` cannot be given with an agent", { param: "tools" });
      const run = { agent: entry.agent, model: entry.model, caller, request: withTokenLimit(request, entry.agent.max_tokens), signal, observer, trace };
      return request.stream ? { kind: "stream", stream: await this.agents.stream(run) } : { kind: "completion", completion: await this.agents.complete(run) };
    }
    return request.stream
      ? { kind: "stream", stream: await this.router.stream(entry.model, request, o) }
      : { kind: "completion", completion: await this.router.complete(entry.model, request, o) };
  }
}

/** The request with the agent's `max_tokens`, unless it asks for fewer itself. */
function withTokenLimit(request: ChatRequest, max: number | undefined): ChatRequest {
  if (max === undefined) return request;
  const own = request.max_completion_tokens ?? request.max_tokens;
  if (own != null && own <= max) return request;
  const { max_completion_tokens: _, ...rest } = request;
  return { ...rest, max_tokens: max };
}

/** Image and audio parts reach only models configured to accept them. */
function checkParts(request: ChatRequest, accepted: readonly string[]): void {
  request.messages.forEach((m, i) => {
    if (m.role !== "user" || typeof m.content === "string") return;
    m.content.forEach((p, j) => {
      const needs = p.type === "image_url" ? "image" : p.type === "input_audio" ? "audio" : undefined;
      if (needs && !accepted.includes(needs)) {
        throw new GenerationError("invalid", `model \`${request.model}\` does not accept ${p.type} content`, {
          param: `messages[${i}].content[${j}].type`,
          code: "unsupported_content",
        });
      }
    });
  });
}

/** Characters of the request's text, for an estimate of its tokens. */
function inputChars(request: ChatRequest): number {
  let n = 0;
  for (const m of request.messages) {
    const content = (m as { content?: unknown }).content;
    if (typeof content === "string") n += content.length;
    else if (Array.isArray(content)) for (const p of content as Array<{ text?: unknown }>) if (typeof p.text === "string") n += p.text.length;
  }
  return n;
}
