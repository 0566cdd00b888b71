/**
 * `anthropic` and `google` providers through the AI SDK's provider packages. The language model is
 * called directly (`doGenerate`/`doStream`): no SDK retries or tool loop, which live in the router
 * and the agents. OpenAI's wire format is translated both ways here.
 */
import type { createAnthropic } from "@ai-sdk/anthropic";
import type { APICallError as ApiCallErrorClass } from "ai";
import type { ChatCompletion, ChatMessage, FinishReason, ToolCall, Usage } from "../../protocol/compat.ts";
import { type ChatEvent, type ChatPiece, type ChatStats, ChatStream } from "../chat-stream.ts";
import { ChunkWriter } from "../chunks.ts";
import { GenerationError } from "../errors.ts";
import { type CallOptions, type ChatProvider, ProviderError, type ProviderRequest, retryAfterMs } from "./provider.ts";

type LanguageModel = ReturnType<ReturnType<typeof createAnthropic>>;
type ModelOptions = Parameters<LanguageModel["doGenerate"]>[0];
type Prompt = ModelOptions["prompt"];
type GenerateResult = Awaited<ReturnType<LanguageModel["doGenerate"]>>;
type StreamPart = Awaited<ReturnType<LanguageModel["doStream"]>>["stream"] extends ReadableStream<infer P> ? P : never;

export interface AiSdkProviderOptions {
  /** `openai-compatible` here only serves the benchmark's comparison with the pass-through. */
  kind: "anthropic" | "google" | "openai-compatible";
  baseUrl: string | undefined;
  apiKey: string | undefined;
  timeoutMs: number;
}

/** Set once the SDK is loaded: errors are recognised with it. */
let APICallError: typeof ApiCallErrorClass | undefined;

/** The provider package, loaded on first use: importing the SDK costs a quarter of a second of start-up. */
async function loadModels(o: AiSdkProviderOptions): Promise<(id: string) => LanguageModel> {
  APICallError ??= (await import("ai")).APICallError;
  const settings = { apiKey: o.apiKey ?? "", ...(o.baseUrl ? { baseURL: o.baseUrl } : {}) };
  if (o.kind === "openai-compatible") {
    const { createOpenAICompatible } = await import("@ai-sdk/openai-compatible");
    const provider = createOpenAICompatible({ name: "upstream", baseURL: o.baseUrl ?? "", apiKey: o.apiKey, includeUsage: true });
    return (id) => provider.chatModel(id) as unknown as LanguageModel;
  }
  if (o.kind === "anthropic") {
    const provider = (await import("@ai-sdk/anthropic")).createAnthropic(settings);
    return (id) => provider(id) as LanguageModel;
  }
  const provider = (await import("@ai-sdk/google")).createGoogleGenerativeAI(settings);
  return (id) => provider(id) as LanguageModel;
}

export class AiSdkProvider implements ChatProvider {
  private models: Promise<(id: string) => LanguageModel> | undefined;
  private readonly options: AiSdkProviderOptions;
  private readonly timeoutMs: number;

  constructor(o: AiSdkProviderOptions) {
    this.options = o;
    this.timeoutMs = o.timeoutMs;
  }

  private async model(id: string): Promise<LanguageModel> {
    this.models ??= loadModels(this.options);
    return (await this.models)(id);
  }

  async complete(request: ProviderRequest, o: CallOptions): Promise<ChatCompletion> {
    const timeout = AbortSignal.timeout(this.timeoutMs);
    let result: GenerateResult;
    try {
      result = await (await this.model(request.model)).doGenerate(callOptions(request, AbortSignal.any([o.signal, timeout])));
    } catch (err) {
      throw toProviderError(err, o.signal, timeout);
    }
    refuseIgnored(result.warnings);
    let content = "";
    const toolCalls: ToolCall[] = [];
    for (const part of result.content) {
      if (part.type === "text") content += part.text;
      else if (part.type === "tool-call") toolCalls.push({ id: part.toolCallId, type: "function", function: { name: part.toolName, arguments: part.input } });
    }
    const message: ChatCompletion["choices"][number]["message"] = { role: "assistant", content: content || (toolCalls.length ? null : ""), refusal: null };
    if (toolCalls.length) message.tool_calls = toolCalls;
    return {
      id: completionId(result.response?.id),
      object: "chat.completion",
      created: Math.floor(Date.now() / 1000),
      model: o.publicModel,
      choices: [{ index: 0, message, finish_reason: finishReason(result.finishReason.unified), logprobs: null }],
      usage: usage(result.usage),
    };
  }

