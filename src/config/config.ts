import { readFileSync } from "node:fs";
import { hostname } from "node:os";
import proxyAddr from "proxy-addr";
import { parse as parseYaml } from "yaml";
import { z } from "zod";

const perMinute = (n: number) => z.number().int().min(0).default(n);
const count = (n: number) => z.number().int().min(1).default(n);

const LIMIT_DEFAULTS = {
  primarySessionsPerDevice: 32,
  sideControlSessionsPerDevice: 64,
  sideControlSessionsPerController: 256,
  contactsPerDevice: 1000,
  keyCacheSize: 10_000,
  rateLimiterKeys: 100_000,
};

const IceServerConfig = z.strictObject({
  urls: z.array(z.string().regex(/^(stun|stuns|turn|turns):[^\s]+$/, "ICE server URLs must start with stun:, stuns:, turn: or turns:")).min(1),
  username: z.string().optional(),
  credential: z.string().optional(),
  /** TURN REST shared secret: credentials are minted per response instead of `username`/`credential`. */
  secret: z.string().optional(),
  /** Optional suffix of minted usernames (`<expiry>:<name>`). */
  name: z.string().optional(),
});

const BOOLEAN_WORDS = new Set(["true", "false", "1", "0", "yes", "no"]);

/**
 * The proxies whose `X-Forwarded-For` entries are believed: what `proxy-addr` takes (addresses,
 * CIDR ranges, `loopback`, `linklocal`, `uniquelocal`), as a list or one comma-separated string.
 * The boolean this setting once was is refused with the new form, rather than read as something.
 */
const TrustProxy = z.union([z.string(), z.array(z.string()), z.boolean()]).transform((value, ctx) => {
  const list = (typeof value === "string" ? value.split(",") : Array.isArray(value) ? value : []).map((s) => s.trim()).filter(Boolean);
  if (typeof value === "boolean" || (typeof value === "string" && BOOLEAN_WORDS.has(value.trim().toLowerCase()))) {
    ctx.addIssue({
      code: "custom",
      message: `takes the trusted proxies' addresses, no longer a boolean: e.g. PERCH_TRUST_PROXY=loopback,10.0.0.0/8 or trust_proxy: [loopback, 10.0.0.0/8] (got ${JSON.stringify(value)})`,
    });
    return z.NEVER;
  }
  try {
    proxyAddr.compile(list);
  } catch (err) {
    ctx.addIssue({ code: "custom", message: `${(err as Error).message}; expected addresses, CIDR ranges, loopback, linklocal or uniquelocal` });
    return z.NEVER;
  }
  return list;
});

const ID = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$/, "must be 1–128 letters, digits or . _ : / -");

/** The built-in tools an agent may list (see src/ai/agents/tools.ts). */
export const AGENT_TOOLS = ["device_status", "device_runtime", "device_telemetry", "contacts_list"] as const;
/** A tool's name as MCP offers it (tools.md §1). */
export const TOOL_NAME = /^[a-zA-Z0-9_.-]{1,64}$/;
/** An `agents[].tools` entry naming MCP tools: `device.<name>` or `<server id>.<name>`, `*` a wildcard within the name. */
const TOOL_PATTERN = /^([A-Za-z0-9_-]{1,64})\.([a-zA-Z0-9_.*-]{1,64})$/;

