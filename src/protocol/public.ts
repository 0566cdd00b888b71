/**
 * Wire schemas of the Public API. Defined once: the HTTP layer validates with them, the OpenAPI
 * document is generated from them, and the domain and the SDK take their types from them.
 */
import { z } from "@hono/zod-openapi";
import { isStorableText, jsonProblem, MAX_JSON_DEPTH, STORABLE_TEXT_MESSAGE } from "./text.ts";

/**
 * `schema` for a JSON value that is first checked as received (see text.ts): checked before zod
 * parses it, because zod silently drops `__proto__` keys and serialising a hostile depth throws.
 */
const storableJson = <T extends z.ZodType>(schema: T, maxDepth = MAX_JSON_DEPTH) =>
  z.preprocess((value, ctx) => {
    const problem = jsonProblem(value, maxDepth);
    if (problem) ctx.addIssue({ code: "custom", path: problem.path, message: problem.message, input: value });
    return value;
  }, schema);

export const ErrorResponse = z
  .object({
    error: z.object({
      code: z.string().openapi({ example: "INVALID_SESSION" }),
      message: z.string(),
      details: z.record(z.string(), z.unknown()).optional(),
    }),
  })
  .openapi("ErrorResponse");

const Millis = z.number().int().openapi({ description: "Unix milliseconds" });
const Base58Key = z.string().openapi({ description: "X25519 public key, base58 (Bitcoin alphabet)", example: "C6cUahgsea11j7dTmSFiNydnaPG9kg7yPFagXqerHGnC" });

export const IceServer = z.object({ urls: z.array(z.string()), username: z.string().optional(), credential: z.string().optional() }).openapi("IceServer");

export const ServerInfo = z
  .object({
    public_key: Base58Key,
    server_time: Millis,
    version: z.string(),
    build_commit: z.string(),
    protocol: z.literal("gizclaw-webrtc"),
    signaling_path: z.literal("/webrtc/v1/offer"),
    endpoint: z.string().openapi({ description: "host:port clients should use" }),
    ice: z.object({ udp: z.boolean(), tcp: z.boolean() }),
    ice_servers: z.array(IceServer).optional(),
  })
  .openapi("ServerInfo");

export const GrantType = z.enum(["primary", "side_control"]);

export const LoginRequest = z
  .strictObject({
    grant_type: GrantType.optional().openapi({ description: "absent means primary" }),
    device_token: z.string().min(1).optional(),
  })
  .refine((b) => b.grant_type !== "side_control" || b.device_token !== undefined, {
    path: ["device_token"],
    message: "device_token is required for grant_type side_control",
  })
  .refine((b) => b.grant_type === "side_control" || b.device_token === undefined, {
    path: ["device_token"],
    message: "device_token is only accepted with grant_type side_control",
  })
  .openapi("LoginRequest");

export const LoginHeaders = z.object({
  // No pattern: these headers are validated on /login, and a missing or non-bearer Authorization
  // must reach the domain, which answers 401 MISSING_ASSERTION (the contract), not a 400.
  authorization: z.string().openapi({ description: "Bearer <X25519-HS256 assertion>" }),
  "x-public-key": Base58Key,
  "x-registration-token": z.string().optional().openapi({ description: "required under registration policy `token`" }),
});

export const LoginResult = z
  .object({
    access_token: z.string(),
    token_type: z.literal("Bearer"),
    expires_at: Millis,
    session_id: z.string(),
    grant_type: GrantType,
  })
  .openapi("LoginResult");

export const HardwareInfo = z.object({
  manufacturer: z.string().optional(),
  model: z.string().optional(),
  hardware_revision: z.string().optional(),
});

export const DeviceInfo = z
  .object({
    name: z.string().optional(),
    emoji: z.string().optional(),
    hardware: HardwareInfo.optional(),
    identifiers: z
      .object({
        sn: z.string().optional(),
        imeis: z.array(z.object({ name: z.string().optional(), tac: z.string(), serial: z.string() })).optional(),
        labels: z.array(z.object({ key: z.string(), value: z.string() })).optional(),
      })
      .optional(),
  })
  .openapi("DeviceInfo");

