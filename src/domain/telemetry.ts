import {
  type AggregateFunction,
  type PeerStatus,
  TELEMETRY_FIELDS,
  type TelemetryAggregate,
  type TelemetryField,
  type TelemetryLatest,
  type TelemetryRange,
} from "../protocol/public.ts";
import type { Sample } from "../store/telemetry.ts";
import { DAY_MS, type DomainContext } from "./context.ts";
import { DomainError } from "./errors.ts";
import { isoTime, parseTime } from "./iso-time.ts";

export const DEFAULT_RANGE_LIMIT = 240;
export const MAX_BUCKETS = 1000;
/** The widest time a Date holds (±100,000,000 days): a sample's time must be a whole millisecond within it. */
const MAX_TIME_MS = 8.64e15;
const outsideTime = (s: TelemetrySample) => !Number.isInteger(s.observedAt) || Math.abs(s.observedAt) > MAX_TIME_MS;

export interface TelemetrySample {
  field: TelemetryField;
  observedAt: number;
  value: number;
}

export interface TimeWindow {
  start_time_ms?: number | undefined;
  end_time_ms?: number | undefined;
}

/** Status fields that telemetry keeps current, and how a sample's value becomes the field's value. */
const STATUS_FROM_TELEMETRY: Partial<Record<TelemetryField, [keyof PeerStatus, (v: number) => unknown]>> = {
  "battery.percent": ["battery_percent", (v) => Math.round(v)],
  "battery.charging": ["charging", (v) => v !== 0],
  "gnss.latitude": ["gnss_latitude", (v) => v],
  "gnss.longitude": ["gnss_longitude", (v) => v],
  "gnss.altitude_m": ["gnss_altitude_m", (v) => v],
  "gnss.accuracy_m": ["gnss_accuracy_m", (v) => v],
};

/** A peer's telemetry: writing observations and the three Side Control queries. */
export class TelemetryService {
  private readonly ctx: DomainContext;

  constructor(ctx: DomainContext) {
    this.ctx = ctx;
  }

  /**
   * Stores validated samples and, in the same transaction, merges battery and GNSS values into the
   * status document when they are newer than its `reported_at`. Booleans arrive as 0/1. A batch
   * with a time outside what a Date holds is refused whole (its status time could not be written).
   */
  async record(publicKey: string, samples: TelemetrySample[]): Promise<void> {
    const outside = samples.find(outsideTime);
    if (outside) throw new DomainError("invalid", "INVALID_TELEMETRY", `observed_at ${outside.observedAt} is not a millisecond a date can hold`);
    await this.recordMany([{ publicKey, samples }]);
  }

  /**
   * `record` for several peers in one transaction (the transport batches its packets this way).
   * A peer's entry with a time no date can hold is left out (the transport validates frames before
   * this); peers are written in key order, so concurrent batches lock status rows in one order.
   * Entries of peers that are not registered (any more) are left out.
   */
  async recordMany(batch: Array<{ publicKey: string; samples: TelemetrySample[] }>): Promise<void> {
    // One entry per peer, so that every statement below sees a peer once.
    const byPeer = new Map<string, TelemetrySample[]>();
    for (const e of batch) {
      if (e.samples.some(outsideTime)) continue;
      const seen = byPeer.get(e.publicKey);
      if (seen) seen.push(...e.samples);
      else byPeer.set(e.publicKey, [...e.samples]);
    }
    if (byPeer.size === 0) return;
    const stored: Array<{ publicKey: string; samples: TelemetrySample[]; status: PeerStatus | undefined }> = [];
    const now = this.ctx.clock.now();
    await this.ctx.store.transaction(async (tx) => {
      stored.length = 0;
      // A peer removed while connected (by the operator, from another process) is skipped: its
      // samples have no peer to belong to, and failing the transaction would lose everyone's.
      const kept = await tx.telemetry.insertMany(
        [...byPeer].map(([publicKey, samples]) => ({ publicKey, samples })),
        (keys) => tx.peers.existingForShare(keys),
      );
      const changes = kept.map((e) => statusChanges(e.samples));
      const changing = kept.filter((_, i) => changes[i]!.size > 0).map((e) => e.publicKey);
      const documents = changing.length > 0 ? await tx.status.getManyForUpdate(changing, now) : new Map<string, Readonly<Record<string, unknown>>>();
      const puts: Array<[string, Record<string, unknown>]> = [];
      for (const [i, { publicKey, samples }] of kept.entries()) {
        const next = changes[i]!.size > 0 ? merged((documents.get(publicKey) ?? {}) as PeerStatus, changes[i]!) : undefined;
        if (next) puts.push([publicKey, next]);
        stored.push({ publicKey, samples, status: next });
      }
      if (puts.length > 0) await tx.status.putMany(puts, now);
    });
    for (const s of stored) {
      this.ctx.events.telemetry(s.publicKey, s.samples);
      if (s.status) this.ctx.events.status(s.publicKey, s.status, now);
    }
  }