const ProviderConfig = z.strictObject({
  id: ID,
  kind: z.enum(["openai", "openai-compatible", "anthropic", "google"]),
  /** Required for `openai-compatible`; the others default to their public endpoint. */
  base_url: z.url({ protocol: /^https?$/ }).optional(),
  /** The environment variable that holds the provider's key (never the key itself). */
  api_key_env: z.string().min(1).optional(),
  /** Idle timeout: the longest wait for the answer to start, and between two pieces of it. */
  timeout_ms: z.number().int().min(1).max(3_600_000).default(60_000),
  /** Overall deadline of one call, however steadily the answer trickles in. */
  deadline_ms: z.number().int().min(1).max(3_600_000).default(600_000),
  max_retries: z.number().int().min(0).max(10).default(2),
  /** First back-off; doubled on each retry (with jitter), or the provider's `Retry-After` when shorter than 10 s. */
  retry_backoff_ms: z.number().int().min(0).max(60_000).default(250),
  /** Voice conversations' calls (synthesis, recognition) in flight to this provider at once; one more fails its turn at once. */
  voice_max_in_flight: z.number().int().min(1).max(10_000).default(32),
  /**
   * Whether the provider takes dots in tool names. OpenAI and Anthropic refuse them: their models
   * see `device.set_volume` as `device__set_volume` (tools.md §1) and Perch maps the name back.
   */
  dotted_tool_names: z.boolean().optional(),
});

/** The embedded engines' model ids: always in the catalog when the engine exists. */
export const EMBEDDED_SPEECH_MODEL = "tts-1";
export const EMBEDDED_TRANSCRIPTION_MODEL = "whisper-1";
const EMBEDDED_MODEL = { speech: EMBEDDED_SPEECH_MODEL, transcription: EMBEDDED_TRANSCRIPTION_MODEL } as const;

/** A BCP-47 language tag (`es`, `pt-BR`, `zh-Hans`): its first subtag is the language. */
const LanguageTag = z.string().regex(/^[A-Za-z]{2,3}(-[A-Za-z0-9]{1,8})*$/, "must be a BCP-47 language tag such as es or pt-BR");

const ModelConfig = z.strictObject({
  id: ID,
  /** `realtime`: a speech-to-speech model on the OpenAI Realtime API (voice.md §6). */
  kind: z.enum(["chat", "speech", "transcription", "realtime"]),
  provider: ID,
  upstream_model: z.string().min(1),
  fallbacks: z.array(ID).default([]),
  /** Content parts a chat model accepts besides text. */
  input: z.array(z.enum(["image", "audio"])).default([]),
  /** A transcription model whose provider streams partial text (`transcript.text.delta` events). */
  stream: z.boolean().default(false),
});

const AgentConfig = z.strictObject({
  id: ID,
  model: ID,
  instructions: z.string().default(""),
  /** The voice of the agent's speech model, passed to it as is. */
  voice: z.string().min(1).optional(),
  /** The speech model (kind `speech`) a conversation's replies are spoken with. */
  speech_model: ID.default(EMBEDDED_SPEECH_MODEL),
  /** The transcription model (kind `transcription`) a conversation's turns are heard with. */
  transcription_model: ID.default(EMBEDDED_TRANSCRIPTION_MODEL),
  /** The language the device's user speaks, sent to the transcription model. */
  language: LanguageTag.optional(),
  /** Built-in tool names, `device.*` / `device.<name>` (the calling device's own), `<server id>.<name>` with `*` as a wildcard (tools.md §2). */
  tools: z
    .array(
      z.string().refine((t) => (AGENT_TOOLS as readonly string[]).includes(t) || TOOL_PATTERN.test(t), {
        message: `must be a built-in tool (${AGENT_TOOLS.join(", ")}), device.* or device.<name>, or <server id>.<name> (* a wildcard)`,
      }),
    )
    .default([]),
  /** How long a device or MCP server tool call may take before it fails as a tool error. */
  tool_timeout_ms: z.number().int().min(1).max(600_000).default(10_000),
  /** A device or MCP server tool's result reaches the model cut to this many characters, with a note that it was cut. */
  tool_result_max_chars: z.number().int().min(1).max(4_194_304).default(65_536),
  max_steps: z.number().int().min(1).max(32).default(4),
  /** The most tokens one model call of this agent writes (sent as `max_tokens`; a request's own lower limit wins). */
  max_tokens: z.number().int().min(1).max(1_000_000).optional(),
  /** A realtime agent's turn detection (voice.md §6): the provider's `server_vad` or `semantic_vad`, or the node's own voice activity. */
  turn_detection: z.enum(["server_vad", "semantic_vad", "node"]).optional(),
  /** A realtime agent's input transcription model (default `gpt-4o-mini-transcribe`); false: none. */
  input_transcription: z.union([z.string().min(1), z.literal(false)]).optional(),
  /** What the agent remembers of each device's people between conversations (public-api.md, "Memory"). */
  memory: z
    .strictObject({
      enabled: z.boolean().default(false),
      /** The memory's length at most, in Unicode code points. */
      max_chars: z.number().int().min(1).max(20_000).default(2_000),
      /** The chat model (of `models`) that rewrites the memory after a conversation; default the agent's own. */
      model: ID.optional(),
      /** A conversation with no turn for this long has ended (its memory is rewritten; the next turn starts a new one). */
      idle_ms: z.number().int().min(1_000).max(86_400_000).default(120_000),
    })
    .optional(),
});