  async stream(request: ProviderRequest, o: CallOptions): Promise<ChatStream> {
    const controller = new AbortController();
    const timeout = AbortSignal.timeout(this.timeoutMs);
    const signal = AbortSignal.any([o.signal, timeout, controller.signal]);
    let reader: ReadableStreamDefaultReader<StreamPart>;
    try {
      reader = (await (await this.model(request.model)).doStream(callOptions(request, signal))).stream.getReader();
    } catch (err) {
      throw toProviderError(err, o.signal, timeout);
    }
    const encoder = new ChunkEncoder(o.publicModel, request.stream_options?.include_usage === true);
    const stats: ChatStats = {};
    // The first event is awaited here, so that an error before it can still be retried or fall back.
    let first: ChatEvent[] | undefined;
    for (;;) {
      let r: ReadableStreamReadResult<StreamPart>;
      try {
        r = await reader.read();
      } catch (err) {
        throw toProviderError(err, o.signal, timeout);
      }
      if (r.done) throw new ProviderError("the provider's stream ended before its first event");
      if (r.value.type === "error") throw toProviderError(r.value.error, o.signal, timeout);
      if (r.value.type === "stream-start") {
        try {
          refuseIgnored(r.value.warnings);
        } catch (err) {
          controller.abort();
          throw err;
        }
      }
      first = encoder.part(r.value, stats);
      if (first) break;
    }
    const start = first;
    async function* pieces(): AsyncGenerator<ChatPiece> {
      try {
        yield { events: start };
        for (;;) {
          let r: ReadableStreamReadResult<StreamPart>;
          try {
            r = await reader.read();
          } catch (err) {
            throw streamFailed(`the provider's stream failed: ${(err as Error).message}`);
          }
          if (r.done) break;
          if (r.value.type === "error") {
            throw streamFailed(`the provider's stream failed: ${errorMessage(r.value.error)}`);
          }
          const events = encoder.part(r.value, stats);
          if (events) yield { events };
        }
        yield { events: encoder.done() };
      } finally {
        controller.abort();
        reader.releaseLock();
      }
    }
    return new ChatStream(pieces(), stats);
  }
}

/** Encodes stream parts as OpenAI chunks. */
class ChunkEncoder {
  private readonly out: ChunkWriter;
  private readonly tools = new Map<string, number>();
  private finished = false;

  constructor(model: string, includeUsage: boolean) {
    this.out = new ChunkWriter(model, includeUsage);
  }

  part(p: StreamPart, stats: ChatStats): ChatEvent[] | undefined {
    switch (p.type) {
      case "text-delta":
        return p.delta ? [this.out.delta({ content: p.delta }, null)] : undefined;
      case "tool-input-start": {
        const index = this.tools.size;
        this.tools.set(p.id, index);
        return [this.out.delta({ tool_calls: [{ index, id: p.id, type: "function", function: { name: p.toolName, arguments: "" } }] }, null)];
      }
      case "tool-input-delta": {
        const index = this.tools.get(p.id);
        return index === undefined ? undefined : [this.out.delta({ tool_calls: [{ index, function: { arguments: p.delta } }] }, null)];
      }
      case "tool-call": {
        if (this.tools.has(p.toolCallId)) return undefined;
        const index = this.tools.size;
        this.tools.set(p.toolCallId, index);
        return [this.out.delta({ tool_calls: [{ index, id: p.toolCallId, type: "function", function: { name: p.toolName, arguments: p.input } }] }, null)];
      }
      case "finish": {
        this.finished = true;
        const u = usage(p.usage);
        stats.usage = u;
        return this.out.last(finishReason(p.finishReason.unified), u);
      }
      default:
        return undefined;
    }
  }

  done(): ChatEvent[] {
    if (!this.finished) throw streamFailed("the provider's stream ended early");
    return [{ type: "done" }];
  }
}

/** A streamed chat that failed after its first event (nothing can be retried then). */
function streamFailed(message: string): GenerationError {
  return new GenerationError("upstream_failed", message, { code: "upstream_error" });
}

function completionId(upstream: string | undefined): string {
  return `chatcmpl-${upstream ?? crypto.randomUUID().replaceAll("-", "")}`;
}

function finishReason(unified: string): FinishReason | null {
  switch (unified) {
    case "stop":
      return "stop";
    case "length":
      return "length";
    case "tool-calls":
      return "tool_calls";
    case "content-filter":
      return "content_filter";
    default:
      return "stop";
  }
}

function usage(u: GenerateResult["usage"]): Usage {
  const prompt = u.inputTokens.total ?? 0;
  const completion = u.outputTokens.total ?? 0;
  return { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion };
}

function callOptions(r: ProviderRequest, abortSignal: AbortSignal): ModelOptions {
  const o: ModelOptions = { prompt: prompt(r.messages), abortSignal };
  if (r.temperature != null) o.temperature = r.temperature;
  if (r.top_p != null) o.topP = r.top_p;
  const max = r.max_completion_tokens ?? r.max_tokens;
  if (max != null) o.maxOutputTokens = max;
  if (r.stop != null) o.stopSequences = typeof r.stop === "string" ? [r.stop] : r.stop;
  if (r.seed != null) o.seed = r.seed;
  if (r.presence_penalty != null) o.presencePenalty = r.presence_penalty;
  if (r.frequency_penalty != null) o.frequencyPenalty = r.frequency_penalty;
  const format = r.response_format;
  if (format?.type === "json_object") o.responseFormat = { type: "json" };
  else if (format?.type === "json_schema") {
    o.responseFormat = {
      type: "json",
      name: format.json_schema.name,
      ...(format.json_schema.description ? { description: format.json_schema.description } : {}),
    };
    if (format.json_schema.schema) o.responseFormat.schema = format.json_schema.schema as never;
  }
  if (r.tools?.length) {
    o.tools = r.tools.map((t) => ({
      type: "function" as const,
      name: t.function.name,
      ...(t.function.description ? { description: t.function.description } : {}),
      inputSchema: (t.function.parameters ?? { type: "object", properties: {} }) as never,
      ...(t.function.strict != null ? { strict: t.function.strict } : {}),
    }));
    const choice = r.tool_choice;
    if (choice === "auto" || choice === "none" || choice === "required") o.toolChoice = { type: choice };
    else if (choice) o.toolChoice = { type: "tool", toolName: choice.function.name };
  }
  return o;
}

