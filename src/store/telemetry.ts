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
  constructor(private readonly db: Db) {}

  /** Writes samples; a second sample for the same field and millisecond replaces the first. */
  async insert(publicKey: string, samples: Sample[]): Promise<void> {
    if (samples.length === 0) return;
    const rows = samples.map((s) => ({ public_key: publicKey, field: s.field, observed_at: s.observedAt, value: s.value }));
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
    const lastTimes = this.db
      .selectFrom("telemetry_samples")
      .select((eb) => eb.fn.max("observed_at").as("t"))
      .where("public_key", "=", q.publicKey)
      .where("field", "=", q.field)
      .where("observed_at", ">=", q.start)
      .where("observed_at", "<", q.end)
      .groupBy(bucket);
    const rows = await this.db
      .selectFrom("telemetry_samples as s")
      .innerJoin(lastTimes.as("b"), "b.t", "s.observed_at")
      .select(["s.observed_at", "s.value"])
      .where("s.public_key", "=", q.publicKey)
      .where("s.field", "=", q.field)
      .orderBy("s.observed_at", q.order)
      .limit(q.limit)
      .execute();
    return rows.map((r) => ({ t: r.observed_at, value: r.value }));
  }

  /** One point per non-empty bucket, `t` being the bucket's start, in ascending order. */
  async aggregate(q: { publicKey: string; field: string; start: number; end: number; bucket: number; fn: AggregateFunction }): Promise<Point[]> {
    if (q.fn === "last") {
      const points = await this.lastPerStep({ ...q, step: q.bucket, order: "asc", limit: Number.MAX_SAFE_INTEGER });
      return points.map((p) => ({ t: q.start + Math.floor((p.t - q.start) / q.bucket) * q.bucket, value: p.value }));
    }
    const bucket = sql<number>`(observed_at - cast(${q.start} as bigint)) / cast(${q.bucket} as bigint)`;
    const value = {
      avg: sql<number>`avg(value)`,
      min: sql<number>`min(value)`,
      max: sql<number>`max(value)`,
      sum: sql<number>`sum(value)`,
      count: sql<number>`count(*)`,
    }[q.fn];
    const rows = await this.db
      .selectFrom("telemetry_samples")
      .select([bucket.as("b"), value.as("v")])
      .where("public_key", "=", q.publicKey)
      .where("field", "=", q.field)
      .where("observed_at", ">=", q.start)
      .where("observed_at", "<", q.end)
      // By position: PostgreSQL does not see two parameterised copies of `bucket` as one expression.
      .groupBy(sql`1`)
      .orderBy(sql`1`)
      .execute();
    return rows.map((r) => ({ t: q.start + Number(r.b) * q.bucket, value: Number(r.v) }));
  }
}