/** An MCP server whose tools agents may use (Streamable HTTP; tools.md §2). */
const McpServerConfig = z.strictObject({
  id: z
    .string()
    .regex(/^[A-Za-z0-9_-]{1,64}$/, "must be 1–64 letters, digits, _ or -")
    .refine((id) => id !== "device", "device names the calling device's own tools"),
  url: z.url({ protocol: /^https?$/ }),
  /** Header name → the environment variable holding its value (values never written in the file). */
  headers_env: z.record(z.string().regex(/^[A-Za-z0-9-]{1,128}$/, "must be a header name"), z.string().min(1)).default({}),
  /** Connecting, listing and each call wait at most this long. */
  timeout_ms: z.number().int().min(1).max(600_000).default(10_000),
  /**
   * How often a connected server is asked (MCP `ping`, answered within the lesser of `timeout_ms` and
   * 10 s) whether it is still there: a server gone away is noticed within 30 s with no call made.
   */
  ping_interval_ms: z.number().int().min(100).max(20_000).default(10_000),
});

const ApiKeyConfig = z.strictObject({
  name: z.string().min(1).max(128),
  /** SHA-256 of the key, hex. */
  sha256: z
    .string()
    .regex(/^[0-9a-fA-F]{64}$/, "must be 64 hex digits (the SHA-256 of the key)")
    .transform((h) => h.toLowerCase()),
  /** Model and agent ids this key may use; `*` is any. */
  models: z.array(z.string().min(1)).default(["*"]),
  /** Requests a minute; 0 is unlimited. */
  rate_limit: z.number().int().min(0).default(0),
});

const TURN_DEFAULTS = { min_speech_ms: 200, silence_ms: 400, max_ms: 30_000 };
const VOICE_DEFAULTS = {
  barge_in: true,
  history_turns: 20,
  max_reply_delay_ms: 2_000,
  max_reply_chars: 2_000,
  store_transcripts: false,
  transcript_retention_days: 30,
  turn: TURN_DEFAULTS,
};

/** Voice conversations over a connected device's audio (voice.md). */
export const VoiceConfig = z.strictObject({
  /** The agent (`agents[].id`) that answers every connected device by default; absent, no device converses. */
  agent: ID.optional(),
  /** Speech during a reply interrupts it; devices without echo cancellation need false. */
  barge_in: z.boolean().default(true),
  /** Turns of history kept per conversation (in memory, for the connection's life). */
  history_turns: z.number().int().min(1).max(200).default(20),
  /**
   * A turn whose final transcript or first reply sentence cannot start on the embedded engines
   * within this ends with `overloaded` error events instead of answering late.
   */
  max_reply_delay_ms: z.number().int().min(1).max(60_000).default(2_000),
  /** Characters of a reply spoken at most: the rest is not, and the model call ends there. */
  max_reply_chars: z.number().int().min(1).max(100_000).default(2_000),
  /** Conversations' transcripts are stored for the device's Side Control (public-api.md, "Conversations"); off, they are only live. */
  store_transcripts: z.boolean().default(false),
  /** Stored conversations are deleted this many days after their last entry. */
  transcript_retention_days: z.number().int().min(1).max(3_650).default(30),
  turn: z
    .strictObject({
      /** Voice activity shorter than this is a noise, not speech. */
      min_speech_ms: z.number().int().min(20).max(5_000).default(200),
      /** Silence that ends a turn. */
      silence_ms: z.number().int().min(100).max(10_000).default(400),
      /** A turn ends here however long the user speaks. */
      max_ms: z.number().int().min(1_000).max(300_000).default(30_000),
    })
    .default(TURN_DEFAULTS),
});

