import { sql } from "kysely";
import type { Db } from "./database.ts";

export interface Sample {
  field: string;
  observedAt: number;
  value: number;
}

export interface Point {
  t: number;
  value: number;
}

export type AggregateFunction = "avg" | "min" | "max" | "sum" | "count" | "last";

/** Time series of a peer's telemetry: one row per (peer, field, millisecond). Ranges are [start, end). */
export class TelemetryRepository {
  private readonly db: Db;

  constructor(db: Db) {
    this.db = db;
  }

  /** Writes samples; a second sample for the same field and millisecond replaces the first. */
  async insert(publicKey: string, samples: Sample[]): Promise<void> {
    if (samples.length === 0) return;
    // One row per (field, ms), the last one winning: PostgreSQL refuses to upsert a row twice in one statement.
    const unique = new Map<string, Sample>();
    for (const s of samples) unique.set(`${s.field}\u0000${s.observedAt}`, s);
    const rows = [...unique.values()].map((s) => ({ public_key: publicKey, field: s.field, observed_at: s.observedAt, value: s.value }));
    for (let i = 0; i < rows.length; i += 500) {
      await this.db
        .insertInto("telemetry_samples")
        .values(rows.slice(i, i + 500))
        .onConflict((oc) => oc.columns(["public_key", "field", "observed_at"]).doUpdateSet((eb) => ({ value: eb.ref("excluded.value") })))
        .execute();
    }
  }

  /** The newest sample of each field that has one. */
  async latest(publicKey: string, fields: readonly string[]): Promise<Sample[]> {
    const found = await Promise.all(
      fields.map((field) =>
        this.db
          .selectFrom("telemetry_samples")
          .select(["field", "observed_at", "value"])
          .where("public_key", "=", publicKey)
          .where("field", "=", field)
          .orderBy("observed_at", "desc")
          .limit(1)
          .executeTakeFirst(),
      ),
    );
    return found.filter((r) => r !== undefined).map((r) => ({ field: r.field, observedAt: r.observed_at, value: r.value }));
  }

  async range(q: { publicKey: string; field: string; start: number; end: number; order: "asc" | "desc"; limit: number }): Promise<Point[]> {
    const rows = await this.db
      .selectFrom("telemetry_samples")
      .select(["observed_at", "value"])
      .where("public_key", "=", q.publicKey)
      .where("field", "=", q.field)
      .where("observed_at", ">=", q.start)
      .where("observed_at", "<", q.end)
      .orderBy("observed_at", q.order)
      .limit(q.limit)
      .execute();
    return rows.map((r) => ({ t: r.observed_at, value: r.value }));
  }

  /** The last sample in each `step`-wide bucket counted from `start`, at its own time. */
  async lastPerStep(q: { publicKey: string; field: string; start: number; end: number; step: number; order: "asc" | "desc"; limit: number }): Promise<Point[]> {
    const bucket = sql<number>`(observed_at - cast(${q.start} as bigint)) / cast(${q.step} as bigint)`;
    // One pass with a window function: joining back to a grouped max(observed_at) let both planners
    // re-run the grouping for every sample (quadratic: tens of seconds for a day of samples).
    const ranked = this.db
      .selectFrom("telemetry_samples")
      .select(["observed_at", "value", sql<number>`row_number() over (partition by ${bucket} order by observed_at desc)`.as("rn")])
      .where("public_key", "=", q.publicKey)
      .where("field", "=", q.field)
      .where("observed_at", ">=", q.start)
      .where("observed_at", "<", q.end);
    const rows = await this.db
      .selectFrom(ranked.as("r"))
      .select(["observed_at", "value"])
      .where("rn", "=", 1)
      .orderBy("observed_at", q.order)
      .limit(q.limit)
      .execute();
    return rows.map((r) => ({ t: r.observed_at, value: r.value }));
  }

  /**
   * One point per non-empty bucket, `t` being the bucket's start, in ascending order. Each bucket is
   * its own primary-key range read, so neither database sorts or hashes the samples, and the
   * cost is one seek per bucket plus the samples read (callers bound the bucket count).
   */
  async aggregate(q: { publicKey: string; field: string; start: number; end: number; bucket: number; fn: AggregateFunction }): Promise<Point[]> {
    // Bucket i covers [start + i·bucket, start + (i+1)·bucket) ∩ [start, end).
    const from = sql`cast(${q.start} as bigint) + i * cast(${q.bucket} as bigint)`;
    const inBucket = sql`public_key = ${q.publicKey} and field = ${q.field}
      and observed_at >= ${from} and observed_at < ${from} + cast(${q.bucket} as bigint) and observed_at < cast(${q.end} as bigint)`;
    const value =
      q.fn === "last"
        ? sql`(select value from telemetry_samples where ${inBucket} order by observed_at desc limit 1)`
        : sql`(select ${sql.raw(q.fn === "count" ? "count(*)" : `${q.fn}(value)`)} from telemetry_samples where ${inBucket})`;
    const { rows } = await sql<{ i: number; v: number | null }>`
      with recursive buckets(i) as (select 0 union all select i + 1 from buckets where i + 1 < ${Math.ceil((q.end - q.start) / q.bucket)})
      select i, ${value} as v from buckets order by i`.execute(this.db);
    const points = rows.filter((r) => r.v !== null && !(q.fn === "count" && Number(r.v) === 0));
    return points.map((r) => ({ t: q.start + Number(r.i) * q.bucket, value: Number(r.v) }));
  }
}
