/**
 * Tool calls as a model provider sends them: untrusted input. Indices are integers below the cap
 * (no sparse arrays, no prototype keys: calls are kept in a Map), ids and names are bounded
 * strings, and one step holds at most MAX_TOOL_CALLS_PER_STEP calls.
 */
import type { ToolCall } from "../../protocol/compat.ts";

export const MAX_TOOL_CALLS_PER_STEP = 128;
const MAX_ID = 256;
const MAX_NAME = 256;
/** Arguments of one call; the provider's whole answer is bounded elsewhere (64 MiB). */
const MAX_ARGUMENTS = 1024 * 1024;

/** The provider's answer breaks the rules above: the step fails (502, or an error event mid-stream). */
export class InvalidToolCallError extends Error {
  constructor(reason: string) {
    super(`the provider sent an invalid tool call: ${reason}`);
    this.name = "InvalidToolCallError";
  }
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

function text(value: unknown, field: string, max: number): string | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== "string") throw new InvalidToolCallError(`${field} is not a string`);
  if (value.length > max) throw new InvalidToolCallError(`${field} is over ${max} characters`);
  return value;
}

/** The streamed deltas of one step's tool calls, assembled. */
export class ToolCallCollector {
  private readonly calls = new Map<number, ToolCall>();

  /** One chunk's `delta.tool_calls` (anything: it is checked). */
  add(deltas: unknown): void {
    if (deltas === undefined || deltas === null) return;
    if (!Array.isArray(deltas)) throw new InvalidToolCallError("tool_calls is not an array");
    for (const d of deltas) this.addOne(d);
  }

  /** The calls in index order. */
  list(): ToolCall[] {
    return [...this.calls.entries()].sort((a, b) => a[0] - b[0]).map((e) => e[1]);
  }

  private addOne(d: unknown): void {
    if (!isObject(d)) throw new InvalidToolCallError("a tool call delta is not an object");
    const index = d.index;
    if (typeof index !== "number" || !Number.isInteger(index) || index < 0) {
      throw new InvalidToolCallError(`tool call index ${JSON.stringify(index) ?? String(index)} is not a non-negative integer`);
    }
    if (index >= MAX_TOOL_CALLS_PER_STEP)
      throw new InvalidToolCallError(`tool call index ${index}: more than ${MAX_TOOL_CALLS_PER_STEP} tool calls in one step`);
    let call = this.calls.get(index);
    if (!call) {
      call = { id: "", type: "function", function: { name: "", arguments: "" } };
      this.calls.set(index, call);
    }
    if (d.type !== undefined && d.type !== null && d.type !== "function") throw new InvalidToolCallError(`tool call type ${JSON.stringify(d.type)}`);
    const id = text(d.id, "a tool call id", MAX_ID);
    if (id) call.id = id;
    if (d.function === undefined || d.function === null) return;
    if (!isObject(d.function)) throw new InvalidToolCallError("a tool call's function is not an object");
    const name = text(d.function.name, "a tool name", MAX_NAME);
    const args = text(d.function.arguments, "a tool call's arguments", MAX_ARGUMENTS);
    if (name) call.function.name += name;
    if (args) call.function.arguments += args;
    if (call.function.name.length > MAX_NAME) throw new InvalidToolCallError(`a tool name is over ${MAX_NAME} characters`);
    if (call.function.arguments.length > MAX_ARGUMENTS) throw new InvalidToolCallError(`a tool call's arguments are over ${MAX_ARGUMENTS} characters`);
  }
}

/** A whole completion's `message.tool_calls`, checked; [] when absent. */
export function checkedToolCalls(value: unknown): ToolCall[] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value)) throw new InvalidToolCallError("tool_calls is not an array");
  if (value.length > MAX_TOOL_CALLS_PER_STEP) throw new InvalidToolCallError(`more than ${MAX_TOOL_CALLS_PER_STEP} tool calls in one step (${value.length})`);
  return value.map((c): ToolCall => {
    if (!isObject(c)) throw new InvalidToolCallError("a tool call is not an object");
    if (c.type !== undefined && c.type !== "function") throw new InvalidToolCallError(`tool call type ${JSON.stringify(c.type)}`);
    const id = text(c.id, "a tool call id", MAX_ID);
    if (!id) throw new InvalidToolCallError("a tool call has no id");
    if (!isObject(c.function)) throw new InvalidToolCallError("a tool call has no function");
    const name = text(c.function.name, "a tool name", MAX_NAME);
    if (!name) throw new InvalidToolCallError("a tool call has no name");
    return { id, type: "function", function: { name, arguments: text(c.function.arguments, "a tool call's arguments", MAX_ARGUMENTS) ?? "" } };
  });
}
