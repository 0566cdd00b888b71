import { randomUUID } from "node:crypto";
import { base64urlnopad } from "@scure/base";
import type { Conversation, ConversationEntry, ConversationList, ConversationSummary } from "../protocol/public.ts";
import type { ConversationEntryRow, ConversationRow } from "../store/conversations.ts";
import type { RecordingSide } from "../store/recordings.ts";
import { DAY_MS, type DomainContext } from "./context.ts";
import { DomainError } from "./errors.ts";

export const DEFAULT_CONVERSATION_PAGE = 20;
/** A device's new conversation continues its last stored one when that one was still going this recently. */
export const CONTINUE_WITHIN_MS = 120_000;
/** Conversations the retention job deletes per transaction. */
const RETENTION_BATCH = 500;

/** What a conversation says, before it is given its conversation and time. */
export type EntryInput = Omit<ConversationEntry, "conversation_id" | "at_unix_ms">;

/**
 * A device's voice conversations as its Side Control sees them: entries live on the device's
 * event stream always, stored only when `voice.store_transcripts` is on (public-api.md,
 * "Conversations"), and listed, read and deleted by the device's controllers.
 */
export class ConversationService {
  private readonly ctx: DomainContext;

  constructor(ctx: DomainContext) {
    this.ctx = ctx;
  }

  get storing(): boolean {
    return this.ctx.config.voice.store_transcripts;
  }

  /** A new conversation of the device (one connection); `onError` hears of entries the store refused. */
  open(deviceKey: string, onError: (err: unknown) => void): ConversationRecorder {
    return new ConversationRecorder(this.ctx, deviceKey, onError);
  }

  /**
   * The turns a new conversation of the device continues (fleet.md §3): those of its last stored
   * conversation, when that one's last entry is at most `CONTINUE_WITHIN_MS` old (the device came
   * back from a drained node, or its link dropped), up to its last `turns` turns, as chat messages;
   * else none (a new conversation). Tool entries stay out, as they are out of the live history.
   */
  async continuing(deviceKey: string, turns: number): Promise<Array<{ role: "user" | "assistant"; content: string }>> {
    if (!this.storing) return [];
    const since = this.ctx.clock.now() - CONTINUE_WITHIN_MS;
    const entries = await this.ctx.store.read(async (r) => {
      const [last] = await r.conversations.list(deviceKey, undefined, 1);
      return last && last.last_at >= since ? r.conversations.entries(last.id) : [];
    });
    const said = entries.filter((e) => e.role === "user" || e.role === "assistant").map((e) => ({ role: e.role as "user" | "assistant", content: e.text }));
    return said.slice(-2 * turns);
  }

  /** Newest first; the cursor is the last item's (start time, id), base64url-encoded. */
  async list(deviceKey: string, cursor: string | undefined, limit = DEFAULT_CONVERSATION_PAGE): Promise<ConversationList> {
    const before = cursor === undefined ? undefined : parseCursor(cursor);
    if (!this.storing) return { stored: false, items: [], has_next: false };
    const rows = await this.ctx.store.read((r) => r.conversations.list(deviceKey, before, limit + 1));
    const items = rows.slice(0, limit).map(summaryView);
    const last = rows[limit - 1];
    return rows.length > limit && last
      ? { stored: true, items, has_next: true, next_cursor: base64urlnopad.encode(new TextEncoder().encode(JSON.stringify([last.started_at, last.id]))) }
      : { stored: true, items, has_next: false };
  }

  async get(deviceKey: string, id: string): Promise<Conversation> {
    if (!this.storing) throw notFound(id);
    const found = await this.ctx.store.read(async (r) => {
      const row = await r.conversations.get(deviceKey, id);
      return row && { row, entries: await r.conversations.entries(id), metrics: await r.recordings.metrics(id), sides: await r.recordings.sides(id) };
    });
    if (!found) throw notFound(id);
    const items = found.entries.map((row) => {
      const e = entryView(row);
      const metrics = found.metrics.get(row.turn);
      if (metrics !== undefined) e.metrics = JSON.parse(metrics) as Record<string, unknown>;
      return e;
    });
    const c: Conversation = { id: found.row.id, started_at_unix_ms: found.row.started_at, items };
    if (found.sides.length > 0) c.recordings = found.sides.map((r) => ({ turn: r.turn, side: r.side as RecordingSide, duration_ms: r.duration_ms }));
    return c;
  }