export const PeerRole = z.enum(["client", "admin"]);
export const RegistrationStatus = z.enum(["active", "blocked"]);

export const PeerSelf = z
  .object({
    public_key: Base58Key,
    role: PeerRole,
    registration_status: RegistrationStatus,
    device: DeviceInfo,
    created_at: Millis,
  })
  .openapi("PeerSelf");

const MAX_DETAILS_BYTES = 16 * 1024;

export const PeerStatus = z
  .strictObject({
    reported_at: z.iso.datetime({ offset: true }).optional().openapi({ description: "RFC 3339; set to now when absent" }),
    volume: z.number().int().min(0).max(100).optional(),
    muted: z.boolean().optional(),
    battery_percent: z.number().int().min(0).max(100).optional(),
    charging: z.boolean().optional(),
    gnss_latitude: z.number().min(-90).max(90).optional(),
    gnss_longitude: z.number().min(-180).max(180).optional(),
    gnss_altitude_m: z.number().optional(),
    gnss_accuracy_m: z.number().min(0).optional(),
    labels: storableJson(z.record(z.string(), z.string()).refine((l) => Object.keys(l).length <= 64, "at most 64 labels")).optional(),
    details: storableJson(
      z.record(z.string(), z.unknown()).refine((d) => Buffer.byteLength(JSON.stringify(d)) <= MAX_DETAILS_BYTES, "details is over 16 KiB serialised"),
    )
      .optional()
      .openapi({ description: `free-form JSON object, at most 16 KiB serialised and ${MAX_JSON_DEPTH} levels deep` }),
  })
  .openapi("PeerStatus");

export const Runtime = z
  .object({
    online: z.boolean(),
    last_seen_at: z.string().optional().openapi({ description: "RFC 3339" }),
    last_addr: z.string().optional().openapi({ description: "ip:port" }),
    rx_bytes: z.number().int().optional(),
    tx_bytes: z.number().int().optional(),
    node: z.string().optional(),
  })
  .openapi("Runtime");

export const DeviceToken = z.object({ id: z.string(), token: z.string(), expires_at: Millis }).openapi("DeviceToken");

export const SideControlSession = z
  .object({ id: z.string(), controller_public_key: Base58Key, issued_at: Millis, expires_at: Millis })
  .openapi("SideControlSession");
export const SideControlSessionList = z.object({ items: z.array(SideControlSession) }).openapi("SideControlSessionList");

export const TELEMETRY_FIELDS = [
  "battery.percent",
  "battery.charging",
  "battery.voltage_mv",
  "gnss.latitude",
  "gnss.longitude",
  "gnss.altitude_m",
  "gnss.accuracy_m",
  "network.rssi_dbm",
  "network.signal_level",
  "network.connected",
  "system.uptime_seconds",
  "system.free_memory_bytes",
  "system.temperature_c",
] as const;
export const TelemetryField = z.enum(TELEMETRY_FIELDS).openapi("TelemetryField");
export type TelemetryField = z.infer<typeof TelemetryField>;

/** An integer query parameter: the text must be a plain decimal integer that a double holds exactly. */
const intParam = (description: string) =>
  z
    .string()
    .regex(/^-?\d{1,16}$/, "must be a decimal integer")
    .refine((text) => Number.isSafeInteger(Number(text)), "must be within ±(2^53 − 1)")
    .transform(Number)
    .openapi({ type: "integer", description });

export const TelemetryLatestQuery = z.strictObject({
  fields: z
    .string()
    .transform((s, ctx) => {
      const names = s
        .split(",")
        .map((f) => f.trim())
        .filter(Boolean);
      for (const name of names) {
        if (!TelemetryField.safeParse(name).success) {
          ctx.addIssue({ code: "custom", message: `unknown telemetry field ${name}` });
          return z.NEVER;
        }
      }
      return names as TelemetryField[];
    })
    .optional()
    .openapi({ description: "comma-separated telemetry fields; default all", example: "battery.percent,gnss.latitude" }),
});

