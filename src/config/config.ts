import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { parse as parseYaml } from "yaml";
import { type Config, type ConfigInput, ConfigSchema } from "./schema.ts";
import { fromEnv, nearestKey, renameOldKeys, SETTINGS } from "./settings.ts";

export * from "./schema.ts";

export class ConfigError extends Error {}

function readConfigFile(path: string): Record<string, unknown> {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (err) {
    throw new ConfigError(`cannot read config file ${path}: ${(err as Error).message}`);
  }
  let value: unknown;
  try {
    value = /\.json$/i.test(path) ? JSON.parse(text) : parseYaml(text);
  } catch (err) {
    throw new ConfigError(`config file ${path} cannot be parsed: ${(err as Error).message}`);
  }
  if (value === null || value === undefined) return {};
  if (typeof value !== "object" || Array.isArray(value)) throw new ConfigError(`config file ${path} must hold an object`);
  return value as Record<string, unknown>;
}

/** The files read from the working directory when `PERCH_CONFIG` is unset, in this order. */
export const DEFAULT_CONFIG_FILES = ["perch.yaml", "perch.yml", "perch.json"] as const;

/**
 * The configuration file the command line reads: `PERCH_CONFIG` when it is set (set empty: none),
 * else the one of `./perch.yaml`, `./perch.yml`, `./perch.json` in `cwd` that exists. Two of them is
 * an error naming both, rather than a silent choice.
 */
export function configFile(env: NodeJS.ProcessEnv = process.env, cwd: string = process.cwd()): string | undefined {
  if (env.PERCH_CONFIG !== undefined) return env.PERCH_CONFIG || undefined;
  const found = DEFAULT_CONFIG_FILES.filter((name) => existsSync(join(cwd, name)));
  if (found.length > 1) {
    throw new ConfigError(`${found.map((f) => `./${f}`).join(" and ")} are both here: keep one, or name the one to read with PERCH_CONFIG`);
  }
  return found[0];
}

function merge(base: Record<string, unknown>, over: Record<string, unknown>): Record<string, unknown> {
  const out = { ...base };
  for (const [k, v] of Object.entries(over)) {
    const b = out[k];
    out[k] =
      v && typeof v === "object" && !Array.isArray(v) && b && typeof b === "object" && !Array.isArray(b)
        ? merge(b as Record<string, unknown>, v as Record<string, unknown>)
        : v;
  }
  return out;
}

/** Where a loaded configuration keeps its warnings: a property of the object itself (not enumerated, so never compared or copied), no process-wide table. */
const WARNINGS = Symbol("configuration warnings");

/** What loading `config` warned of (the old camelCase keys of its file), for the node to log at start. */
export function configWarnings(config: Config): readonly string[] {
  return (config as Config & { [WARNINGS]?: string[] })[WARNINGS] ?? [];
}

/** Sets `value` at a dotted key inside `input`, making the sections on the way. */
function setAt(input: Record<string, unknown>, key: string, value: unknown): void {
  const parts = key.split(".");
  let at = input;
  for (const part of parts.slice(0, -1)) {
    const next = at[part];
    at = at[part] = next && typeof next === "object" && !Array.isArray(next) ? { ...(next as Record<string, unknown>) } : {};
  }
  at[parts[parts.length - 1]!] = value;
}

/** Builds the configuration from `PERCH_CONFIG` (file), then `PERCH_*` variables (one per setting, see settings.ts), then `overrides`. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env, overrides: ConfigInput = {}): Config {
  const warnings: string[] = [];
  let input = (env.PERCH_CONFIG ? renameOldKeys(readConfigFile(env.PERCH_CONFIG), warnings) : {}) as Record<string, unknown>;
  const fromVariable = new Map<string, string>();
  for (const setting of SETTINGS) {
    if (!setting.env) continue;
    for (const name of [...setting.aliases, setting.env]) {
      const raw = env[name];
      if (raw === undefined || raw === "") continue;
      setAt(input, setting.key, fromEnv(setting, raw));
      fromVariable.set(setting.key, name);
    }
  }
  input = merge(input, overrides as Record<string, unknown>);
  const parsed = ConfigSchema.safeParse(input);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const at = issue.path.join(".");
    let message = issue.message;
    if (issue.code === "unrecognized_keys") {
      const near = issue.keys.flatMap((k: string) => {
        const key = nearestKey(issue.path, k);
        return key ? [{ k, key }] : [];
      });
      if (issue.keys.length === 1 && near.length === 1) message += ` (did you mean ${near[0]!.key}?)`;
      else if (near.length > 0) message += ` (did you mean ${near.map((n) => `${n.key} for ${n.k}`).join(", ")}?)`;
    }
    const variable = fromVariable.get(at);
    throw new ConfigError(`invalid configuration at ${at || "(root)"}${variable ? ` (${variable}=${env[variable]})` : ""}: ${message}`);
  }
  if (warnings.length > 0) Object.defineProperty(parsed.data, WARNINGS, { value: warnings, enumerable: false });
  return parsed.data;
}