  /**
   * One side of a turn's recording, Ogg Opus (voice.md §8): CONVERSATION_NOT_FOUND for an unknown
   * conversation or another device's, RECORDING_NOT_FOUND when that turn's side was not kept.
   */
  async audio(deviceKey: string, id: string, turn: number, side: RecordingSide): Promise<Uint8Array> {
    if (!this.storing) throw notFound(id);
    const found = await this.ctx.store.read(async (r) => {
      const row = await r.conversations.get(deviceKey, id);
      return row && { audio: await r.recordings.get(deviceKey, id, turn, side) };
    });
    if (!found) throw notFound(id);
    if (!found.audio) throw new DomainError("not_found", "RECORDING_NOT_FOUND", `no ${side} recording of turn ${turn} of this conversation`);
    return found.audio;
  }

  /** Deletes for good; deletes work while storing is off too (what was stored before can still go). */
  async delete(deviceKey: string, id: string): Promise<void> {
    const at = this.ctx.clock.now();
    const r = await this.ctx.store.transaction(async (tx) => {
      // Recordings first, overwritten in the file (the cascade would leave the audio in free space).
      const recordings = await tx.recordings.deleteConversation(deviceKey, id);
      return { deleted: await tx.conversations.delete(deviceKey, id, at), recordings };
    });
    if (!r.deleted) throw notFound(id);
    if (r.recordings > 0) await this.erase();
  }

  async deleteAll(deviceKey: string): Promise<number> {
    const at = this.ctx.clock.now();
    const r = await this.ctx.store.transaction(async (tx) => {
      const recordings = await tx.recordings.deleteDevice(deviceKey);
      return { deleted: await tx.conversations.deleteAll(deviceKey, at), recordings };
    });
    if (r.recordings > 0) await this.erase();
    return r.deleted;
  }

  /** Deleted recordings out of the database files (SQLite's log truncated; PostgreSQL's table rewritten in the background). */
  private async erase(): Promise<void> {
    await this.ctx.store.eraseDeletedRecordings().catch(() => {});
  }

  /** Every stored conversation of the device with its entries, newest first, whether or not storing is on now (for operators). */
  async transcripts(deviceKey: string): Promise<Array<ConversationSummary & { items: ConversationEntry[] }>> {
    const out: Array<ConversationSummary & { items: ConversationEntry[] }> = [];
    let before: { startedAt: number; id: string } | undefined;
    for (;;) {
      const rows = await this.ctx.store.read((r) => r.conversations.list(deviceKey, before, 100));
      for (const row of rows) {
        const entries = await this.ctx.store.read((r) => r.conversations.entries(row.id));
        out.push({ ...summaryView(row), items: entries.map(entryView) });
      }
      const last = rows.at(-1);
      if (rows.length < 100 || !last) return out;
      before = { startedAt: last.started_at, id: last.id };
    }
  }

  /** The retention job: deletes conversations whose last entry is older than `voice.transcript_retention_days`, in batches. */
  async sweep(): Promise<number> {
    const before = this.ctx.clock.now() - this.ctx.config.voice.transcript_retention_days * DAY_MS;
    let total = 0;
    await this.ctx.store.transaction((tx) => tx.conversations.forgetDeletionsBefore(before));
    // Recordings past their own retention (record.retention_days), and those of the conversations going now, overwritten.
    let recordings = 0;
    for (;;) {
      const n = await this.ctx.store.transaction((tx) => tx.recordings.deleteExpired(this.ctx.clock.now(), RETENTION_BATCH, before));
      recordings += n;
      if (n === 0) break;
      await new Promise((resolve) => setImmediate(resolve));
    }
    if (recordings > 0) await this.erase();
    for (;;) {
      const n = await this.ctx.store.transaction((tx) => tx.conversations.deleteOlderThan(before, RETENTION_BATCH));
      total += n;
      if (n < RETENTION_BATCH) return total;
      await new Promise((resolve) => setImmediate(resolve));
    }
  }
}

/** One conversation being held: each entry goes to the device's controllers at once and, when storing, to the store in order. */
export class ConversationRecorder {
  readonly id = randomUUID();
  private readonly ctx: DomainContext;
  private readonly deviceKey: string;
  private readonly onError: (err: unknown) => void;
  private readonly startedAt: number;
  private seq = 0;
  private stored = false;
  /** The store's writes of this conversation, one after another. */
  private writes: Promise<void> = Promise.resolve();