export const TelemetryLatest = z
  .object({
    peer_public_key: Base58Key,
    values: z.array(z.object({ field: TelemetryField, value: z.number(), observed_at_unix_ms: Millis })),
  })
  .openapi("TelemetryLatest");

const timeWindow = {
  start_time_ms: intParam("inclusive start, Unix ms; default end − 24 h").optional(),
  end_time_ms: intParam("exclusive end, Unix ms; default now + 1").optional(),
};

export const TelemetryRangeQuery = z
  .strictObject({
    field: TelemetryField,
    ...timeWindow,
    step_ms: intParam("0 or absent: raw points; else the last value in each step").optional(),
    limit: intParam("default 240, at most 1000").optional(),
    order: z.enum(["asc", "desc"]).optional(),
  })
  .refine((q) => q.step_ms === undefined || q.step_ms >= 0, { path: ["step_ms"], message: "step_ms must not be negative" })
  .refine((q) => q.limit === undefined || (q.limit >= 1 && q.limit <= 1000), { path: ["limit"], message: "limit must be 1..1000" });

export const TelemetryRange = z
  .object({
    peer_public_key: Base58Key,
    field: TelemetryField,
    start_time_ms: Millis,
    end_time_ms: Millis,
    step_ms: z.number().int(),
    points: z.array(z.object({ observed_at_unix_ms: Millis, value: z.number() })),
  })
  .openapi("TelemetryRange");

export const AggregateFunction = z.enum(["avg", "min", "max", "sum", "count", "last"]);

export const TelemetryAggregateQuery = z
  .strictObject({
    field: TelemetryField,
    ...timeWindow,
    bucket_ms: intParam("bucket width, > 0; at most 1000 buckets in the window"),
    aggregate: AggregateFunction,
  })
  .refine((q) => q.bucket_ms > 0, { path: ["bucket_ms"], message: "bucket_ms must be positive" });

export const TelemetryAggregate = z
  .object({
    peer_public_key: Base58Key,
    field: TelemetryField,
    aggregate: AggregateFunction,
    bucket_ms: z.number().int(),
    points: z.array(z.object({ bucket_start_time_ms: Millis, value: z.number() })),
  })
  .openapi("TelemetryAggregate");

export const Contact = z
  .object({
    name: z.string(),
    display_name: z.string().optional(),
    phone_number: z.string().optional(),
    created_at: z.iso.datetime({ offset: true }).openapi({ description: "RFC 3339" }),
    updated_at: z.iso.datetime({ offset: true }).openapi({ description: "RFC 3339" }),
  })
  .openapi("Contact");

// Control characters are refused in contact text: they are never meant, and PostgreSQL cannot store NUL.
const CONTROL = /\p{Cc}/u;

export const ContactName = z
  .string()
  .min(1)
  .max(64)
  .refine((n) => n.trim() === n, "name must not start or end with white space")
  .refine((n) => !CONTROL.test(n), "name must not contain control characters")
  .refine(isStorableText, `name ${STORABLE_TEXT_MESSAGE}`)
  // URLs normalise these dot segments away (also written %2E%2E): such a contact could never be addressed.
  .refine((n) => n !== "." && n !== "..", "name must not be . or .. (it would not survive as a URL path segment)");

const PHONE_NUMBER = /^\+?[0-9 ()-]*[0-9][0-9 ()-]*$/;

// `null` or a blank string clears a field (on PUT; on create it is the same as absent).
const DisplayName = z
  .string()
  .max(256)
  .refine((n) => !CONTROL.test(n), "display_name must not contain control characters")
  .refine(isStorableText, `display_name ${STORABLE_TEXT_MESSAGE}`)
  .nullable()
  .optional();