function textOf(content: string | Array<{ type: "text"; text: string }> | null | undefined): string {
  if (content == null) return "";
  return typeof content === "string" ? content : content.map((p) => p.text).join("");
}

/** OpenAI messages as the AI SDK's prompt. A tool result needs its tool's name, found on the call it answers. */
function prompt(messages: ChatMessage[]): Prompt {
  const toolNames = new Map<string, string>();
  const out: Prompt = [];
  for (const m of messages) {
    switch (m.role) {
      case "system":
      case "developer":
        out.push({ role: "system", content: textOf(m.content) });
        break;
      case "user":
        out.push({
          role: "user",
          content:
            typeof m.content === "string"
              ? [{ type: "text", text: m.content }]
              : m.content.map((p) => {
                  if (p.type === "text") return { type: "text" as const, text: p.text };
                  if (p.type === "image_url") return imagePart(p.image_url.url);
                  return {
                    type: "file" as const,
                    mediaType: p.input_audio.format === "wav" ? "audio/wav" : "audio/mpeg",
                    data: { type: "data" as const, data: p.input_audio.data },
                  };
                }),
        });
        break;
      case "assistant": {
        const content: Extract<Prompt[number], { role: "assistant" }>["content"] = [];
        const text = textOf(m.content);
        if (text) content.push({ type: "text", text });
        for (const call of m.tool_calls ?? []) {
          toolNames.set(call.id, call.function.name);
          content.push({ type: "tool-call", toolCallId: call.id, toolName: call.function.name, input: parseArguments(call.function.arguments) });
        }
        out.push({ role: "assistant", content });
        break;
      }
      case "tool":
        out.push({
          role: "tool",
          content: [
            {
              type: "tool-result",
              toolCallId: m.tool_call_id,
              toolName: toolNames.get(m.tool_call_id) ?? "unknown",
              output: { type: "text", value: textOf(m.content) },
            },
          ],
        });
        break;
    }
  }
  return out;
}

function imagePart(url: string) {
  const data = /^data:([^;,]+)(;base64)?,(.*)$/s.exec(url);
  if (data) return { type: "file" as const, mediaType: data[1] ?? "image/*", data: { type: "data" as const, data: data[3] ?? "" } };
  return { type: "file" as const, mediaType: "image/*", data: { type: "url" as const, url: new URL(url) } };
}

function parseArguments(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return {};
  }
}

/** The request parameter behind each call setting the SDK may report as unsupported. */
const PARAMETER_OF: Record<string, string> = {
  temperature: "temperature",
  topP: "top_p",
  stopSequences: "stop",
  seed: "seed",
  presencePenalty: "presence_penalty",
  frequencyPenalty: "frequency_penalty",
  responseFormat: "response_format",
  toolChoice: "tool_choice",
  tools: "tools",
};

/**
 * A parameter the provider package would drop for this model (it reports it as a warning, and
 * goes on without it) is refused instead: the contract never ignores an accepted parameter silently.
 */
function refuseIgnored(warnings: ReadonlyArray<{ type: string; feature?: string; details?: string }> | undefined): void {
  for (const w of warnings ?? []) {
    const param = w.type === "unsupported" && w.feature && Object.hasOwn(PARAMETER_OF, w.feature) ? PARAMETER_OF[w.feature] : undefined;
    if (param)
      throw new GenerationError("invalid", `this model does not support \`${param}\`${w.details ? `: ${w.details}` : ""}`, {
        param,
        code: "unsupported_parameter",
      });
  }
}

function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

function toProviderError(err: unknown, clientSignal: AbortSignal, timeout: AbortSignal): unknown {
  if (clientSignal.aborted) return clientSignal.reason;
  if (timeout.aborted) return new ProviderError("the provider did not answer in time", { timedOut: true });
  if (APICallError?.isInstance(err)) {
    const retryAfter = retryAfterMs(err.responseHeaders?.["retry-after"]);
    return new ProviderError(err.message, {
      ...(err.statusCode !== undefined ? { status: err.statusCode } : {}),
      upstream: { message: err.message },
      ...(retryAfter !== undefined ? { retryAfterMs: retryAfter } : {}),
    });
  }
  return new ProviderError(`the provider failed: ${errorMessage(err)}`);
}
