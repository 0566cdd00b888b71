import { z } from "zod";
import { ConfigSchema } from "./schema.ts";

/** A node of the schema as JSON Schema (zod's public `toJSONSchema`), the form this table is read from. */
interface Node {
  type?: string;
  anyOf?: Node[];
  const?: unknown;
  enum?: unknown[];
  properties?: Record<string, Node>;
  items?: Node;
  default?: unknown;
  description?: string;
  default_text?: string;
  env_alias?: string;
}

/** One setting of the schema: a section (an object), a list, or a value. */
export interface Setting {
  /** Dotted, list items as `[]`: `webrtc.udp_port`, `providers[].timeout_ms`. */
  key: string;
  depth: number;
  kind: "section" | "list" | "value";
  /** The environment variable that sets it: every value outside a list has one, derived from its key. */
  env?: string;
  /** Older names of that variable, still read (a derived name set too wins). */
  aliases: string[];
  /** JSON types the value may take. */
  types: string[];
  enum?: unknown[];
  default?: unknown;
  /** The default as the documentation says it, when it is not a constant (a host name, a path under `data_dir`). */
  defaultText?: string;
  description?: string;
}

const schemaNode = z.toJSONSchema(ConfigSchema, { io: "input", unrepresentable: "any" }) as Node;

const typesOf = (node: Node): string[] => {
  const own = node.type ? [node.type] : [];
  return [...own, ...(node.anyOf ?? []).flatMap(typesOf)];
};

const envName = (key: string) => `PERCH_${key.replace(/\./g, "_").toUpperCase()}`;

function walk(node: Node, key: string, depth: number, inList: boolean, out: Setting[]): void {
  const types = typesOf(node);
  const isList = node.type === "array" && node.items?.properties !== undefined;
  const kind = node.properties ? "section" : isList ? "list" : "value";
  const scalar = kind === "value" && !types.includes("object") && (node.type !== "array" || node.items?.type !== "object");
  // A list's items are described by the list and their own keys.
  if (key && !key.endsWith("[]")) {
    out.push({
      key,
      depth,
      kind,
      env: scalar && !inList ? envName(key) : undefined,
      aliases: node.env_alias ? [node.env_alias] : [],
      types,
      enum: node.enum,
      default: node.default,
      defaultText: node.default_text,
      description: node.description,
    });
  }
  for (const [name, child] of Object.entries(node.properties ?? {})) walk(child, key ? `${key}.${name}` : name, depth + 1, inList, out);
  if (isList && node.items) walk(node.items, `${key}[]`, depth, true, out);
}

/** Every setting, in the schema's order: the one table the variables, the file's old keys and the documentation come from. */
export const SETTINGS: readonly Setting[] = (() => {
  const out: Setting[] = [];
  walk(schemaNode, "", 0, false, out);
  return out;
})();

/** The schema node at a path of a configuration value (list indices step into the list's items). */
function nodeAt(path: readonly PropertyKey[]): Node | undefined {
  let node: Node | undefined = schemaNode;
  for (const p of path) node = typeof p === "number" ? node?.items : node?.properties?.[String(p)];
  return node;
}

/** The keys a section at `path` takes. */
export function keysAt(path: readonly PropertyKey[]): string[] {
  return Object.keys(nodeAt(path)?.properties ?? {});
}

/** A variable's text as the setting's type: `true`/`false`, a number, a comma-separated list; else the text, for the schema to refuse. */
export function fromEnv(setting: Setting, raw: string): unknown {
  const text = raw.trim();
  if (setting.types.includes("boolean") && (text === "true" || text === "false")) return text === "true";
  if ((setting.types.includes("integer") || setting.types.includes("number")) && text !== "" && Number.isFinite(Number(text))) return Number(text);
  if (setting.types.includes("string")) return raw;
  if (setting.types.includes("array"))
    return text
      .split(",")
      .map((s) => s.trim())
      .filter(Boolean);
  return raw;
}

const toSnake = (key: string) => key.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

/**
 * A configuration file's value with the camelCase keys of earlier releases (`dataDir`,
 * `rateLimits.loginPerKey`) renamed to the schema's snake_case, each named in `warnings`. Only keys
 * of the schema's sections are touched: keys of maps (`headers_env`) and values never are.
 */
export function renameOldKeys(value: unknown, warnings: string[], node: Node | undefined = schemaNode, path = ""): unknown {
  if (Array.isArray(value)) return node?.items ? value.map((v, i) => renameOldKeys(v, warnings, node.items, `${path}[${i}]`)) : value;
  const shape = node?.properties;
  if (!shape || !value || typeof value !== "object") return value;
  const out: Record<string, unknown> = {};
  for (const [key, v] of Object.entries(value as Record<string, unknown>)) {
    let name = key;
    if (!(key in shape) && /[A-Z]/.test(key) && toSnake(key) in shape) {
      name = toSnake(key);
      warnings.push(`${path}${key} is read as ${path}${name}; camelCase keys will be refused in the next release`);
    }
    out[name] = renameOldKeys(v, warnings, shape[name], `${path}${name}.`);
  }
  return out;
}

/** Edit distance with transpositions (optimal string alignment): `prot` is one from `port`. */
function distance(a: string, b: string): number {
  const d = Array.from({ length: a.length + 1 }, (_, i) => Array.from({ length: b.length + 1 }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)));
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let v = Math.min(d[i - 1]![j]! + 1, d[i]![j - 1]! + 1, d[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) v = Math.min(v, d[i - 2]![j - 2]! + 1);
      d[i]![j] = v;
    }
  }
  return d[a.length]![b.length]!;
}

/** The valid key of the section at `path` nearest to `key`, when one is near enough to be what was meant. */
export function nearestKey(path: readonly PropertyKey[], key: string): string | undefined {
  const wanted = toSnake(key).toLowerCase();
  let best: { name: string; d: number } | undefined;
  for (const name of keysAt(path)) {
    const d = distance(wanted, name);
    if (!best || d < best.d) best = { name, d };
  }
  return best && best.d <= Math.max(2, Math.floor(wanted.length / 3)) ? best.name : undefined;
}