  async latest(publicKey: string, fields: readonly TelemetryField[] | undefined): Promise<TelemetryLatest> {
    const samples: Sample[] = await this.ctx.store.read((r) => r.telemetry.latest(publicKey, fields && fields.length > 0 ? fields : TELEMETRY_FIELDS));
    return {
      peer_public_key: publicKey,
      values: samples.map((s) => ({ field: s.field as TelemetryField, value: s.value, observed_at_unix_ms: s.observedAt })),
    };
  }

  async range(
    publicKey: string,
    q: TimeWindow & { field: TelemetryField; step_ms?: number | undefined; limit?: number | undefined; order?: "asc" | "desc" | undefined },
  ): Promise<TelemetryRange> {
    const { start, end } = this.window(q);
    const step = q.step_ms ?? 0;
    const query = { publicKey, field: q.field, start, end, order: q.order ?? "asc", limit: q.limit ?? DEFAULT_RANGE_LIMIT };
    const points = await this.ctx.store.read((r) => (step > 0 ? r.telemetry.lastPerStep({ ...query, step }) : r.telemetry.range(query)));
    return {
      peer_public_key: publicKey,
      field: q.field,
      start_time_ms: start,
      end_time_ms: end,
      step_ms: step,
      points: points.map((p) => ({ observed_at_unix_ms: p.t, value: p.value })),
    };
  }

  async aggregate(publicKey: string, q: TimeWindow & { field: TelemetryField; bucket_ms: number; aggregate: AggregateFunction }): Promise<TelemetryAggregate> {
    const { start, end } = this.window(q);
    if (Math.ceil((end - start) / q.bucket_ms) > MAX_BUCKETS) {
      throw invalidQuery(`the window holds more than ${MAX_BUCKETS} buckets of ${q.bucket_ms} ms`, "bucket_ms");
    }
    const points = await this.ctx.store.read((r) => r.telemetry.aggregate({ publicKey, field: q.field, start, end, bucket: q.bucket_ms, fn: q.aggregate }));
    return {
      peer_public_key: publicKey,
      field: q.field,
      aggregate: q.aggregate,
      bucket_ms: q.bucket_ms,
      points: points.map((p) => ({ bucket_start_time_ms: p.t, value: p.value })),
    };
  }

  /** [start, end): end defaults to just after now, start to a day before end. */
  private window(q: TimeWindow): { start: number; end: number } {
    const end = q.end_time_ms ?? this.ctx.clock.now() + 1;
    const start = q.start_time_ms ?? end - DAY_MS;
    if (end <= start) throw invalidQuery("end_time_ms must be after start_time_ms", "end_time_ms");
    return { start, end };
  }
}

/** The newest value (and its time) of each status field the samples carry. */
function statusChanges(samples: TelemetrySample[]): Map<keyof PeerStatus, { at: number; value: unknown }> {
  const newest = new Map<keyof PeerStatus, { at: number; value: unknown }>();
  for (const s of samples) {
    const mapping = STATUS_FROM_TELEMETRY[s.field];
    if (!mapping) continue;
    const [key, convert] = mapping;
    const seen = newest.get(key);
    if (!seen || s.observedAt >= seen.at) newest.set(key, { at: s.observedAt, value: convert(s.value) });
  }
  return newest;
}

/** The status document with the values newer than its `reported_at`; undefined when none is. */
function merged(current: Readonly<PeerStatus>, changes: Map<keyof PeerStatus, { at: number; value: unknown }>): PeerStatus | undefined {
  const reportedAt = current.reported_at ? parseTime(current.reported_at) : Number.NEGATIVE_INFINITY;
  const next: Record<string, unknown> = { ...current };
  let latest = reportedAt;
  for (const [key, { at, value }] of changes) {
    if (at <= reportedAt) continue;
    next[key] = value;
    latest = Math.max(latest, at);
  }
  if (latest === reportedAt) return undefined;
  next.reported_at = isoTime(latest);
  return next as PeerStatus;
}

function invalidQuery(message: string, field: string): DomainError {
  return new DomainError("invalid", "INVALID_TELEMETRY_QUERY", message, { field });
}
