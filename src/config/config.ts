import { readFileSync } from "node:fs";
import { hostname } from "node:os";
import { parse as parseYaml } from "yaml";
import { z } from "zod";

const perMinute = (n: number) => z.number().int().min(0).default(n);

const IceServerConfig = z.strictObject({
  urls: z.array(z.string().regex(/^(stun|stuns|turn|turns):[^\s]+$/, "ICE server URLs must start with stun:, stuns:, turn: or turns:")).min(1),
  username: z.string().optional(),
  credential: z.string().optional(),
  /** TURN REST shared secret: credentials are minted per response instead of `username`/`credential`. */
  secret: z.string().optional(),
  /** Optional suffix of minted usernames (`<expiry>:<name>`). */
  name: z.string().optional(),
});

/** Every setting. A config file (YAML or JSON) supplies any of them; environment variables win. */
export const ConfigSchema = z.strictObject({
  port: z.number().int().min(0).max(65535).default(8080),
  host: z.string().min(1).default("0.0.0.0"),
  dataDir: z.string().min(1).default("./data"),
  /** `postgres://…` selects PostgreSQL; otherwise a SQLite file (default `<dataDir>/perch.db`). */
  databaseUrl: z.string().optional(),
  /** The X25519 key pair file; default `<dataDir>/server.key`. Nodes sharing one database share this file. */
  serverKeyFile: z.string().optional(),
  /** `host:port` clients should use; default the listen address. */
  publicEndpoint: z.string().optional(),
  /** Name this node writes into runtime records; default the host name. */
  nodeName: z.string().min(1).default(hostname()),
  logLevel: z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info"),
  /** Take the client address from `X-Forwarded-For` (only behind a trusted proxy). */
  trustProxy: z.boolean().default(false),
  registration: z
    .strictObject({
      policy: z.enum(["open", "token", "closed"]).default("open"),
      tokens: z.array(z.string().min(1)).default([]),
    })
    .default({ policy: "open", tokens: [] }),
  /** Requests a minute; 0 turns a limit off. */
  rateLimits: z
    .strictObject({
      loginPerKey: perMinute(30),
      loginPerAddress: perMinute(600),
      deviceTokenPerDevice: perMinute(30),
      offerPerKey: perMinute(30),
    })
    .default({ loginPerKey: 30, loginPerAddress: 600, deviceTokenPerDevice: 30, offerPerKey: 30 }),
  ice: z.strictObject({ servers: z.array(IceServerConfig).default([]) }).default({ servers: [] }),
  webrtc: z
    .strictObject({
      /** Answer offers on this node. */
      enabled: z.boolean().default(true),
      /** The one UDP port of every connection; default the HTTP listener's port number. */
      udpPort: z.number().int().min(0).max(65535).optional(),
      /** Connections this node holds at most; more offers get 503 CAPACITY_EXCEEDED. */
      maxConnections: z.number().int().min(0).default(2000),
    })
    .default({ enabled: true, maxConnections: 2000 }),
});

export type Config = z.infer<typeof ConfigSchema>;
export type ConfigInput = z.input<typeof ConfigSchema>;

/** Environment variables and the setting each one sets. */
const ENV: Record<string, (v: string) => ConfigInput> = {
  PERCH_PORT: (v) => ({ port: Number(v) }),
  PERCH_HOST: (v) => ({ host: v }),
  PERCH_DATA_DIR: (v) => ({ dataDir: v }),
  PERCH_DATABASE_URL: (v) => ({ databaseUrl: v }),
  PERCH_SERVER_KEY_FILE: (v) => ({ serverKeyFile: v }),
  PERCH_PUBLIC_ENDPOINT: (v) => ({ publicEndpoint: v }),
  PERCH_NODE_NAME: (v) => ({ nodeName: v }),
  PERCH_LOG_LEVEL: (v) => ({ logLevel: v as Config["logLevel"] }),
  // Anything but these four words is passed on as text, so validation names the variable's setting.
  PERCH_TRUST_PROXY: (v) => ({ trustProxy: ({ "1": true, true: true, "0": false, false: false } as Record<string, boolean>)[v] ?? (v as never) }),
  PERCH_REGISTRATION_POLICY: (v) => ({ registration: { policy: v as "open" } }),
  PERCH_WEBRTC_UDP_PORT: (v) => ({ webrtc: { udpPort: Number(v) } }),
  PERCH_WEBRTC_MAX_CONNECTIONS: (v) => ({ webrtc: { maxConnections: Number(v) } }),
  PERCH_REGISTRATION_TOKENS: (v) => ({ registration: { tokens: v.split(",").filter(Boolean) } }),
};

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

/** Builds the configuration from `PERCH_CONFIG` (file), then `PERCH_*` variables, then `overrides`. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env, overrides: ConfigInput = {}): Config {
  let input: Record<string, unknown> = env.PERCH_CONFIG ? readConfigFile(env.PERCH_CONFIG) : {};
  for (const [name, apply] of Object.entries(ENV)) {
    const value = env[name];
    if (value !== undefined && value !== "") input = merge(input, apply(value) as Record<string, unknown>);
  }
  input = merge(input, overrides as Record<string, unknown>);
  const parsed = ConfigSchema.safeParse(input);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new ConfigError(`invalid configuration at ${issue?.path.join(".") || "(root)"}: ${issue?.message}`);
  }
  return parsed.data;
}
