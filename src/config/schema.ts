import { hostname } from "node:os";
import proxyAddr from "proxy-addr";
import { z } from "zod";

/**
 * Every setting, snake_case at every level, each with its description: the environment variables
 * (src/config/settings.ts) and docs/configuration.md (`npm run -s docs:config`) are derived from
 * this schema. Metadata besides `description`: `default_text` (the default as the docs say it, when
 * it is not a constant), `env_alias` (a variable's name from before the names were derived).
 */
const info = (description: string, extra: { default_text?: string; env_alias?: string } = {}) => ({ description, ...extra });

const perMinute = (n: number, what: string) =>
  z
    .number()
    .int()
    .min(0)
    .default(n)
    .meta(info(`${what}: requests a minute (a burst of the same); 0 turns it off`));
const count = (n: number, description: string) => z.number().int().min(1).default(n).meta(info(description));

const LIMIT_DEFAULTS = {
  primary_sessions_per_device: 32,
  side_control_sessions_per_device: 64,
  side_control_sessions_per_controller: 256,
  contacts_per_device: 1000,
  key_cache_size: 10_000,
  rate_limiter_keys: 100_000,
};

const IceServerConfig = z.strictObject({
  urls: z
    .array(z.string().regex(/^(stun|stuns|turn|turns):[^\s]+$/, "ICE server URLs must start with stun:, stuns:, turn: or turns:"))
    .min(1)
    .meta(info("the server's URLs: only `stun:`, `stuns:`, `turn:`, `turns:`")),
  username: z.string().optional().meta(info("a TURN server's fixed user name")),
  credential: z.string().optional().meta(info("a TURN server's fixed credential")),
  secret: z.string().optional().meta(info("TURN REST shared secret: credentials are minted per response instead of `username`/`credential`")),
  name: z.string().optional().meta(info("optional suffix of minted user names (`<expiry>:<name>`)")),
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

/** The built-in tools an agent may list (see src/ai/agents/builtin-tools.ts). */
export const AGENT_TOOLS = ["device_status", "device_runtime", "device_telemetry", "contacts_list"] as const;
/** A tool's name as MCP offers it (tools.md §1). */
export const TOOL_NAME = /^[a-zA-Z0-9_.-]{1,64}$/;
/** An `agents[].tools` entry naming MCP tools: `device.<name>` or `<server id>.<name>`, `*` a wildcard within the name. */
const TOOL_PATTERN = /^([A-Za-z0-9_-]{1,64})\.([a-zA-Z0-9_.*-]{1,64})$/;

const ProviderConfig = z.strictObject({
  id: ID.meta(info("the provider's id, which `models[].provider` names")),
  kind: z.enum(["openai", "openai-compatible", "anthropic", "google"]).meta(info("the provider's API")),
  base_url: z
    .url({ protocol: /^https?$/ })
    .optional()
    .meta(info("required for `openai-compatible`; the others default to their public endpoint")),
  api_key_env: z
    .string()
    .min(1)
    .optional()
    .meta(info("the environment variable that holds the provider's key (never the key itself); a variable not set is warned of at start-up")),
  timeout_ms: z
    .number()
    .int()
    .min(1)
    .max(3_600_000)
    .default(60_000)
    .meta(info("idle timeout: the longest wait for the answer to start, and between two pieces of it")),
  deadline_ms: z
    .number()
    .int()
    .min(1)
    .max(3_600_000)
    .default(600_000)
    .meta(info("overall deadline of one call, however steadily the answer trickles in (not retried)")),
  max_retries: z.number().int().min(0).max(10).default(2).meta(info("retries of a call that failed before its first byte")),
  retry_backoff_ms: z
    .number()
    .int()
    .min(0)
    .max(60_000)
    .default(250)
    .meta(info("first back-off; doubled on each retry (with jitter), or the provider's `Retry-After` when shorter than 10 s")),
  voice_max_in_flight: z
    .number()
    .int()
    .min(1)
    .max(10_000)
    .default(32)
    .meta(
      info(
        "voice conversations' calls (synthesis, recognition) in flight to this provider at once; one more fails its turn at once, or goes to the model's next fallback",
      ),
    ),
  dotted_tool_names: z
    .boolean()
    .optional()
    .meta(
      info("whether the provider takes dots in tool names; without, `device.set_volume` is offered as `device__set_volume` and mapped back (tools.md §1)", {
        default_text: "`true` for `openai-compatible` and `google`, `false` for `openai` and `anthropic`",
      }),
    ),
});

/** The embedded engines' model ids: always in the catalog when the engine exists. */
export const EMBEDDED_SPEECH_MODEL = "tts-1";
export const EMBEDDED_TRANSCRIPTION_MODEL = "whisper-1";
const EMBEDDED_MODEL = { speech: EMBEDDED_SPEECH_MODEL, transcription: EMBEDDED_TRANSCRIPTION_MODEL } as const;

/** A BCP-47 language tag (`es`, `pt-BR`, `zh-Hans`): its first subtag is the language. */
const LanguageTag = z.string().regex(/^[A-Za-z]{2,3}(-[A-Za-z0-9]{1,8})*$/, "must be a BCP-47 language tag such as es or pt-BR");

const ModelConfig = z.strictObject({
  id: ID.meta(info("the model's id, as clients and agents name it")),
  kind: z
    .enum(["chat", "speech", "transcription", "realtime"])
    .meta(
      info(
        "`speech` and `transcription` need an `openai` or `openai-compatible` provider (relayed to its `/audio/*`); `realtime`: a speech-to-speech model on the OpenAI Realtime API (voice.md §6)",
      ),
    ),
  provider: ID.meta(info("the provider (`providers[].id`) that serves it")),
  upstream_model: z.string().min(1).meta(info("the model's name at the provider")),
  fallbacks: z
    .array(ID)
    .default([])
    .meta(
      info(
        "model ids of the same kind tried in order when this one fails before its first byte; a speech model's list may end with the embedded `tts-1`, a transcription model's with `whisper-1`",
      ),
    ),
  input: z
    .array(z.enum(["image", "audio"]))
    .default([])
    .meta(info("content parts a chat model accepts besides text: `image`, `audio`")),
  stream: z.boolean().default(false).meta(info("a transcription model whose provider streams partial text (`transcript.text.delta` events)")),
});

export const DEFAULT_LIMITED_REPLY = "I need a rest now. Let's talk again tomorrow!";

const AgentConfig = z.strictObject({
  id: ID.meta(info("the agent's id, used as a model id by clients (not also a model's id)")),
  model: ID.meta(info("the chat model it thinks with")),
  instructions: z.string().default("").meta(info("the system prompt")),
  voice: z.string().min(1).optional().meta(info("the voice of the agent's speech model, passed to it as is")),
  speech_model: ID.default(EMBEDDED_SPEECH_MODEL).meta(info("the speech model (kind `speech`) its voice conversations' replies are spoken with")),
  transcription_model: ID.default(EMBEDDED_TRANSCRIPTION_MODEL).meta(
    info("the transcription model (kind `transcription`) its voice conversations' turns are heard with"),
  ),
  language: LanguageTag.optional().meta(info("the language (BCP-47, e.g. `es`, `pt-BR`) the device's user speaks, sent to the transcription model")),
  tools: z
    .array(
      z.string().refine((t) => (AGENT_TOOLS as readonly string[]).includes(t) || TOOL_PATTERN.test(t), {
        message: `must be a built-in tool (${AGENT_TOOLS.join(", ")}), device.* or device.<name>, or <server id>.<name> (* a wildcard)`,
      }),
    )
    .default([])
    .meta(
      info(
        `the built-ins (${AGENT_TOOLS.map((t) => `\`${t}\``).join(", ")}), \`device.*\` or \`device.<name>\` (the calling device's own tools), \`<server id>.<name>\` with \`*\` as a wildcard`,
      ),
    ),
  tool_timeout_ms: z
    .number()
    .int()
    .min(1)
    .max(600_000)
    .default(10_000)
    .meta(info("how long a device or MCP server tool call may take before it fails as a tool error")),
  tool_result_max_chars: z
    .number()
    .int()
    .min(1)
    .max(4_194_304)
    .default(65_536)
    .meta(info("a device or MCP server tool's result reaches the model cut to this many characters, with a note that it was cut")),
  tool_arguments_max_chars: z
    .number()
    .int()
    .min(2)
    .max(1_048_576)
    .default(65_536)
    .meta(info("a tool call's arguments longer than this are not parsed and the call is not run: the model gets a tool error saying so")),
  max_steps: z.number().int().min(1).max(32).default(4).meta(info("model calls of one request at most; the last offers no tools, so the model has to answer")),
  max_tokens: z
    .number()
    .int()
    .min(1)
    .max(1_000_000)
    .optional()
    .meta(info("the most tokens one model call of this agent writes (sent as `max_tokens`; a request's own lower limit wins)")),
  turn_detection: z
    .enum(["server_vad", "semantic_vad", "node"])
    .optional()
    .meta(info("a realtime agent's turn detection (voice.md §6): the provider's `server_vad` or `semantic_vad`, or the node's own voice activity")),
  input_transcription: z
    .union([z.string().min(1), z.literal(false)])
    .optional()
    .meta(info("a realtime agent's input transcription model; `false`: none", { default_text: "`gpt-4o-mini-transcribe`" })),
  limited_reply: z
    .string()
    .min(1)
    .max(500)
    .default(DEFAULT_LIMITED_REPLY)
    .meta(info("what a device hears, in the agent's voice, for a turn its usage limit refuses (synthesised once and kept; docs/usage.md)")),
  memory: z
    .strictObject({
      enabled: z.boolean().default(false).meta(info("the agent remembers each device's people between conversations")),
      max_chars: z.number().int().min(1).max(20_000).default(2_000).meta(info("the memory's length at most, in Unicode code points")),
      model: ID.optional().meta(info("the chat model (of `models`) that rewrites the memory after a conversation", { default_text: "the agent's own" })),
      idle_ms: z
        .number()
        .int()
        .min(1_000)
        .max(86_400_000)
        .default(120_000)
        .meta(info("a conversation with no turn for this long has ended (its memory is rewritten; the next turn starts a new one)")),
    })
    .optional()
    .meta(info('what the agent remembers of each device\'s people between conversations (public-api.md, "Memory")')),
  record: z
    .strictObject({
      audio: z.boolean().default(false).meta(info("each turn's two sides are kept as Ogg Opus with the stored conversation (needs `voice.store_transcripts`)")),
      retention_days: z.number().int().min(1).max(3_650).default(7).meta(info("a turn's recording is deleted this many days after it was made")),
    })
    .optional()
    .meta(info("recordings of the agent's voice turns (voice.md §8; docs/observability.md)")),
});

