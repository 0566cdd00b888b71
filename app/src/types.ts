/** The Public API's shapes the app reads (the contract's `public-api.md`). */
export interface DeviceInfo {
  name?: string;
  emoji?: string;
  hardware?: { manufacturer?: string; model?: string; hardware_revision?: string };
}

export interface PeerStatus {
  reported_at?: string;
  volume?: number;
  muted?: boolean;
  battery_percent?: number;
  charging?: boolean;
  gnss_latitude?: number;
  gnss_longitude?: number;
  gnss_altitude_m?: number;
  gnss_accuracy_m?: number;
}

export interface Runtime {
  online: boolean;
  last_seen_at?: string;
  node?: string;
}

export interface TelemetryValue {
  field: string;
  value: number;
  observed_at_unix_ms: number;
}

export interface Contact {
  name: string;
  display_name?: string;
  phone_number?: string;
}

export interface ContactList {
  items: Contact[];
  has_next: boolean;
  next_cursor?: string;
}

/** One entry of the device's voice conversation (the `conversation` event; a stored conversation's items). */
export interface ConversationEntry {
  conversation_id: string;
  turn: number;
  role: "user" | "assistant" | "tool";
  text: string;
  at_unix_ms: number;
  interrupted?: boolean;
  tool?: { name: string; is_error: boolean };
  /** A stored entry's turn's `turn.metrics` (milliseconds), once the turn finished. */
  metrics?: TurnMetrics;
}

/** `turn.metrics` (voice.md §3, §6, §7): stages in milliseconds, and what else the turn says of itself. */
export interface TurnMetrics {
  end_of_speech?: number;
  transcription?: number;
  first_token?: number;
  first_audio?: number;
  speech_to_audio?: number;
  interrupted?: boolean;
  [other: string]: unknown;
}

/** One side of a turn kept as Ogg Opus (`GET /side-control/conversations/{id}/turns/{turn}/audio?side=`). */
export interface TurnRecording {
  turn: number;
  side: "user" | "assistant";
  duration_ms: number;
}

/** `GET /side-control/conversations/{id}`. */
export interface StoredConversation {
  id: string;
  started_at_unix_ms: number;
  items: ConversationEntry[];
  recordings?: TurnRecording[];
}

export interface ConversationList {
  stored: boolean;
  items: Array<{ id: string; started_at_unix_ms: number; ended_at_unix_ms?: number; turns: number; last_text: string; first_question?: string }>;
  has_next: boolean;
  next_cursor?: string;
}

/** What the device's agent remembers of its people (`GET /side-control/memory`); `max_chars` 0: its agent does not remember. */
export interface Memory {
  enabled: boolean;
  text: string;
  updated_at_unix_ms?: number;
  max_chars: number;
}

export type UsageCounter = "requests" | "input_tokens" | "output_tokens" | "speech_chars" | "audio_seconds" | "tool_calls";
export type LimitCounter = "requests" | "tokens" | "speech_chars" | "audio_seconds";
export interface UsagePeriod {
  used: Record<UsageCounter, number>;
  limits: Partial<Record<LimitCounter, number>>;
  resets_at_unix_ms: number;
}
export interface Usage {
  day: UsagePeriod;
  month: UsagePeriod;
  limited: LimitCounter | null;
}