export type ProviderConfig = z.infer<typeof ProviderConfig>;
export type ModelConfig = z.infer<typeof ModelConfig>;
export type AgentConfig = z.infer<typeof AgentConfig>;
export type ApiKeyConfig = z.infer<typeof ApiKeyConfig>;
export type VoiceConfig = z.infer<typeof VoiceConfig>;
export type McpServerConfig = z.infer<typeof McpServerConfig>;

/** Splits an `agents[].tools` entry naming MCP tools into its source (`device` or a server id) and name pattern. */
export function toolPattern(entry: string): { source: string; name: string } | undefined {
  const m = TOOL_PATTERN.exec(entry);
  return m ? { source: m[1]!, name: m[2]! } : undefined;
}

/** Every setting. A config file (YAML or JSON) supplies any of them; environment variables win. */
export const ConfigSchema = z
  .strictObject({
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
    /** Proxies trusted to append the client address to `X-Forwarded-For`; none by default (the socket's address is the client's). */
    trustProxy: TrustProxy.default([]),
    http: z
      .strictObject({
        /** Time to receive a whole request, headers and body (408 after it). */
        requestTimeoutMs: z.number().int().min(1).default(30_000),
        /** Open connections this node accepts at once; more are closed on arrival. */
        maxConnections: z.number().int().min(1).default(10_000),
      })
      .default({ requestTimeoutMs: 30_000, maxConnections: 10_000 }),
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
        /** A device that sent nothing for this long is asked `all.ping` (see docs/decisions.md, liveness). */
        livenessQuietMs: z.number().int().min(500).max(60_000).default(5_000),
        /** A device that does not answer that ping within this is taken as gone and its connection closed. */
        livenessProbeTimeoutMs: z.number().int().min(500).max(60_000).default(5_000),
        /** On SQLite: how often the node looks for another process's commit (a session revoked, a peer blocked or removed with the command line). */
        peerPollMs: z.number().int().min(0).max(60_000).default(500),
        /** How often the node checks which of its peers connected to another node since (replacement across nodes). */
        ownershipCheckMs: z.number().int().min(100).max(60_000).default(2_000),
        /** How often connected peers' rx/tx bytes and address are written (the contract: at least every 10 s). */
        runtimeRefreshMs: z.number().int().min(100).max(10_000).default(5_000),
        /** How long gathering this node's candidates may take before an offer is answered 500 ANSWER_FAILED. */
        gatherTimeoutMs: z.number().int().min(100).max(60_000).default(5_000),
        /** A Peer RPC request (stream 0) that has not arrived whole, end-of-stream included, within this has its stream closed. */
        rpcRequestTimeoutMs: z.number().int().min(100).max(60_000).default(10_000),
      })
      .default({
        enabled: true,
        maxConnections: 2000,
        livenessQuietMs: 5_000,
        livenessProbeTimeoutMs: 5_000,
        peerPollMs: 500,
        ownershipCheckMs: 2_000,
        runtimeRefreshMs: 5_000,
        gatherTimeoutMs: 5_000,
        rpcRequestTimeoutMs: 10_000,
      }),
    /** Growth bounds per device and per key (see docs/decisions.md). */
    limits: z
      .strictObject({
        primarySessionsPerDevice: count(LIMIT_DEFAULTS.primarySessionsPerDevice),
        sideControlSessionsPerDevice: count(LIMIT_DEFAULTS.sideControlSessionsPerDevice),
        sideControlSessionsPerController: count(LIMIT_DEFAULTS.sideControlSessionsPerController),
        contactsPerDevice: count(LIMIT_DEFAULTS.contactsPerDevice),
        /** Cached X25519 results (one per caller key), least recently used dropped first. */
        keyCacheSize: count(LIMIT_DEFAULTS.keyCacheSize),
        /** Keys (addresses, peer keys) each rate limiter remembers; the least recently used are forgotten first. */
        rateLimiterKeys: count(LIMIT_DEFAULTS.rateLimiterKeys),
      })
      .default(LIMIT_DEFAULTS),
    telemetry: z
      .strictObject({
        /** Samples older than this are deleted by the cleanup job. */
        retentionDays: z.number().positive().max(36_500).default(30),
        /**
         * Samples a node holds in memory waiting to be stored (a slow store, or one that cannot be
         * reached); frames beyond are dropped and counted (`perch_telemetry_frames_dropped_total`).
         */
        bufferSamples: z.number().int().min(1).max(10_000_000).default(100_000),
        /** At most this long between a frame's arrival and the transaction that stores it (fewer than 500 samples waiting). */
        writeIntervalMs: z.number().int().min(1).max(60_000).default(250),
      })
      .default({ retentionDays: 30, bufferSamples: 100_000, writeIntervalMs: 250 }),
    /** Bounds of the Compatible API against hostile callers (see docs/decisions.md, issue 17). */
    compat: z
      .strictObject({
        /** Longest audio a transcription decodes, in seconds; longer is refused with a 400 naming the limit. */
        maxAudioSeconds: z.number().positive().max(86_400).default(600),
        /** A client that takes none of a response's waiting bytes for this long is disconnected. */
        writeTimeoutMs: z.number().int().min(1).max(3_600_000).default(30_000),
        /** An embedded-engine request (speech, transcription) that cannot start within this is refused at once: 429 with Retry-After. */
        maxQueueWaitMs: z.number().int().min(1).max(600_000).default(10_000),
      })
      .default({ maxAudioSeconds: 600, writeTimeoutMs: 30_000, maxQueueWaitMs: 10_000 }),
    /** The embedded engines (one set per process, however many servers it starts; the first server's settings apply). */
    engines: z
      .strictObject({
        /**
         * Recogniser processes (Moonshine, 350–580 MB resident each, README). One uses every core for each
         * recognition; more run recognitions side by side, one core each, which shortens the queue
         * when many conversations end their turns at once (docs/benchmarks.md, voice). With two or
         * more, the first is kept for conversations (never taken by file transcription or partials),
         * the others run at a lower OS priority. Unset: two on a machine with ≥ 2 cores and ≥ 4 GiB
         * of memory, else one (src/node/recogniser-processes.ts).
         */
        recogniserProcesses: z.number().int().min(1).max(16).optional(),
        /**
         * A conversation turn whose transcript Moonshine base would give later than this many ms
         * after it was asked for (the recogniser's queue measured) is recognised by Moonshine tiny
         * instead: the reply on time, more words wrong. `false`: base only.
         */
        fastRecognitionAfterMs: z.union([z.number().int().min(1).max(60_000), z.literal(false)]).default(600),
      })
      .default({ fastRecognitionAfterMs: 600 }),
    /** The companion web app (`/app/`). */
    app: z
      .strictObject({
        /** Map tiles under the GNSS track, e.g. `https://tiles.example.org/{z}/{x}/{y}.png`; none by default (the track is drawn on a plain grid, offline). */
        tileUrl: z
          .string()
          .regex(/^https?:\/\/[^/\s"'<>]+\/[^\s"'<>]*$/, "must be an http(s) URL")
          .refine((u) => ["{z}", "{x}", "{y}"].every((p) => u.includes(p)), "must contain {z}, {x} and {y}")
          .optional(),
      })
      .default({}),
    providers: z.array(ProviderConfig).default([]),
    models: z.array(ModelConfig).default([]),
    agents: z.array(AgentConfig).default([]),
    mcp_servers: z.array(McpServerConfig).default([]),
    api_keys: z.array(ApiKeyConfig).default([]),
    voice: VoiceConfig.default(VOICE_DEFAULTS),
  })
  .superRefine(checkCatalog);

