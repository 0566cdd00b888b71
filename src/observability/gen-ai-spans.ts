import {
  ATTR_GEN_AI_INPUT_MESSAGES,
  ATTR_GEN_AI_OPERATION_NAME,
  ATTR_GEN_AI_OUTPUT_MESSAGES,
  ATTR_GEN_AI_PROVIDER_NAME,
  ATTR_GEN_AI_REQUEST_MODEL,
  ATTR_GEN_AI_REQUEST_STREAM,
  ATTR_GEN_AI_RESPONSE_FINISH_REASONS,
  ATTR_GEN_AI_RESPONSE_MODEL,
  ATTR_GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
  ATTR_GEN_AI_TOOL_CALL_ID,
  ATTR_GEN_AI_TOOL_NAME,
  ATTR_GEN_AI_USAGE_INPUT_TOKENS,
  ATTR_GEN_AI_USAGE_OUTPUT_TOKENS,
} from "@opentelemetry/semantic-conventions/incubating";
import type { ChatPiece } from "../ai/chat-stream.ts";
import type { ProviderConfig } from "../config/config.ts";
import type { ChatChunk, ChatCompletion, Usage } from "../protocol/compat.ts";
import { SpanKind, type Traced } from "./tracing.ts";

/**
 * Spans of model and tool calls, with OpenTelemetry's `gen_ai.*` attributes: one span per model
 * call (retries and fallbacks inside it; the model that answered is `gen_ai.response.model`), one
 * per tool call. The messages are attributes only with `tracing.include_text`.
 */

/** Seconds from the call to its first text: the convention has the first chunk only, which a provider may send with no text (its role). */
export const TIME_TO_FIRST_TOKEN = "perch.gen_ai.time_to_first_token";

/** `gen_ai.provider.name` of a provider: the convention's well-known names, else the provider's id. */
export function genAiProvider(p: Pick<ProviderConfig, "id" | "kind">): string {
  return p.kind === "openai" ? "openai" : p.kind === "anthropic" ? "anthropic" : p.kind === "google" ? "gcp.gemini" : p.id;
}

/** A chat call's span (`chat <model>`), under `parent`. */
export function chatSpan(parent: Traced, model: string, provider: string, stream: boolean, messages: unknown): ModelSpan {
  const traced = parent.child(
    `chat ${model}`,
    {
      [ATTR_GEN_AI_OPERATION_NAME]: "chat",
      [ATTR_GEN_AI_REQUEST_MODEL]: model,
      [ATTR_GEN_AI_PROVIDER_NAME]: provider,
      [ATTR_GEN_AI_REQUEST_STREAM]: stream,
    },
    SpanKind.CLIENT,
  );
  if (traced.includesText) traced.text(ATTR_GEN_AI_INPUT_MESSAGES, JSON.stringify(messages));
  return new ModelSpan(traced, model, provider);
}

export class ModelSpan {
  readonly traced: Traced;
  private readonly started = performance.now();
  private readonly model: string;
  private readonly provider: string;

  constructor(traced: Traced, model: string, provider: string) {
    this.traced = traced;
    this.model = model;
    this.provider = provider;
  }

  /** The model (upstream name) and provider that answered; set only when a fallback did (`gen_ai.response.model` is then not the request's). */
  answeredBy(upstreamModel: string, provider: string): void {
    if (upstreamModel === this.model && provider === this.provider) return;
    this.traced.setAll({ [ATTR_GEN_AI_RESPONSE_MODEL]: upstreamModel, [ATTR_GEN_AI_PROVIDER_NAME]: provider });
  }

  /** The first chunk of a stream arrived (maybe only its role: the first text is `sawText`'s). */
  firstChunk(): void {
    this.traced.set(ATTR_GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, (performance.now() - this.started) / 1000);
  }

  /** Whether `piece` holds the stream's first text (or tool call): then its time is the span's time to first token. */
  sawText(piece: ChatPiece): boolean {
    for (const e of piece.events) {
      if (e.type !== "chunk") continue;
      const delta = (e.chunk as Partial<ChatChunk>).choices?.[0]?.delta;
      if ((typeof delta?.content === "string" && delta.content) || delta?.tool_calls) {
        this.traced.set(TIME_TO_FIRST_TOKEN, (performance.now() - this.started) / 1000);
        return true;
      }
    }
    return false;
  }

  completed(c: ChatCompletion): void {
    this.usage(c.usage);
    const choice = c.choices?.[0];
    if (choice?.finish_reason) this.traced.set(ATTR_GEN_AI_RESPONSE_FINISH_REASONS, [choice.finish_reason]);
    if (this.traced.includesText && choice?.message) this.traced.text(ATTR_GEN_AI_OUTPUT_MESSAGES, JSON.stringify([choice.message]));
    this.traced.end();
  }

  /** A stream ended (read to its end, failed, or left). */
  streamEnded(usage: Usage | null | undefined): void {
    this.usage(usage);
    this.traced.end();
  }

  failed(err: unknown): void {
    this.traced.fail(errorType(err), err instanceof Error ? err.message : undefined).end();
  }

  private usage(u: Usage | null | undefined): void {
    if (!u || !Number.isFinite(u.prompt_tokens) || !Number.isFinite(u.completion_tokens)) return;
    this.traced.setAll({ [ATTR_GEN_AI_USAGE_INPUT_TOKENS]: u.prompt_tokens, [ATTR_GEN_AI_USAGE_OUTPUT_TOKENS]: u.completion_tokens });
  }
}

/** A tool call's span (`execute_tool <name>`); `end` with whether it failed. */
export function toolSpan(parent: Traced, name: string, callId: string, argumentsText: string): Traced {
  return parent
    .child(`execute_tool ${name}`, { [ATTR_GEN_AI_OPERATION_NAME]: "execute_tool", [ATTR_GEN_AI_TOOL_NAME]: name, [ATTR_GEN_AI_TOOL_CALL_ID]: callId })
    .text("gen_ai.tool.call.arguments", argumentsText);
}

/** A tool call ended: `result` `ok`, `error` or `timeout`. */
export function toolEnded(span: Traced, result: "ok" | "error" | "timeout", isError: boolean): void {
  if (result !== "ok" || isError) span.fail(result === "ok" ? "tool_error" : result);
  span.end();
}

function errorType(err: unknown): string {
  const e = err as { kind?: unknown; name?: unknown } | null;
  if (e && typeof e.kind === "string") return e.kind;
  if (e && typeof e.name === "string") return e.name;
  return "error";
}
