import type { Generated } from "kysely";

/** Row types of every table. Times are Unix milliseconds; JSON documents are stored as text. */
export interface Tables {
  peers: {
    public_key: string;
    role: string;
    status: string;
    device_info: string;
    created_at: number;
    updated_at: number;
    /** The voice conversations' agent for this device: an agent id, `off`, or null for the configured default. */
    voice_agent?: string | null;
    /** 1: the device's people turned its memory off (public-api.md, "Memory"). */
    memory_off?: number;
    /** When its memory was last forgotten: a conversation that began before is not remembered. */
    memory_forgotten_at?: number | null;
    /** The device's own usage limits (JSON, `perch peers limits`), replacing the configured `device` ones; null: none. */
    usage_limits?: string | null;
  };
  sessions: {
    id: string;
    token_hash: string;
    kind: string;
    public_key: string;
    /** The device the session acts on: the Side Control target, or the peer itself for a primary session. */
    target_key: string;
    created_at: number;
    expires_at: number;
    revoked_at: number | null;
  };
  device_tokens: {
    id: string;
    token_hash: string;
    target_key: string;
    created_at: number;
    expires_at: number;
    consumed_at: number | null;
  };
  assertion_nonces: { public_key: string; nonce: string; expires_at: number };
  signaling_nonces: { public_key: string; nonce: string; expires_at: number };
  peer_status: { public_key: string; document: string; updated_at: number };
  /** The last heartbeat of each serving node (Unix ms, its clock). */
  node_heartbeats: { node: string; beat_at: number };
  /** Each node of the fleet (fleet.md §1): written with its heartbeat, kept after it left (`state` gone). */
  nodes: {
    name: string;
    endpoint: string | null;
    started_at: number;
    heartbeat_at: number;
    state: string;
    connections: number;
    conversations: number;
    cpu: number;
    drain_requested_at: number | null;
  };
  /** A bus message for the other processes sharing a SQLite file; `origin` is the writer's bus instance. */
  bus_messages: { id: Generated<number>; origin: string; topic: string; message: string; created_at: number };
  /** An open Side Control event stream: its session and the node that holds it. */
  live_streams: { id: string; session_id: string; node: string; opened_at: number };
  peer_runtime: {
    public_key: string;
    online: number;
    last_seen_at: number | null;
    last_addr: string | null;
    rx_bytes: number | null;
    tx_bytes: number | null;
    node: string | null;
    updated_at: number;
  };
  telemetry_series: { id: Generated<number>; public_key: string; field: string };
  telemetry_samples: { series_id: number; observed_at: number; value: number };
  /** Per series and minute (its start, ms): count, sum, min and max of the minute's samples. */
  telemetry_rollups: { series_id: number; minute: number; n: number; total: number; low: number; high: number };
  contacts: {
    public_key: string;
    name: string;
    display_name: string | null;
    phone_number: string | null;
    phone_digits: string | null;
    created_at: number;
    updated_at: number;
  };
  /** A stored voice conversation (one connection of the device); `entries` counts its entries (the next one's `seq`). */
  conversations: {
    id: string;
    public_key: string;
    started_at: number;
    ended_at: number | null;
    last_at: number;
    turns: number;
    entries: number;
    last_text: string;
  };
  conversation_entries: {
    conversation_id: string;
    seq: number;
    turn: number;
    role: string;
    text: string;
    at: number;
    interrupted: number;
    tool_name: string | null;
    tool_is_error: number | null;
  };
  /** A stored turn's `turn.metrics` (voice.md §3), JSON. */
  conversation_turns: { conversation_id: string; turn: number; metrics: string };
  /** One side (`user`, `assistant`) of a stored turn as Ogg Opus (voice.md §8). */
  conversation_recordings: {
    conversation_id: string;
    turn: number;
    side: string;
    public_key: string;
    audio: Uint8Array;
    duration_ms: number;
    at: number;
    expires_at: number;
  };
  /** A conversation its controller deleted: its later entries are not stored. */
  conversation_deletions: { id: string; public_key: string; at: number };
  /** A device's memory; `rev` is new at every write. */
  memories: { public_key: string; text: string; rev: string; updated_at: number };
  /** What a principal used on a UTC day (`YYYY-MM-DD`) of an agent or model; `estimated` 1 when some tokens were estimated. */
  usage_days: {
    principal: string;
    day: string;
    agent: string;
    requests: number;
    input_tokens: number;
    output_tokens: number;
    speech_chars: number;
    audio_ms: number;
    tool_calls: number;
    estimated: number;
  };
}
