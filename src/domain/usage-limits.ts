import { type KeyLimitConfig, KeyLimitConfig as KeyLimitSchema, LIMIT_COUNTERS, type USAGE_COUNTERS } from "../config/config.ts";
import type { UsageRow } from "../store/usage.ts";

/** A counter as the views name it (usage.md §1). */
export type Counter = (typeof USAGE_COUNTERS)[number];
/** A counter a limit may bound (`tokens`: input plus output). */
export type LimitCounter = (typeof LIMIT_COUNTERS)[number];
export type Period = "day" | "month";
export type Scope = "device" | "all_devices" | "api_key";

/** Counts as they are kept (audio in milliseconds, shown as seconds). */
export interface Counts {
  requests: number;
  input_tokens: number;
  output_tokens: number;
  speech_chars: number;
  audio_ms: number;
  tool_calls: number;
}

export const COUNT_FIELDS = ["requests", "input_tokens", "output_tokens", "speech_chars", "audio_ms", "tool_calls"] as const satisfies ReadonlyArray<
  keyof Counts
>;

export const zeroCounts = (): Counts => ({ requests: 0, input_tokens: 0, output_tokens: 0, speech_chars: 0, audio_ms: 0, tool_calls: 0 });

/** The principal every device's use is summed under, for `all_devices` limits. */
export const ALL_DEVICES = "all_devices";
export const devicePrincipal = (key: string) => `device:${key}`;
export const apiKeyPrincipal = (name: string) => `api_key:${name}`;

/** One bound: at most `value` of `counter` per `per`, for the principal `against` (its own id, or ALL_DEVICES), maybe only of one agent. */
export interface Limit {
  scope: Scope;
  per: Period;
  agent?: string | undefined;
  counter: LimitCounter;
  value: number;
  against: string;
}

/** Each counter of each configured limit as a `Limit`. */
export function expandLimits(list: readonly KeyLimitConfig[], scope: Scope, against: string): Limit[] {
  const out: Limit[] = [];
  for (const l of list) {
    for (const counter of LIMIT_COUNTERS) {
      const value = l[counter];
      if (value !== undefined) out.push({ scope, per: l.per, ...(l.agent !== undefined ? { agent: l.agent } : {}), counter, value, against });
    }
  }
  return out;
}

/** A device's own limits as stored (JSON of `KeyLimitConfig[]`); a row that does not parse counts as none. */
export function parseDeviceLimits(text: string): KeyLimitConfig[] | undefined {
  try {
    const parsed = KeyLimitSchema.array().safeParse(JSON.parse(text));
    return parsed.success ? parsed.data : undefined;
  } catch {
    return undefined;
  }
}

const DAY_MS = 86_400_000;

/** The UTC day of `ms` as `YYYY-MM-DD`. */
export function dayOf(ms: number): string {
  return new Date(ms).toISOString().slice(0, 10);
}

/** The first day of `ms`'s UTC month. */
export function monthStart(ms: number): string {
  return `${dayOf(ms).slice(0, 8)}01`;
}

/** When the period holding `ms` ends (Unix ms): the next UTC midnight, or the first of the next month. */
export function resetsAt(per: Period, ms: number): number {
  const d = new Date(ms);
  return per === "day" ? Math.floor(ms / DAY_MS) * DAY_MS + DAY_MS : Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1);
}

/** `counter` of `c` as a limit judges it. */
export function counterValue(c: Counts, counter: LimitCounter): number {
  switch (counter) {
    case "tokens":
      return c.input_tokens + c.output_tokens;
    case "audio_seconds":
      return c.audio_ms / 1000;
    default:
      return c[counter];
  }
}

export function addCounts(into: Counts, from: Partial<Counts>): void {
  for (const f of COUNT_FIELDS) {
    const v = from[f];
    if (v) into[f] += v;
  }
}

/** Whether a row (of `day`, `agent`) is within `limit`'s period (the period of `now`) and agent. */
export function inLimit(limit: Limit, day: string, agent: string, today: string, month: string): boolean {
  if (limit.agent !== undefined && limit.agent !== agent) return false;
  return limit.per === "day" ? day === today : day >= month && day <= today;
}

/** The rows' counts summed. */
export function sumRows(rows: readonly UsageRow[]): Counts {
  const c = zeroCounts();
  for (const r of rows) addCounts(c, r);
  return c;
}

/** Counts as the views show them: audio in seconds (to the millisecond). */
export function shown(c: Counts): Record<Counter, number> {
  return {
    requests: c.requests,
    input_tokens: c.input_tokens,
    output_tokens: c.output_tokens,
    speech_chars: c.speech_chars,
    audio_seconds: c.audio_ms / 1000,
    tool_calls: c.tool_calls,
  };
}

/** Tokens estimated from text where a provider reports none: about four characters a token, at least one for any text. */
export function estimateTokens(chars: number): number {
  return chars > 0 ? Math.ceil(chars / 4) : 0;
}