const PhoneNumber = z
  .string()
  .max(64)
  .refine((p) => p.trim() === "" || PHONE_NUMBER.test(p.trim()), "digits with an optional leading + and separators (space, -, (, ))")
  .nullable()
  .optional();

export const ContactCreate = z.strictObject({ name: ContactName, display_name: DisplayName, phone_number: PhoneNumber }).openapi("ContactCreate");

export const ContactUpdate = z.strictObject({ display_name: DisplayName, phone_number: PhoneNumber }).openapi("ContactUpdate");

export const ContactList = z.object({ items: z.array(Contact), has_next: z.boolean(), next_cursor: z.string().optional() }).openapi("ContactList");

export const ContactListQuery = z.strictObject({
  cursor: z.string().optional(),
  limit: intParam("default 50, at most 200")
    .refine((n) => n >= 1 && n <= 200, "limit must be 1..200")
    .optional(),
});

/** One entry of a device's voice conversation: live as the `conversation` event, stored in `Conversation.items`. */
export const ConversationEntry = z
  .object({
    conversation_id: z.string().openapi({ description: "one connection of the device" }),
    turn: z.number().int().min(1).openapi({ description: "the conversation's turn, from 1" }),
    role: z.enum(["user", "assistant", "tool"]),
    text: z.string().openapi({ description: "the user's transcript, what the device said, or the tool's result" }),
    at_unix_ms: Millis,
    interrupted: z.boolean().optional().openapi({ description: "a reply cut short by the user (barge-in): `text` is what was spoken" }),
    tool: z.object({ name: z.string(), is_error: z.boolean() }).optional(),
    metrics: z
      .record(z.string(), z.unknown())
      .optional()
      .openapi({ description: "a stored entry's turn's `turn.metrics` (voice.md §3), once the turn finished" }),
  })
  .openapi("ConversationEntry");

export const ConversationSummary = z
  .object({
    id: z.string(),
    started_at_unix_ms: Millis,
    ended_at_unix_ms: Millis.optional(),
    turns: z.number().int(),
    last_text: z.string(),
    first_question: z
      .string()
      .optional()
      .openapi({ description: "What the user said first in the conversation (its first user entry); absent when the user said nothing" }),
  })
  .openapi("ConversationSummary");

export const ConversationList = z
  .object({
    stored: z.boolean().openapi({ description: "false while the server does not store transcripts (then no items)" }),
    items: z.array(ConversationSummary),
    has_next: z.boolean(),
    next_cursor: z.string().optional(),
  })
  .openapi("ConversationList");

export const RecordingSide = z.enum(["user", "assistant"]);

export const TurnRecording = z
  .object({ turn: z.number().int().min(1), side: RecordingSide, duration_ms: z.number().int().min(0) })
  .openapi("TurnRecording", { description: "one side of a turn kept as Ogg Opus (voice.md §8)" });

export const Conversation = z
  .object({
    id: z.string(),
    started_at_unix_ms: Millis,
    items: z.array(ConversationEntry),
    recordings: z
      .array(TurnRecording)
      .optional()
      .openapi({ description: "the turns' recordings kept (agents with `record.audio`), for `…/turns/{turn}/audio?side=`; absent when none" }),
  })
  .openapi("Conversation");

/** `GET /side-control/conversations/{id}/turns/{turn}/audio?side=` (voice.md §8). */
export const TurnAudioParams = z.strictObject({
  id: z.string(),
  turn: z
    .string()
    .regex(/^[1-9][0-9]{0,8}$/, "turn must be a whole number from 1")
    .transform(Number)
    .openapi({ param: { name: "turn", in: "path" }, type: "integer", example: 1 }),
});
export const TurnAudioQuery = z.strictObject({ side: RecordingSide });

export const ConversationListQuery = z.strictObject({
  cursor: z.string().optional(),
  limit: intParam("default 20, at most 100")
    .refine((n) => n >= 1 && n <= 100, "limit must be 1..100")
    .optional(),
});

