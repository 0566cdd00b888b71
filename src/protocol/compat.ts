/**
 * Wire schemas of the Compatible API (OpenAI's chat completions, as far as the contract accepts
 * them). Objects are strict: a field the contract does not accept is refused, never ignored.
 */
import { z } from "zod";

/** Free-form JSON the client supplies (tool parameters, JSON schemas) is bounded in depth: it is serialised again when forwarded. */
export const MAX_SCHEMA_DEPTH = 64;

const boundedJson = z.record(z.string(), z.unknown()).superRefine((value, ctx) => {
  if (depthOver(value, MAX_SCHEMA_DEPTH)) ctx.addIssue({ code: "custom", message: `nested deeper than ${MAX_SCHEMA_DEPTH} levels` });
});

const TextPart = z.strictObject({ type: z.literal("text"), text: z.string() });
const ImagePart = z.strictObject({
  type: z.literal("image_url"),
  image_url: z.strictObject({ url: z.string().min(1), detail: z.enum(["auto", "low", "high"]).optional() }),
});
const AudioPart = z.strictObject({
  type: z.literal("input_audio"),
  input_audio: z.strictObject({ data: z.string().min(1), format: z.enum(["wav", "mp3"]) }),
});
const UserPart = z.discriminatedUnion("type", [TextPart, ImagePart, AudioPart]);

const text = z.union([z.string(), z.array(TextPart)]);
const name = z.string().min(1).max(256).optional();

export const ToolCall = z.strictObject({
  id: z.string().min(1),
  type: z.literal("function"),
  function: z.strictObject({ name: z.string().min(1), arguments: z.string() }),
});

const Message = z.discriminatedUnion("role", [
  z.strictObject({ role: z.literal("system"), content: text, name }),
  z.strictObject({ role: z.literal("developer"), content: text, name }),
  z.strictObject({ role: z.literal("user"), content: z.union([z.string(), z.array(UserPart)]), name }),
  z.strictObject({
    role: z.literal("assistant"),
    content: text.nullish(),
    name,
    tool_calls: z.array(ToolCall).optional(),
    refusal: z.string().nullish(),
  }),
  z.strictObject({ role: z.literal("tool"), content: text, tool_call_id: z.string().min(1) }),
]);

const Tool = z.strictObject({
  type: z.literal("function"),
  function: z.strictObject({
    name: z.string().regex(/^[A-Za-z0-9_-]{1,64}$/, "must be 1–64 letters, digits, _ or -"),
    description: z.string().optional(),
    parameters: boundedJson.optional(),
    strict: z.boolean().nullish(),
  }),
});

const ResponseFormat = z.discriminatedUnion("type", [
  z.strictObject({ type: z.literal("text") }),
  z.strictObject({ type: z.literal("json_object") }),
  z.strictObject({
    type: z.literal("json_schema"),
    json_schema: z.strictObject({
      name: z.string().regex(/^[A-Za-z0-9_-]{1,64}$/, "must be 1–64 letters, digits, _ or -"),
      description: z.string().optional(),
      schema: boundedJson.optional(),
      strict: z.boolean().nullish(),
    }),
  }),
]);

const ToolChoice = z.union([
  z.enum(["none", "auto", "required"]),
  z.strictObject({ type: z.literal("function"), function: z.strictObject({ name: z.string().min(1) }) }),
]);

const penalty = z.number().min(-2).max(2).nullish();
const tokens = z.number().int().min(1).nullish();

const chatRequestFields = {
  model: z.string().min(1),
  messages: z.array(Message).min(1),
  stream: z.boolean().nullish(),
  stream_options: z.strictObject({ include_usage: z.boolean().optional() }).nullish(),
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().min(0).max(1).nullish(),
  max_tokens: tokens,
  max_completion_tokens: tokens,
  stop: z.union([z.string(), z.array(z.string()).max(4)]).nullish(),
  seed: z.number().int().nullish(),
  presence_penalty: penalty,
  frequency_penalty: penalty,
  response_format: ResponseFormat.nullish(),
  tools: z.array(Tool).max(128).nullish(),
  tool_choice: ToolChoice.nullish(),
  parallel_tool_calls: z.boolean().nullish(),
  user: z.string().max(256).nullish(),
  n: z.literal(1, { error: "only 1 is supported" }).nullish(),
  metadata: z.record(z.string().max(64), z.string().max(512)).nullish(),
};

/** The checks across fields, the same for both schemas below. */
function checkAcrossFields(r: Omit<z.infer<z.ZodObject<typeof chatRequestFields>>, "messages">, ctx: z.core.$RefinementCtx): void {
  if (r.stream_options && !r.stream) ctx.addIssue({ code: "custom", path: ["stream_options"], message: "only allowed when stream is true" });
  if (r.max_tokens != null && r.max_completion_tokens != null) {
    ctx.addIssue({ code: "custom", path: ["max_tokens"], message: "give max_tokens or max_completion_tokens, not both" });
  }
  if (r.tool_choice != null && !r.tools?.length) ctx.addIssue({ code: "custom", path: ["tool_choice"], message: "only allowed when tools are given" });
  if (r.parallel_tool_calls != null && !r.tools?.length) {
    ctx.addIssue({ code: "custom", path: ["parallel_tool_calls"], message: "only allowed when tools are given" });
  }
  if (r.metadata && Object.keys(r.metadata).length > 16) ctx.addIssue({ code: "custom", path: ["metadata"], message: "at most 16 keys" });
}