/** An MCP server whose tools agents may use (Streamable HTTP; tools.md §2). */
const McpServerConfig = z.strictObject({
  id: z
    .string()
    .regex(/^[A-Za-z0-9_-]{1,64}$/, "must be 1–64 letters, digits, _ or -")
    .refine((id) => id !== "device", "device names the calling device's own tools")
    .meta(info("the server's id, which agents' `tools` name (`<id>.<tool>`); not `device`")),
  url: z.url({ protocol: /^https?$/ }).meta(info("its Streamable HTTP endpoint")),
  headers_env: z
    .record(z.string().regex(/^[A-Za-z0-9-]{1,128}$/, "must be a header name"), z.string().min(1))
    .default({})
    .meta(info("header name → the environment variable holding its value (values never written in the file)")),
  timeout_ms: z.number().int().min(1).max(600_000).default(10_000).meta(info("connecting, listing and each call wait at most this long")),
  ping_interval_ms: z
    .number()
    .int()
    .min(100)
    .max(20_000)
    .default(10_000)
    .meta(
      info(
        "how often a connected server is asked (MCP `ping`, answered within the lesser of `timeout_ms` and 10 s) whether it is still there: a server gone away is noticed within 30 s with no call made",
      ),
    ),
});

/** What usage counts (usage.md §1), in the order the views list them. */
export const USAGE_COUNTERS = ["requests", "input_tokens", "output_tokens", "speech_chars", "audio_seconds", "tool_calls"] as const;
/** What a limit may bound (usage.md §2); `tokens` is input plus output. */
export const LIMIT_COUNTERS = ["requests", "tokens", "speech_chars", "audio_seconds"] as const;