/** What the device's agent remembers of its people (public-api.md, "Memory"). */
export const MemoryView = z
  .object({
    enabled: z.boolean().openapi({ description: "the device's agent remembers and the device's people have not turned it off" }),
    text: z.string().openapi({ description: "the memory, plain text; empty when there is none" }),
    updated_at_unix_ms: Millis.optional().openapi({ description: "when the text last changed" }),
    max_chars: z.number().int().min(0).openapi({ description: "its length at most (Unicode code points); 0 when the device's agent does not remember" }),
  })
  .openapi("Memory");

export const MemoryUpdate = z
  .strictObject({
    text: z
      .string()
      .refine(isStorableText, `text ${STORABLE_TEXT_MESSAGE}`)
      .optional()
      .openapi({ description: "the new text (at most `max_chars`); empty clears it" }),
    enabled: z.boolean().optional().openapi({ description: "false: nothing is written after conversations and nothing is given to the model" }),
  })
  .refine((u) => u.text !== undefined || u.enabled !== undefined, "give text, enabled or both")
  .openapi("MemoryUpdate");

export type ServerInfo = z.infer<typeof ServerInfo>;
export type LoginRequest = z.infer<typeof LoginRequest>;
export type LoginResult = z.infer<typeof LoginResult>;
export type DeviceInfo = z.infer<typeof DeviceInfo>;
export type PeerSelf = z.infer<typeof PeerSelf>;
export type PeerStatus = z.infer<typeof PeerStatus>;
export type Runtime = z.infer<typeof Runtime>;
export type DeviceToken = z.infer<typeof DeviceToken>;
export type SideControlSession = z.infer<typeof SideControlSession>;
export type SideControlSessionList = z.infer<typeof SideControlSessionList>;
export type TelemetryLatest = z.infer<typeof TelemetryLatest>;
export type TelemetryRange = z.infer<typeof TelemetryRange>;
export type TelemetryAggregate = z.infer<typeof TelemetryAggregate>;
export type AggregateFunction = z.infer<typeof AggregateFunction>;
export type Contact = z.infer<typeof Contact>;
export type ContactCreate = z.infer<typeof ContactCreate>;
export type ContactUpdate = z.infer<typeof ContactUpdate>;
export type ContactList = z.infer<typeof ContactList>;
export type ErrorResponse = z.infer<typeof ErrorResponse>;
export type ConversationEntry = z.infer<typeof ConversationEntry>;
export type ConversationSummary = z.infer<typeof ConversationSummary>;
export type ConversationList = z.infer<typeof ConversationList>;
export type Conversation = z.infer<typeof Conversation>;
const UsageCounts = z
  .object({
    requests: z.number().int().min(0),
    input_tokens: z.number().int().min(0),
    output_tokens: z.number().int().min(0),
    speech_chars: z.number().int().min(0),
    audio_seconds: z.number().min(0),
    tool_calls: z.number().int().min(0),
  })
  .openapi("UsageCounts", { description: "what was used (audio in seconds)" });
const UsageLimits = z
  .object({
    requests: z.number().int().min(0).optional(),
    tokens: z.number().int().min(0).optional(),
    speech_chars: z.number().int().min(0).optional(),
    audio_seconds: z.number().int().min(0).optional(),
  })
  .openapi("UsageLimits", { description: "the limits of the period; only the counters that have one" });
const UsagePeriod = z
  .object({
    used: UsageCounts,
    limits: UsageLimits,
    resets_at_unix_ms: Millis.openapi({ description: "when the period ends (UTC)" }),
  })
  .openapi("UsagePeriod");
export const UsageView = z
  .object({
    day: UsagePeriod,
    month: UsagePeriod,
    limited: z
      .enum(["requests", "tokens", "speech_chars", "audio_seconds"])
      .nullable()
      .openapi({ description: "the counter whose limit is reached now (work is refused), or null" }),
  })
  .openapi("Usage");
export type UsageView = z.infer<typeof UsageView>;

export type MemoryView = z.infer<typeof MemoryView>;
export type MemoryUpdate = z.infer<typeof MemoryUpdate>;