export const ChatRequest = z.strictObject(chatRequestFields).superRefine(checkAcrossFields);

/** ChatRequest with its messages taken as they are: parseChatRequest checks each message on its own first. */
const ChatRequestAroundMessages = z.strictObject({ ...chatRequestFields, messages: z.array(z.unknown()).min(1) }).superRefine(checkAcrossFields);

export type ChatRequest = z.infer<typeof ChatRequest>;

/** Counts checked before the schema runs, cheaply (array lengths only). */
export const MAX_MESSAGES = 4096;
export const MAX_CONTENT_PARTS = 512;
const MAX_TOOLS = 128;
const MAX_STOP = 4;
const MAX_TOOL_CALLS = 128;

type Issue = z.core.$ZodIssue;

const tooMany = (path: PropertyKey[], max: number, what: string): Issue =>
  ({ code: "custom", path, message: `at most ${max} ${what}`, input: undefined }) as Issue;

function countIssue(v: unknown): Issue | undefined {
  if (typeof v !== "object" || v === null || Array.isArray(v)) return undefined;
  const r = v as Record<string, unknown>;
  const over = (x: unknown, max: number) => Array.isArray(x) && x.length > max;
  if (over(r.messages, MAX_MESSAGES)) return tooMany(["messages"], MAX_MESSAGES, "messages");
  if (over(r.tools, MAX_TOOLS)) return tooMany(["tools"], MAX_TOOLS, "tools");
  if (over(r.stop, MAX_STOP)) return tooMany(["stop"], MAX_STOP, "stop sequences");
  if (!Array.isArray(r.messages)) return undefined;
  for (let i = 0; i < r.messages.length; i++) {
    const m = r.messages[i] as Record<string, unknown> | null;
    if (typeof m !== "object" || m === null) continue;
    if (over(m.content, MAX_CONTENT_PARTS)) return tooMany(["messages", i, "content"], MAX_CONTENT_PARTS, "content parts");
    if (over(m.tool_calls, MAX_TOOL_CALLS)) return tooMany(["messages", i, "tool_calls"], MAX_TOOL_CALLS, "tool calls");
  }
  return undefined;
}

/**
 * ChatRequest.safeParse at a bounded cost: the counts first, then each message on its own,
 * stopping at the first that fails (one issue, not one per item), then the whole request.
 */
export function parseChatRequest(value: unknown): ReturnType<typeof ChatRequest.safeParse> {
  const fail = (issue: Issue) => ({ success: false as const, error: new z.ZodError([issue]) as z.ZodError<ChatRequest>, data: undefined });
  const counted = countIssue(value);
  if (counted) return fail(counted);
  const messages = (value as { messages?: unknown } | null)?.messages;
  if (!Array.isArray(messages)) return ChatRequest.safeParse(value);
  const checked: ChatMessage[] = new Array(messages.length);
  for (let i = 0; i < messages.length; i++) {
    const one = Message.safeParse(messages[i]);
    if (!one.success) {
      const first = one.error.issues[0]!;
      return fail({ ...first, path: ["messages", i, ...first.path] } as Issue);
    }
    checked[i] = one.data;
  }
  // The messages are checked once: the rest of the request around them, then the messages as checked.
  const rest = ChatRequestAroundMessages.safeParse(value);
  if (!rest.success) return rest as unknown as ReturnType<typeof ChatRequest.safeParse>;
  return { success: true, data: { ...rest.data, messages: checked }, error: undefined } as ReturnType<typeof ChatRequest.safeParse>;
}
export type ChatMessage = ChatRequest["messages"][number];
export type ToolCall = z.infer<typeof ToolCall>;

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

export type FinishReason = "stop" | "length" | "tool_calls" | "content_filter" | "function_call";

export interface ChatCompletion {
  id: string;
  object: "chat.completion";
  created: number;
  model: string;
  choices: Array<{
    index: number;
    message: { role: "assistant"; content: string | null; refusal: string | null; tool_calls?: ToolCall[] };
    finish_reason: FinishReason | null;
    logprobs: null;
  }>;
  usage?: Usage;
  system_fingerprint?: string | null;
}

export interface ToolCallDelta {
  index: number;
  id?: string;
  type?: "function";
  function?: { name?: string; arguments?: string };
}

export interface ChatChunk {
  id: string;
  object: "chat.completion.chunk";
  created: number;
  model: string;
  choices: Array<{
    index: number;
    delta: { role?: "assistant"; content?: string | null; refusal?: string | null; tool_calls?: ToolCallDelta[] };
    finish_reason: FinishReason | null;
    logprobs?: null;
  }>;
  usage?: Usage | null;
}

/** Whether `value` nests objects or arrays deeper than `max`; iterative, so hostile input cannot exhaust the stack. */
function depthOver(value: unknown, max: number): boolean {
  const stack: Array<[unknown, number]> = [[value, 1]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop()!;
    if (v === null || typeof v !== "object") continue;
    if (depth > max) return true;
    for (const child of Array.isArray(v) ? v : Object.values(v)) if (child !== null && typeof child === "object") stack.push([child, depth + 1]);
  }
  return false;
}