/** Cross-references of the Compatible API's catalog: every id it names must exist, with the right kind. */
function checkCatalog(
  c: {
    providers: ProviderConfig[];
    models: ModelConfig[];
    agents: AgentConfig[];
    mcp_servers: McpServerConfig[];
    api_keys: ApiKeyConfig[];
    voice: VoiceConfig;
  },
  ctx: z.RefinementCtx,
): void {
  const issue = (path: (string | number)[], message: string) => ctx.addIssue({ code: "custom", path, message });
  const providers = new Map(c.providers.map((p) => [p.id, p]));
  const models = new Map(c.models.map((m) => [m.id, m]));
  const unique = (ids: string[], section: string, field: string) => {
    const seen = new Set<string>();
    ids.forEach((id, i) => {
      if (seen.has(id)) issue([section, i, field], `duplicate ${field} ${id}`);
      seen.add(id);
    });
  };
  unique(
    c.providers.map((p) => p.id),
    "providers",
    "id",
  );
  unique(
    c.models.map((m) => m.id),
    "models",
    "id",
  );
  unique(
    c.agents.map((a) => a.id),
    "agents",
    "id",
  );
  c.agents.forEach((a, i) => {
    if (models.has(a.id)) issue(["agents", i, "id"], `agent id ${a.id} is also a model id`);
  });
  unique(
    c.api_keys.map((k) => k.sha256),
    "api_keys",
    "sha256",
  );
  c.providers.forEach((p, i) => {
    if (p.kind === "openai-compatible" && !p.base_url) issue(["providers", i, "base_url"], "required for kind openai-compatible");
  });
  c.models.forEach((m, i) => {
    const provider = providers.get(m.provider);
    if (!provider) issue(["models", i, "provider"], `unknown provider ${m.provider}`);
    else if (m.kind !== "chat" && provider.kind !== "openai" && provider.kind !== "openai-compatible") {
      issue(["models", i, "provider"], `${m.kind} models need an openai or openai-compatible provider`);
    }
    if (m.kind !== "chat" && m.input.length > 0) issue(["models", i, "input"], "only chat models take input kinds");
    if (m.kind !== "transcription" && m.stream) issue(["models", i, "stream"], "only transcription models stream");
    if (m.kind === "realtime" && m.fallbacks.length > 0)
      issue(["models", i, "fallbacks"], "a realtime model has no fallbacks (its conversation holds one session)");
    m.fallbacks.forEach((f, j) => {
      const target = models.get(f);
      // The embedded engine may close a speech or transcription model's list: it answers when every provider failed.
      if ((m.kind === "speech" || m.kind === "transcription") && f === EMBEDDED_MODEL[m.kind]) {
        if (j !== m.fallbacks.length - 1) issue(["models", i, "fallbacks", j], `${f} (the embedded engine) can only be the last fallback`);
      } else if (!target) issue(["models", i, "fallbacks", j], `unknown model ${f}`);
      else if (f === m.id) issue(["models", i, "fallbacks", j], "a model cannot be its own fallback");
      else if (target.kind !== m.kind) issue(["models", i, "fallbacks", j], `${f} is a ${target.kind} model, not ${m.kind}`);
    });
  });
  unique(
    c.mcp_servers.map((m) => m.id),
    "mcp_servers",
    "id",
  );
  const servers = new Set(c.mcp_servers.map((m) => m.id));
  c.agents.forEach((a, i) => {
    a.tools.forEach((t, j) => {
      const p = toolPattern(t);
      if (p && p.source !== "device" && !servers.has(p.source)) issue(["agents", i, "tools", j], `unknown MCP server ${p.source} (mcp_servers)`);
    });
  });
  c.agents.forEach((a, i) => {
    const model = models.get(a.model);
    if (!model) issue(["agents", i, "model"], `unknown model ${a.model}`);
    else if (model.kind !== "chat" && model.kind !== "realtime") issue(["agents", i, "model"], `${a.model} is not a chat or realtime model`);
    if (model?.kind !== "realtime") {
      if (a.turn_detection !== undefined) issue(["agents", i, "turn_detection"], "only an agent whose model is realtime takes turn_detection");
      if (a.input_transcription !== undefined) issue(["agents", i, "input_transcription"], "only an agent whose model is realtime takes input_transcription");
    }
    for (const kind of ["speech", "transcription"] as const) {
      const id = kind === "speech" ? a.speech_model : a.transcription_model;
      const field = `${kind}_model`;
      if (id === EMBEDDED_MODEL[kind]) continue;
      const m = models.get(id);
      if (!m) issue(["agents", i, field], `unknown model ${id}`);
      else if (m.kind !== kind) issue(["agents", i, field], `${id} is a ${m.kind} model, not ${kind}`);
    }
    // A realtime model cannot rewrite a memory: such an agent names a chat model for it.
    if (a.memory?.enabled && a.memory.model === undefined && model?.kind === "realtime")
      issue(["agents", i, "memory", "model"], `agent ${a.id} converses on a realtime model: its memory needs a chat model (memory.model)`);
    if (a.memory?.model !== undefined) {
      const m = models.get(a.memory.model);
      if (!m) issue(["agents", i, "memory", "model"], `unknown model ${a.memory.model}`);
      else if (m.kind !== "chat") issue(["agents", i, "memory", "model"], `${a.memory.model} is a ${m.kind} model, not chat`);
    }
  });
  if (c.voice.agent !== undefined && !c.agents.some((a) => a.id === c.voice.agent)) issue(["voice", "agent"], `unknown agent ${c.voice.agent}`);
  const ids = new Set([...models.keys(), ...c.agents.map((a) => a.id), "tts-1", "whisper-1"]);
  c.api_keys.forEach((k, i) => {
    k.models.forEach((m, j) => {
      if (m !== "*" && !ids.has(m)) issue(["api_keys", i, "models", j], `unknown model ${m}`);
    });
  });
}

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
  PERCH_APP_TILE_URL: (v) => ({ app: { tileUrl: v } }),
  PERCH_LOG_LEVEL: (v) => ({ logLevel: v as Config["logLevel"] }),
  PERCH_TRUST_PROXY: (v) => ({ trustProxy: v }),
  PERCH_REGISTRATION_POLICY: (v) => ({ registration: { policy: v as "open" } }),
  PERCH_WEBRTC_UDP_PORT: (v) => ({ webrtc: { udpPort: Number(v) } }),
  PERCH_WEBRTC_MAX_CONNECTIONS: (v) => ({ webrtc: { maxConnections: Number(v) } }),
  PERCH_VOICE_AGENT: (v) => ({ voice: { agent: v } }),
  PERCH_VOICE_STORE_TRANSCRIPTS: (v) => ({ voice: { store_transcripts: v === "true" ? true : v === "false" ? false : (v as unknown as boolean) } }),
  PERCH_MAX_AUDIO_SECONDS: (v) => ({ compat: { maxAudioSeconds: Number(v) } }),
  PERCH_TELEMETRY_BUFFER_SAMPLES: (v) => ({ telemetry: { bufferSamples: Number(v) } }),
  PERCH_TELEMETRY_WRITE_INTERVAL_MS: (v) => ({ telemetry: { writeIntervalMs: Number(v) } }),
  PERCH_WRITE_TIMEOUT_MS: (v) => ({ compat: { writeTimeoutMs: Number(v) } }),
  PERCH_MAX_QUEUE_WAIT_MS: (v) => ({ compat: { maxQueueWaitMs: Number(v) } }),
  PERCH_RECOGNISER_PROCESSES: (v) => ({ engines: { recogniserProcesses: Number(v) } }),
  PERCH_FAST_RECOGNITION_AFTER_MS: (v) => ({ engines: { fastRecognitionAfterMs: v === "false" ? false : Number(v) } }),
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