const limitValue = (what: string) =>
  z
    .number()
    .int()
    .min(0)
    .optional()
    .meta(info(`${what} at most in the period (0: none allowed)`));
const LIMIT_FIELDS = {
  per: z.enum(["day", "month"]).meta(info("the period, in UTC: `day` or `month`")),
  agent: ID.optional().meta(info("only this agent's or model's use counts (and is refused)", { default_text: "all of the principal's use" })),
  requests: limitValue("answered requests (voice turns, chat completions, speech and transcription requests)"),
  tokens: limitValue("input plus output tokens"),
  speech_chars: limitValue("characters synthesised"),
  audio_seconds: limitValue("seconds of audio transcribed, or sent to and from a realtime model"),
};
const someCounter = (l: Partial<Record<(typeof LIMIT_COUNTERS)[number], number>>) => LIMIT_COUNTERS.some((c) => l[c] !== undefined);
const NO_COUNTER = { message: `a limit needs at least one of ${LIMIT_COUNTERS.join(", ")}` };

/** One limit of `usage.limits` (usage.md §2). */
export const UsageLimitConfig = z
  .strictObject({
    scope: z
      .enum(["device", "all_devices", "api_key"])
      .meta(info("`device` (each device alone), `all_devices` (their sum) or `api_key` (each operator API key alone)")),
    ...LIMIT_FIELDS,
  })
  .refine(someCounter, NO_COUNTER);
/** One limit of an API key's own `limits`: that key's, so without `scope`. */
export const KeyLimitConfig = z.strictObject(LIMIT_FIELDS).refine(someCounter, NO_COUNTER);
export type UsageLimitConfig = z.infer<typeof UsageLimitConfig>;
export type KeyLimitConfig = z.infer<typeof KeyLimitConfig>;