  constructor(ctx: DomainContext, deviceKey: string, onError: (err: unknown) => void) {
    this.ctx = ctx;
    this.deviceKey = deviceKey;
    this.onError = onError;
    this.startedAt = ctx.clock.now();
  }

  add(input: EntryInput): void {
    const entry: ConversationEntry = { conversation_id: this.id, ...input, at_unix_ms: this.ctx.clock.now() };
    this.ctx.events.conversation(this.deviceKey, entry, this.seq++);
    if (!this.ctx.config.voice.store_transcripts) return;
    this.stored = true;
    const row = {
      turn: entry.turn,
      role: entry.role,
      text: entry.text,
      at: entry.at_unix_ms,
      interrupted: entry.interrupted ? 1 : 0,
      tool_name: entry.tool?.name ?? null,
      tool_is_error: entry.tool ? (entry.tool.is_error ? 1 : 0) : null,
    };
    const conversation = { id: this.id, publicKey: this.deviceKey, startedAt: this.startedAt };
    this.write(() => this.ctx.store.transaction((tx) => tx.conversations.append(conversation, row)).then(() => {}));
  }

  /** A finished turn's `turn.metrics` (JSON), stored with its entries (after them). */
  metrics(turn: number, json: string): void {
    if (!this.stored) return;
    this.write(() => this.ctx.store.transaction((tx) => tx.recordings.putMetrics(this.id, turn, json)).then(() => {}));
  }

  /** One side of a finished turn as Ogg Opus, kept `retentionDays` (after the turn's entries; nothing when the turn stored none). */
  recording(turn: number, side: RecordingSide, audio: Uint8Array, durationMs: number, retentionDays: number): void {
    if (!this.stored) return;
    const at = this.ctx.clock.now();
    const row = {
      conversation_id: this.id,
      turn,
      side,
      public_key: this.deviceKey,
      audio,
      duration_ms: Math.round(durationMs),
      at,
      expires_at: at + retentionDays * DAY_MS,
    };
    this.write(() => this.ctx.store.transaction((tx) => tx.recordings.put(row)).then(() => {}));
  }

  /** The connection closed: a stored conversation is marked ended. */
  close(): void {
    if (!this.stored) return;
    const at = this.ctx.clock.now();
    this.write(() => this.ctx.store.transaction((tx) => tx.conversations.end(this.id, at)));
  }

  /** Resolves once every write so far is done (or failed). */
  settled(): Promise<void> {
    return this.writes;
  }

  private write(work: () => Promise<void>): void {
    this.writes = this.writes.then(work).catch((err: unknown) => this.onError(err));
  }
}

function parseCursor(cursor: string): { startedAt: number; id: string } {
  try {
    const value = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(base64urlnopad.decode(cursor))) as unknown;
    if (Array.isArray(value) && value.length === 2 && Number.isSafeInteger(value[0]) && typeof value[1] === "string") {
      return { startedAt: value[0] as number, id: value[1] as string };
    }
  } catch {
    // Not one of ours.
  }
  throw new DomainError("invalid", "INVALID_REQUEST", "cursor is not one this server issued", { field: "cursor" });
}

function summaryView(row: ConversationRow & { first_question?: string | null }): ConversationSummary {
  const s: ConversationSummary = { id: row.id, started_at_unix_ms: row.started_at, turns: row.turns, last_text: row.last_text };
  if (row.ended_at !== null) s.ended_at_unix_ms = row.ended_at;
  if (row.first_question) s.first_question = row.first_question;
  return s;
}

function entryView(row: ConversationEntryRow): ConversationEntry {
  const e: ConversationEntry = {
    conversation_id: row.conversation_id,
    turn: row.turn,
    role: row.role as ConversationEntry["role"],
    text: row.text,
    at_unix_ms: row.at,
  };
  if (row.interrupted) e.interrupted = true;
  if (row.tool_name !== null) e.tool = { name: row.tool_name, is_error: row.tool_is_error === 1 };
  return e;
}

function notFound(id: string): DomainError {
  return new DomainError("not_found", "CONVERSATION_NOT_FOUND", `no stored conversation ${JSON.stringify(id)} of this device`);
}
