/** A tool's outcome as the agent loop hands it to the model. */
export interface ToolOutcome {
  /** The text the model reads (the tool message's content). */
  text: string;
  isError: boolean;
  /** Images the tool returned, for models that accept image input. */
  images: Array<{ mimeType: string; data: string }>;
  /** For the metrics: `timeout` when the call ran out of time. */
  result: "ok" | "error" | "timeout";
  /** The call never reached the tool's server (a network failure, a closed session). */
  unreachable?: boolean;
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/**
 * An MCP `tools/call` result (untrusted): `text` items joined, `image` items kept aside, anything
 * else named in the text; `isError: true` makes it a failed call (tools.md §1).
 */
export function fromCallResult(value: unknown): ToolOutcome {
  const content = isObject(value) && Array.isArray(value.content) ? value.content : [];
  const texts: string[] = [];
  const images: ToolOutcome["images"] = [];
  for (const item of content) {
    if (!isObject(item)) continue;
    if (item.type === "text" && typeof item.text === "string") texts.push(item.text);
    else if (item.type === "image" && typeof item.data === "string" && typeof item.mimeType === "string")
      images.push({ mimeType: item.mimeType, data: item.data });
    else texts.push(`[${typeof item.type === "string" ? item.type : "unknown"} content omitted]`);
  }
  const isError = isObject(value) && value.isError === true;
  return { text: texts.join("\n"), isError, images, result: isError ? "error" : "ok" };
}

export function failed(text: string, result: "error" | "timeout" = "error", unreachable = false): ToolOutcome {
  return { text, isError: true, images: [], result, ...(unreachable ? { unreachable } : {}) };
}

/**
 * The outcome with its text cut to `maxChars` characters (tools.md §2, `agents[].tool_result_max_chars`)
 * on a character boundary, and a note telling the model so; within the bound, the outcome itself.
 */
export function cutOutcome(outcome: ToolOutcome, maxChars: number): ToolOutcome {
  if (outcome.text.length <= maxChars) return outcome;
  let end = maxChars;
  // Not between the two halves of a surrogate pair.
  const last = outcome.text.charCodeAt(end - 1);
  if (last >= 0xd800 && last <= 0xdbff) end--;
  const note = `\n[the tool's result was cut: the first ${end} of its ${outcome.text.length} characters]`;
  return { ...outcome, text: outcome.text.slice(0, end) + note };
}