const ApiKeyConfig = z.strictObject({
  name: z.string().min(1).max(128).meta(info("the key's name: the application calling with it")),
  sha256: z
    .string()
    .regex(/^[0-9a-fA-F]{64}$/, "must be 64 hex digits (the SHA-256 of the key)")
    .transform((h) => h.toLowerCase())
    .meta(info("SHA-256 of the key, hex (`perch api-key` makes one): the key itself is never stored")),
  models: z.array(z.string().min(1)).default(["*"]).meta(info("model and agent ids this key may use; `*` is any")),
  rate_limit: z.number().int().min(0).default(0).meta(info("requests a minute; 0 is unlimited")),
  limits: z
    .array(KeyLimitConfig)
    .default([])
    .meta(info("this key's own usage limits (docs/usage.md): `{per, agent?, requests?, tokens?, speech_chars?, audio_seconds?}`, beside `usage.limits`")),
});

const TURN_DEFAULTS = {
  min_speech_ms: 200,
  silence_ms: 400,
  finished_silence_ms: 250,
  unfinished_silence_ms: 1_200,
  preemptive: true,
  preemptive_after_ms: 150,
  max_ms: 30_000,
};
const INTERRUPTION_DEFAULTS = { min_ms: 400, min_words: 1, resume_ms: 600 };
const VOICE_DEFAULTS = {
  barge_in: true,
  history_turns: 20,
  max_reply_delay_ms: 2_000,
  max_reply_chars: 2_000,
  store_transcripts: false,
  transcript_retention_days: 30,
  turn: TURN_DEFAULTS,
  interruption: INTERRUPTION_DEFAULTS,
};

