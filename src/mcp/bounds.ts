/**
 * The bounds of a tool list an MCP server (a device, or a configured server) offers (tools.md §1):
 * at most 128 tools, names `^[a-zA-Z0-9_.-]{1,64}$`, descriptions up to 1 KiB, an `inputSchema`
 * that is a JSON Schema object of at most 16 KiB. What breaks them is ignored, tool by tool.
 */
import { TOOL_NAME } from "../config/config.ts";

export const MAX_TOOLS = 128;
export const MAX_DESCRIPTION_BYTES = 1024;
export const MAX_SCHEMA_BYTES = 16 * 1024;

/** A tool as Perch keeps it: checked, and small. */
export interface OfferedTool {
  name: string;
  description: string;
  inputSchema: Record<string, unknown>;
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/** Why one listed tool is ignored; undefined when it is within the bounds. */
function refusal(tool: unknown, seen: ReadonlySet<string>): string | undefined {
  if (!isObject(tool)) return "a tool is not an object";
  const { name, description, inputSchema } = tool;
  if (typeof name !== "string" || !TOOL_NAME.test(name)) return `a tool name is not ${TOOL_NAME.source}`;
  if (seen.has(name)) return `tool ${name} is listed twice`;
  if (description !== undefined && typeof description !== "string") return `tool ${name}: description is not a string`;
  if (typeof description === "string" && Buffer.byteLength(description) > MAX_DESCRIPTION_BYTES) return `tool ${name}: description over 1 KiB`;
  if (!isObject(inputSchema) || inputSchema.type !== "object") return `tool ${name}: inputSchema is not a JSON Schema object`;
  if (Buffer.byteLength(JSON.stringify(inputSchema)) > MAX_SCHEMA_BYTES) return `tool ${name}: inputSchema over 16 KiB`;
  return undefined;
}

/**
 * Adds the tools of one `tools/list` page that are within the bounds to `into` (up to 128 in all);
 * returns why the others were ignored (the caller logs it once).
 */
export function acceptTools(page: unknown, into: OfferedTool[]): string[] {
  const ignored: string[] = [];
  if (!Array.isArray(page)) return ["tools is not an array"];
  const seen = new Set(into.map((t) => t.name));
  for (const tool of page) {
    if (into.length >= MAX_TOOLS) {
      ignored.push(`more than ${MAX_TOOLS} tools`);
      break;
    }
    const why = refusal(tool, seen);
    if (why) {
      ignored.push(why);
      continue;
    }
    const t = tool as { name: string; description?: string; inputSchema: Record<string, unknown> };
    seen.add(t.name);
    into.push({ name: t.name, description: t.description ?? "", inputSchema: t.inputSchema });
  }
  return ignored;
}