const toSnake = (key: string) => key.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
const toCamel = (key: string) => key.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase());

/** What a schema holds under its wrappers (defaults, optionals, pipes): an object's shape, an array's element. */
function unwrap(schema: z.ZodType | undefined): { shape?: Record<string, z.ZodType>; element?: z.ZodType } {
  for (let s = schema, i = 0; s && i < 20; i++) {
    const def = (s as unknown as { _zod: { def: Record<string, any> } })._zod.def;
    if (def.type === "object") return { shape: def.shape };
    if (def.type === "array") return { element: def.element };
    s = def.innerType ?? def.in ?? def.schema;
  }
  return {};
}

/**
 * The configuration file in the documented case, snake_case (`data_dir`, `rate_limits.login_per_key`,
 * `voice.store_transcripts`), mapped onto the schema's own names, which the code reads (camelCase at
 * the top level and in some sections). The old camelCase keys are still read, for a release, each
 * named once in `warnings`. Guided by the schema: keys of maps and values are left alone.
 */
function fileKeys(value: unknown, schema: z.ZodType | undefined, path: string, warnings: string[]): unknown {
  const { shape, element } = unwrap(schema);
  if (Array.isArray(value)) return element ? value.map((v, i) => fileKeys(v, element, `${path}[${i}]`, warnings)) : value;
  if (!shape || !value || typeof value !== "object") return value;
  const out: Record<string, unknown> = {};
  for (const [key, v] of Object.entries(value as Record<string, unknown>)) {
    const camelCase = /[A-Z]/.test(key);
    if (camelCase && (key in shape || toSnake(key) in shape))
      warnings.push(`${path}${key} is read as ${path}${toSnake(key)}; camelCase keys will be refused in the next release`);
    const name = key in shape ? key : camelCase ? toSnake(key) : toCamel(key);
    const internal = name in shape ? name : key;
    out[internal] = fileKeys(v, shape[internal], `${path}${toSnake(key)}.`, warnings);
  }
  return out;
}

const WARNINGS = new WeakMap<Config, string[]>();

/** What loading `config` warned of (the old camelCase keys of its file), for the node to log at start. */
export function configWarnings(config: Config): readonly string[] {
  return WARNINGS.get(config) ?? [];
}

/** Builds the configuration from `PERCH_CONFIG` (file), then `PERCH_*` variables, then `overrides`. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env, overrides: ConfigInput = {}): Config {
  const warnings: string[] = [];
  let input = (env.PERCH_CONFIG ? fileKeys(readConfigFile(env.PERCH_CONFIG), ConfigSchema, "", warnings) : {}) as Record<string, unknown>;
  for (const [name, apply] of Object.entries(ENV)) {
    const value = env[name];
    if (value !== undefined && value !== "") input = merge(input, apply(value) as Record<string, unknown>);
  }
  input = merge(input, overrides as Record<string, unknown>);
  const parsed = ConfigSchema.safeParse(input);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new ConfigError(
      `invalid configuration at ${issue?.path.map((p) => (typeof p === "string" ? toSnake(p) : p)).join(".") || "(root)"}: ${issue?.message}`,
    );
  }
  if (warnings.length > 0) WARNINGS.set(parsed.data, warnings);
  return parsed.data;
}