/** Voice conversations over a connected device's audio (voice.md). */
export const VoiceConfig = z.strictObject({
  agent: ID.optional().meta(info("the agent (`agents[].id`) that converses with every connected device over its audio; absent, no device converses")),
  barge_in: z.boolean().default(true).meta(info("speech during a reply interrupts it; devices without echo cancellation need `false`")),
  audio_threads: z
    .number()
    .int()
    .min(0)
    .max(16)
    .optional()
    .meta(
      info(
        'worker threads that decode the devices\' audio (each conversation on one); default one a core, at most 4; 0: on the main thread (docs/voice.md, "Silence" and "Threads")',
      ),
    ),
  history_turns: z.number().int().min(1).max(200).default(20).meta(info("turns of history kept per conversation (in memory, for the connection's life)")),
  max_reply_delay_ms: z
    .number()
    .int()
    .min(1)
    .max(60_000)
    .default(2_000)
    .meta(
      info(
        "a turn whose final transcript or first reply sentence cannot start on the embedded engines within this ends with `overloaded` error events instead of a late reply",
      ),
    ),
  max_reply_chars: z
    .number()
    .int()
    .min(1)
    .max(100_000)
    .default(2_000)
    .meta(
      info(
        "characters of a reply spoken at most: the rest is not spoken, the model call ends there, the history keeps what was said, and `turn.metrics` says `reply_cut: true`",
      ),
    ),
  store_transcripts: z
    .boolean()
    .default(false)
    .meta(
      info("keep conversations' transcripts in the store for the device's Side Control (listed, read and deleted in the app); off, they are only shown live"),
    ),
  transcript_retention_days: z.number().int().min(1).max(3_650).default(30).meta(info("a stored conversation is deleted this many days after its last entry")),
  turn: z
    .strictObject({
      min_speech_ms: z.number().int().min(20).max(5_000).default(200).meta(info("voice activity shorter than this is a noise, not speech")),
      silence_ms: z
        .number()
        .int()
        .min(100)
        .max(10_000)
        .default(400)
        .meta(info("silence that ends a turn whose words look neither finished nor unfinished, and every turn in another language than English")),
      finished_silence_ms: z
        .number()
        .int()
        .min(100)
        .max(10_000)
        .default(250)
        .meta(info("silence that ends a turn whose words look finished: a complete question or command (docs/turn-taking.md)")),
      unfinished_silence_ms: z
        .number()
        .int()
        .min(100)
        .max(10_000)
        .default(1_200)
        .meta(info('silence that ends a turn whose words look unfinished: a trailing "and", "the", "for", "um", a number being said')),
      preemptive: z
        .boolean()
        .default(true)
        .meta(info("ask the model already in the pause with the words so far; its reply is used only if the turn ends with the same words")),
      preemptive_after_ms: z.number().int().min(0).max(10_000).default(150).meta(info("silence after which the preemptive request starts")),
      max_ms: z.number().int().min(1_000).max(300_000).default(30_000).meta(info("a turn ends here however long the user speaks (and is answered)")),
    })
    .refine((t) => t.finished_silence_ms <= t.silence_ms && t.silence_ms <= t.unfinished_silence_ms, {
      message: "finished_silence_ms <= silence_ms <= unfinished_silence_ms is required",
      path: ["silence_ms"],
    })
    .default(TURN_DEFAULTS)
    .meta(info("turn-taking")),
  interruption: z
    .strictObject({
      min_ms: z.number().int().min(0).max(10_000).default(400).meta(info("speech over a reply is a barge-in only once it lasts this long…")),
      min_words: z
        .number()
        .int()
        .min(1)
        .max(20)
        .default(1)
        .meta(info('…and brings at least this many words that are not fillers or backchannels ("hm", "yeah", "okay")')),
      resume_ms: z
        .number()
        .int()
        .min(100)
        .max(10_000)
        .default(600)
        .meta(info("otherwise the reply resumes where it paused at most this long after the sound ended")),
    })
    .default(INTERRUPTION_DEFAULTS)
    .meta(info("speech over a reply (voice.md §7): it pauses the reply; only some of it is a barge-in")),
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
/** Traces over OTLP/HTTP (protobuf) to a collector (voice.md §8); nothing is traced without `otlp.endpoint`. */
const TracingConfig = z.strictObject({
  otlp: z
    .strictObject({
      endpoint: z
        .url({ protocol: /^https?$/ })
        .meta(info("the collector's OTLP/HTTP base URL (e.g. `http://collector:4318`); spans are posted to `<endpoint>/v1/traces`")),
      headers_env: z
        .record(z.string().regex(/^[A-Za-z0-9-]{1,128}$/, "must be a header name"), z.string().min(1))
        .default({})
        .meta(info("header name → the environment variable holding its value (a backend's key; values never written in the file)")),
      timeout_ms: z.number().int().min(100).max(60_000).default(10_000).meta(info("one export waits at most this long for the collector")),
      max_queue_size: z
        .number()
        .int()
        .min(1)
        .max(1_000_000)
        .default(2048)
        .meta(info("finished spans waiting for export at most; more are dropped (counted in `perch_tracing_spans_dropped_total`)")),
      max_export_batch_size: z.number().int().min(1).max(100_000).default(512).meta(info("spans per export request at most")),
      schedule_delay_ms: z.number().int().min(1).max(600_000).default(2000).meta(info("finished spans wait at most this long before they are exported")),
    })
    .optional()
    .meta(info("the OpenTelemetry Collector (or any OTLP/HTTP backend) spans go to", { default_text: "none: tracing is off" })),
  service_name: z.string().min(1).default("perch").meta(info("`service.name` of the spans (`service.instance.id` is `node_name`)")),
  sample_ratio: z
    .number()
    .min(0)
    .max(1)
    .default(1)
    .meta(
      info(
        "the share of traces kept, each request's or turn's decided at random when it begins (1: every one; the others are not traced at all, as with tracing off, and their log lines carry no trace id): for a busy Compatible API",
      ),
    ),
  include_text: z.boolean().default(false).meta(info("put what people said (transcripts, reply text, tool arguments) in span attributes; never without this")),
});

export const ConfigSchema = z
  .strictObject({
    port: z.number().int().min(0).max(65535).default(8080).meta(info("listen port (`0`: any free port)")),
    host: z.string().min(1).default("0.0.0.0").meta(info("listen address")),
    data_dir: z.string().min(1).default("./data").meta(info("created mode 0700: the server key (`server.key`, mode 0600) and the SQLite files (mode 0600)")),
    database_url: z
      .string()
      .optional()
      .meta(info("`postgres://…` selects PostgreSQL; otherwise a SQLite file path", { default_text: "SQLite `<data_dir>/perch.db`" })),
    server_key_file: z
      .string()
      .optional()
      .meta(info("the X25519 key pair file; nodes sharing one database must share this file", { default_text: "`<data_dir>/server.key`" })),
    public_endpoint: z
      .string()
      .optional()
      .meta(
        info("`host:port` clients should use, published in `/server-info` and used by `perch device … token` for the phone link", {
          default_text: "the listen address",
        }),
      ),
    tls: z
      .strictObject({
        cert_file: z.string().min(1).meta(info("the certificate (PEM), with its chain when it has one")),
        key_file: z.string().min(1).meta(info("its private key (PEM)")),
      })
      .optional()
      .meta(
        info(
          "serve HTTPS instead of HTTP on `port` (the app's pairing link then says `https`); both files are read at start-up, which refuses one it cannot read or a key that does not match the certificate",
          { default_text: "none: plain HTTP" },
        ),
      ),
    node_name: z
      .string()
      .min(1)
      .default(hostname())
      .meta(
        info("this node's name in logs and runtime records; a node restarting under its name clears what a crashed run of it left", {
          default_text: "the host name",
        }),
      ),
    log_level: z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info").meta(info("`fatal` … `trace`, or `silent`")),
    trust_proxy: TrustProxy.default([]).meta(
      info(
        "trusted proxies (comma-separated, or a list in the file): addresses, CIDR ranges, `loopback`, `linklocal`, `uniquelocal`; the client address is then the hop the nearest untrusted proxy appended to `X-Forwarded-For`",
        { default_text: "none (the socket's address is the client's)" },
      ),
    ),
    http: z
      .strictObject({
        request_timeout_ms: z.number().int().min(1).default(30_000).meta(info("time to receive a whole request, headers and body (then 408)")),
        max_connections: z.number().int().min(1).default(10_000).meta(info("open connections per node; more are closed on arrival")),
      })
      .default({ request_timeout_ms: 30_000, max_connections: 10_000 })
      .meta(info("the HTTP listener")),
    registration: z
      .strictObject({
        policy: z.enum(["open", "token", "closed"]).default("open").meta(info("`open`, `token` or `closed`")),
        tokens: z.array(z.string().min(1)).default([]).meta(info("registration tokens for policy `token` (comma-separated in the variable)")),
      })
      .default({ policy: "open", tokens: [] })
      .meta(info("who may register a new device")),
    rate_limits: z
      .strictObject({
        login_per_key: perMinute(30, "logins per device key"),
        login_per_address: perMinute(600, "logins per client address"),
        device_token_per_device: perMinute(30, "device tokens minted per device"),
        offer_per_key: perMinute(30, "WebRTC offers per device key"),
      })
      .default({ login_per_key: 30, login_per_address: 600, device_token_per_device: 30, offer_per_key: 30 })
      .meta(info("requests a minute; 0 turns a limit off")),
    ice: z
      .strictObject({
        servers: z
          .array(IceServerConfig)
          .default([])
          .meta(info("STUN and TURN servers given to clients: `{urls, username?, credential?}` or, for TURN REST, `{urls, secret, name?}`")),
      })
      .default({ servers: [] })
      .meta(info("ICE servers")),
    webrtc: z
      .strictObject({
        enabled: z.boolean().default(true).meta(info("answer WebRTC offers on this node")),
        udp_port: z
          .number()
          .int()
          .min(0)
          .max(65535)
          .optional()
          .meta(info("the one UDP port of every WebRTC connection", { default_text: "the HTTP port's number" })),
        max_connections: z.number().int().min(0).default(2000).meta(info("connections per node; more offers get 503 `CAPACITY_EXCEEDED`")),
        liveness_quiet_ms: z
          .number()
          .int()
          .min(500)
          .max(60_000)
          .default(5_000)
          .meta(info("a device that sent nothing for this long is asked `all.ping` (docs/decisions.md, liveness)")),
        liveness_probe_timeout_ms: z
          .number()
          .int()
          .min(500)
          .max(60_000)
          .default(5_000)
          .meta(info("a device that does not answer that ping within this is taken as gone (closed, offline)")),
        peer_poll_ms: z
          .number()
          .int()
          .min(0)
          .max(60_000)
          .default(500)
          .meta(
            info(
              "SQLite only: how often the node looks for another process's commit (a session revoked with `perch sessions revoke`, a peer blocked or removed with `perch peers`: the peer's connection and the affected Side Control event streams end); `0` off",
            ),
          ),
        ownership_check_ms: z
          .number()
          .int()
          .min(100)
          .max(60_000)
          .default(2_000)
          .meta(
            info("how often a node checks which of its peers connected to another node since; below the runtime's staleness window (8 s), checked at start"),
          ),
        runtime_refresh_ms: z
          .number()
          .int()
          .min(100)
          .max(10_000)
          .default(5_000)
          .meta(info("how often connected peers' rx/tx bytes and address are written (the contract: at least every 10 s)")),
        gather_timeout_ms: z
          .number()
          .int()
          .min(100)
          .max(60_000)
          .default(5_000)
          .meta(info("how long gathering this node's candidates may take before an offer is answered 500 `ANSWER_FAILED`")),
        rpc_request_timeout_ms: z
          .number()
          .int()
          .min(100)
          .max(60_000)
          .default(10_000)
          .meta(info("a Peer RPC request (stream 0) that has not arrived whole, end-of-stream included, within this has its stream closed")),
      })
      .default({
        enabled: true,
        max_connections: 2000,
        liveness_quiet_ms: 5_000,
        liveness_probe_timeout_ms: 5_000,
        peer_poll_ms: 500,
        ownership_check_ms: 2_000,
        runtime_refresh_ms: 5_000,
        gather_timeout_ms: 5_000,
        rpc_request_timeout_ms: 10_000,
      })
      .meta(info("devices' WebRTC connections")),
    fleet: z
      .strictObject({
        max_connections: z
          .number()
          .int()
          .min(0)
          .default(0)
          .meta(info("at this many WebRTC connections the node is `full` (offers 503 `NODE_FULL`, `/readyz` 503); `0`: no bound")),
        max_conversations: z.number().int().min(0).default(0).meta(info("at this many voice conversations the node is `full`; `0`: no bound")),
        max_cpu: z
          .number()
          .min(0)
          .max(1)
          .default(0.9)
          .meta(info("share of the machine's cores the process may use, judged over 5 s; at or over it the node is `full`; `0`: off")),
        drain_timeout_s: z
          .number()
          .int()
          .min(0)
          .max(86_400)
          .default(300)
          .meta(info("longest a drain (SIGTERM, `perch nodes drain`) waits for talking devices to finish their replies before closing what is left")),
      })
      .default({ max_connections: 0, max_conversations: 0, max_cpu: 0.9, drain_timeout_s: 300 })
      .meta(info("how a node refuses work it cannot carry and drains (fleet.md)")),
    limits: z
      .strictObject({
        primary_sessions_per_device: count(LIMIT_DEFAULTS.primary_sessions_per_device, "live primary sessions per device; a new login signs the oldest out"),
        side_control_sessions_per_device: count(
          LIMIT_DEFAULTS.side_control_sessions_per_device,
          "live Side Control sessions per target device; beyond it a login gets 409 `TOO_MANY_SESSIONS`",
        ),
        side_control_sessions_per_controller: count(
          LIMIT_DEFAULTS.side_control_sessions_per_controller,
          "live Side Control sessions per controller key; beyond it a login gets 409 `TOO_MANY_SESSIONS`",
        ),
        contacts_per_device: count(LIMIT_DEFAULTS.contacts_per_device, "contacts per device (409 `TOO_MANY_CONTACTS`)"),
        key_cache_size: count(LIMIT_DEFAULTS.key_cache_size, "X25519 results cached (one per caller key), least recently used dropped first"),
        rate_limiter_keys: count(
          LIMIT_DEFAULTS.rate_limiter_keys,
          "keys (addresses, peer keys) each rate limiter remembers; the least recently used are forgotten first",
        ),
      })
      .default(LIMIT_DEFAULTS)
      .meta(info("growth bounds per device and per key (docs/decisions.md)")),
    telemetry: z
      .strictObject({
        retention_days: z.number().positive().max(36_500).default(30).meta(info("telemetry samples older than this are deleted by the cleanup job")),
        buffer_samples: z
          .number()
          .int()
          .min(1)
          .max(10_000_000)
          .default(100_000)
          .meta(
            info(
              "samples a node holds in memory while the store is slow or away; frames beyond are dropped and counted (`perch_telemetry_frames_dropped_total`)",
            ),
          ),
        write_interval_ms: z
          .number()
          .int()
          .min(1)
          .max(60_000)
          .default(250)
          .meta(info("longest wait between a telemetry frame's arrival and the transaction that stores it (sooner when 500 samples wait)")),
      })
      .default({ retention_days: 30, buffer_samples: 100_000, write_interval_ms: 250 })
      .meta(info("devices' telemetry")),
    compat: z
      .strictObject({
        max_audio_seconds: z
          .number()
          .positive()
          .max(86_400)
          .default(600)
          .meta(
            info("longest audio a transcription decodes, in seconds; longer is a 400 `audio_too_long` naming the limit", {
              env_alias: "PERCH_MAX_AUDIO_SECONDS",
            }),
          ),
        write_timeout_ms: z
          .number()
          .int()
          .min(1)
          .max(3_600_000)
          .default(30_000)
          .meta(
            info("a client that takes none of its answer's waiting bytes for this long is disconnected (and the upstream call or engine work with it)", {
              env_alias: "PERCH_WRITE_TIMEOUT_MS",
            }),
          ),
        max_queue_wait_ms: z
          .number()
          .int()
          .min(1)
          .max(600_000)
          .default(10_000)
          .meta(
            info(
              "a speech or transcription request on the embedded engines whose first job the queue says cannot start within this is refused at once: 429 with `Retry-After` from the queue's estimate",
              { env_alias: "PERCH_MAX_QUEUE_WAIT_MS" },
            ),
          ),
      })
      .default({ max_audio_seconds: 600, write_timeout_ms: 30_000, max_queue_wait_ms: 10_000 })
      .meta(info("bounds of the Compatible API against hostile callers (docs/decisions.md, issue 17)")),
    engines: z
      .strictObject({
        recogniser_processes: z
          .number()
          .int()
          .min(1)
          .max(16)
          .optional()
          .meta(
            info(
              "recogniser (Moonshine) processes, 350–580 MB each; one uses every core per recognition, more recognise side by side, one core each, for nodes where many voice turns end at once (docs/benchmarks.md); with 2 or more, files use them all while no conversation goes on (a turn then waits for one file job at most); while one does, the first is kept for conversations and the others run files and partials at a lower OS priority",
              { default_text: "2 with ≥ 2 cores and ≥ 4 GiB of memory, else 1", env_alias: "PERCH_RECOGNISER_PROCESSES" },
            ),
          ),
        fast_recognition_after_ms: z
          .union([z.number().int().min(1).max(60_000), z.literal(false)])
          .default(600)
          .meta(
            info(
              "a voice turn whose transcript Moonshine base would give later than this (its queue measured) is recognised by Moonshine tiny instead: on time, with more words wrong (WER 0.16 against 0.10 on the round-trip fixtures); `false`: base only",
              { env_alias: "PERCH_FAST_RECOGNITION_AFTER_MS" },
            ),
          ),
        preload: z
          .union([z.boolean(), z.array(z.enum(["recognition", "voice_activity", "speech"])).min(1)], {
            error: "expected true, false or a list of recognition, voice_activity, speech",
          })
          .default(false)
          .meta(
            info(
              "embedded engines started with the node whatever its agents use: `true` all of them, or a list of `recognition` (the recogniser processes behind `whisper-1`), `voice_activity` (the voice activity process) and `speech` (flite's workers behind `tts-1`, warmed up). With `false` a node starts only what its voice conversations use (the voice activity process when an agent may converse over WebRTC; the recogniser and flite when an agent's transcription or speech model is the embedded one), and any other engine on its first use, which waits for it (the recogniser takes seconds to load): a node whose agents speak on providers stays lean (docs/decisions.md, issue 41); set it on a node that serves `whisper-1` or `tts-1` to API clients and wants their first request fast",
            ),
          ),
      })
      .default({ fast_recognition_after_ms: 600, preload: false })
      .meta(info("the embedded speech engines (one set per process, however many servers it starts; the first server's settings apply)")),
    app: z
      .strictObject({
        tile_url: z
          .string()
          .regex(/^https?:\/\/[^/\s"'<>]+\/[^\s"'<>]*$/, "must be an http(s) URL")
          .refine((u) => ["{z}", "{x}", "{y}"].every((p) => u.includes(p)), "must contain {z}, {x} and {y}")
          .optional()
          .meta(
            info("map tiles under the GNSS track, e.g. `https://tiles.example.org/{z}/{x}/{y}.png`; without it the track is drawn on a plain grid, offline"),
          ),
      })
      .default({})
      .meta(info("the companion web app (`/app/`)")),
    providers: z.array(ProviderConfig).default([]).meta(info("model providers the Compatible API and agents call")),
    models: z.array(ModelConfig).default([]).meta(info("the models clients and agents name")),
    agents: z.array(AgentConfig).default([]).meta(info("agents, each a chat model with instructions and tools")),
    mcp_servers: z.array(McpServerConfig).default([]).meta(info("MCP servers over Streamable HTTP whose tools agents may use")),
    api_keys: z.array(ApiKeyConfig).default([]).meta(info("keys of the Compatible API's applications")),
    voice: VoiceConfig.default(VOICE_DEFAULTS).meta(info("voice conversations over a connected device's audio")),
    tracing: TracingConfig.default({ service_name: "perch", sample_ratio: 1, include_text: false }).meta(
      info("traces of voice turns and HTTP requests to an OpenTelemetry backend (docs/observability.md); off without `tracing.otlp.endpoint`"),
    ),
    usage: z
      .strictObject({
        count: z.boolean().default(true).meta(info("count what devices and API keys use (`false`: nothing is counted or written, and no limit may be set)")),
        retention_days: z.number().int().min(1).max(36_500).default(400).meta(info("days of usage rows kept (UTC days; older ones are deleted)")),
        limits: z
          .array(UsageLimitConfig)
          .default([])
          .meta(info("usage limits (docs/usage.md): `{scope, per, agent?, requests?, tokens?, speech_chars?, audio_seconds?}`")),
      })
      .default({ count: true, retention_days: 400, limits: [] })
      .meta(info("what devices and API keys use, and its limits (docs/usage.md)")),
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
    usage: { count: boolean; limits: UsageLimitConfig[] };
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
    // A recording lives with its stored conversation: without stored transcripts there is none to keep it.
    if (a.record?.audio && !c.voice.store_transcripts)
      issue(["agents", i, "record", "audio"], `agent ${a.id} records audio, which is kept with stored conversations: set voice.store_transcripts: true`);
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
    k.limits.forEach((l, j) => {
      if (l.agent !== undefined && !ids.has(l.agent)) issue(["api_keys", i, "limits", j, "agent"], `unknown agent or model ${l.agent}`);
    });
  });
  if (!c.usage.count) {
    if (c.usage.limits.length > 0) issue(["usage", "limits"], "limits need usage counted (usage.count is false)");
    c.api_keys.forEach((k, i) => {
      if (k.limits.length > 0) issue(["api_keys", i, "limits"], "limits need usage counted (usage.count is false)");
    });
  }
  c.usage.limits.forEach((l, i) => {
    if (l.agent !== undefined && !ids.has(l.agent)) issue(["usage", "limits", i, "agent"], `unknown agent or model ${l.agent}`);
  });
}

export type Config = z.infer<typeof ConfigSchema>;
export type ConfigInput = z.input<typeof ConfigSchema>;
