import { type CompiledQuery, type RawBuilder, sql } from "kysely";
import { batched, compiled } from "./compiled.ts";
import type { Db } from "./database.ts";
import type { DialectName } from "./migrations.ts";
import type { WriteMemoryUnit } from "./write-memory.ts";

export interface Sample {
  field: string;
  observedAt: number;
  value: number;
}

export interface Point {
  t: number;
  value: number;
}

/**
 * Each series keeps a rollup per minute (count, sum, min, max), recomputed from the minute's
 * samples as they arrive, so an aggregate reads whole minutes from the rollups and only the
 * partial minutes at each bucket's ends from the samples. Samples before 1970 are not rolled up:
 * what a bucket holds before then is read from the samples.
 */
const ROLLUP_MS = 60_000;

export type AggregateFunction = "avg" | "min" | "max" | "sum" | "count" | "last";

/** Runs a compiled read somewhere else than the handle's own connection (a worker thread for SQLite). */
export type QueryRunner = <R>(query: CompiledQuery<R>) => Promise<R[]>;

const seriesId = compiled(
  (db, public_key: string, field: string) => db.selectFrom("telemetry_series").select("id").where("public_key", "=", public_key).where("field", "=", field),
  "",
  "",
);

/** The ids of the series of (peer, field) pairs, each with its pair's place in the statement (`i`): one index seek per pair. */
const seriesIds = batched<{ i: number; id: number }>(
  (db, values, rows) => ({
    compile: () =>
      sql<{ i: number; id: number }>`select v.column1 as i, s.id from (values ${sql.join(
        Array.from({ length: rows }, (_, i) => sql`(${sql.lit(i)}, ${values[2 * i]}, ${values[2 * i + 1]})`),
      )}) as v join telemetry_series s on s.public_key = v.column2 and s.field = v.column3`.compile(db),
  }),
  ["", ""],
);

/** Creates the series of (peer, field) pairs that have none. */
const insertSeries = batched(
  (db, values, rows) =>
    db
      .insertInto("telemetry_series")
      .values(Array.from({ length: rows }, (_, i) => ({ public_key: values[2 * i] as string, field: values[2 * i + 1] as string })))
      .onConflict((oc) => oc.columns(["public_key", "field"]).doNothing()),
  ["", ""],
);

/**
 * Recomputes one minute's rollup from its samples (a replaced sample cannot be subtracted from a min
 * or max). Each value is bound once, in order, so that the statement can be compiled.
 */
const rollUp = compiled(
  (db, series: number, minute: number, next: number) => ({
    compile: () =>
      sql`with w (series, lo, hi) as (select ${big(series)}, ${big(minute)}, ${big(next)})
      insert into telemetry_rollups (series_id, minute, n, total, low, high)
      select t.series_id, w.lo, count(*), sum(t.value), min(t.value), max(t.value) from telemetry_samples t, w
      where t.series_id = w.series and t.observed_at >= w.lo and t.observed_at < w.hi group by t.series_id, w.lo
      on conflict (series_id, minute) do update set n = excluded.n, total = excluded.total, low = excluded.low, high = excluded.high`.compile(db),
  }),
  0,
  0,
  0,
);

/** Adds new samples' count, sum, minimum and maximum to their minutes' rollups (one row per series and minute). */
const addToRollups = (dialect: DialectName) =>
  batched(
    (db, values, rows) => ({
      compile: () => {
        const stored = (column: string) => sql.raw(dialect === "postgres" ? `telemetry_rollups.${column}` : column);
        const [least, greatest] = dialect === "postgres" ? [sql.raw("least"), sql.raw("greatest")] : [sql.raw("min"), sql.raw("max")];
        return sql`insert into telemetry_rollups (series_id, minute, n, total, low, high) values ${sql.join(
          Array.from({ length: rows }, (_, i) => sql`(${sql.join(values.slice(6 * i, 6 * i + 6))})`),
        )}
        on conflict (series_id, minute) do update set n = ${stored("n")} + excluded.n, total = ${stored("total")} + excluded.total,
          low = ${least}(${stored("low")}, excluded.low), high = ${greatest}(${stored("high")}, excluded.high)`.compile(db);
      },
    }),
    [0, 0, 0, 0, 0, 0],
  );
const addToRollupsSqlite = addToRollups("sqlite");
const addToRollupsPostgres = addToRollups("postgres");

/** Rows a sample upsert writes at most; larger writes are cut into statements of power-of-two sizes, each compiled once. */
const MAX_UPSERT_ROWS = 512;
/**
 * The upsert of each row count, compiled once for the process: a memo of a pure function of the
 * count (SQL text, per dialect in `compiled`), as every `compiled` query at module level is, so
 * nodes sharing it share no state of theirs.
 */
const upserts = new Map<number, ReturnType<typeof upsertOf>>();

/** Inserts samples (series, time, value), leaving a stored (series, time) alone. */
const insertNew = batched(
  (db, values, rows) =>
    db
      .insertInto("telemetry_samples")
      .values(
        Array.from({ length: rows }, (_, i) => ({
          series_id: values[3 * i] as number,
          observed_at: values[3 * i + 1] as number,
          value: values[3 * i + 2] as number,
        })),
      )
      .onConflict((oc) => oc.columns(["series_id", "observed_at"]).doNothing()),
  [0, 0, 0],
  MAX_UPSERT_ROWS,
);

/** The upsert of `n` samples (series, time, value), compiled once: a second sample for the same millisecond replaces the first. */
function upsertOf(n: number) {
  return compiled(
    (db, ...values: number[]) =>
      db
        .insertInto("telemetry_samples")
        .values(Array.from({ length: n }, (_, i) => ({ series_id: values[3 * i]!, observed_at: values[3 * i + 1]!, value: values[3 * i + 2]! })))
        .onConflict((oc) => oc.columns(["series_id", "observed_at"]).doUpdateSet((eb) => ({ value: eb.ref("excluded.value") }))),
    ...new Array<number>(3 * n).fill(0),
  );
}

function upsert(n: number) {
  let query = upserts.get(n);
  if (!query) {
    query = upsertOf(n);
    upserts.set(n, query);
  }
  return query;
}

/**
 * Time series of a peer's telemetry: one series per (peer, field), one sample per (series,
 * millisecond). Ranges are [start, end). Every query costs a bounded number of index seeks per
 * point it returns (aggregates other than `last` also read the samples of each bucket).
 */
export class TelemetryRepository {
  private readonly db: Db;
  private readonly dialect: DialectName;
  private readonly run: QueryRunner;
  /** SQLite: the series ids the telemetry writes remember between transactions. */
  private readonly memory: WriteMemoryUnit | undefined;

  constructor(db: Db, dialect: DialectName, longReads?: QueryRunner, memory?: WriteMemoryUnit) {
    this.db = db;
    this.dialect = dialect;
    this.run = longReads ?? (async <R>(query: CompiledQuery<R>) => (await db.executeQuery(query)).rows);
    this.memory = memory;
  }

  /** Writes samples; a second sample for the same field and millisecond replaces the first. The peer must exist. */
  async insert(publicKey: string, samples: Sample[]): Promise<void> {
    await this.insertMany([{ publicKey, samples }], async (keys) => new Set(keys));
  }

  /**
   * `insert` for several peers at once, leaving out those that are not registered (any more):
   * resolves with the entries written. `present` says which of some peers are registered (on
   * PostgreSQL it also keeps them from removal until the transaction ends); it is asked about
   * every peer on PostgreSQL, and on SQLite only about peers with a series not seen yet, as a
   * series exists only while its peer does. Every statement carries many peers' rows (series
   * looked up and created, samples inserted, rollups added): a peer's share of a batch is often
   * one frame, and statements per peer cost more than SQLite spends on the rows.
   */
  async insertMany<E extends { publicKey: string; samples: Sample[] }>(
    batch: readonly E[],
    present: (publicKeys: string[]) => Promise<Set<string>>,
  ): Promise<E[]> {
    // PostgreSQL locks rows as statements reach them: in key order, concurrent batches cannot deadlock.
    let entries: readonly E[] = batch;
    if (this.dialect === "postgres") {
      const sorted = [...batch].sort((a, b) => (a.publicKey < b.publicKey ? -1 : a.publicKey > b.publicKey ? 1 : 0));
      const registered = await present(sorted.map((e) => e.publicKey));
      entries = sorted.filter((e) => registered.has(e.publicKey));
    }
    this.memory?.open();
    const memory = this.memory?.memory;
    // Keyed by two values without building a string per sample: this runs for every sample stored.
    const idOf = new PairMap<string, string, number>();
    const pairs: Array<[publicKey: string, field: string]> = [];
    for (const { publicKey, samples } of entries) {
      for (const s of samples) {
        if (idOf.get(publicKey, s.field) !== undefined) continue;
        const known = memory?.seriesId(publicKey, s.field);
        idOf.set(publicKey, s.field, known ?? -1);
        if (known === undefined) pairs.push([publicKey, s.field]);
      }
    }
    const found = async (wanted: Array<[string, string]>) => {
      await seriesIds(this.db, this.dialect, wanted, (result, first) => {
        for (const r of result) {
          const [publicKey, field] = wanted[first + Number(r.i)]!;
          idOf.set(publicKey, field, Number(r.id));
          this.memory?.keepSeries(publicKey, field, Number(r.id));
        }
      });
    };
    if (pairs.length > 0) await found(pairs);
    let missing = pairs.filter(([publicKey, field]) => idOf.get(publicKey, field) === -1);
    if (missing.length > 0 && this.dialect === "sqlite") {
      // A peer without some series may have been removed: only registered ones get new series.
      const registered = await present([...new Set(missing.map(([publicKey]) => publicKey))]);
      if (registered.size < new Set(missing.map(([publicKey]) => publicKey)).size) {
        entries = entries.filter((e) => registered.has(e.publicKey));
        missing = missing.filter(([publicKey]) => registered.has(publicKey));
      }
    }
    if (missing.length > 0) {
      await insertSeries(this.db, this.dialect, missing);
      await found(missing);
    }
    // One row per (series, ms), the last one winning: PostgreSQL refuses to upsert a row twice in one statement.
    const unique = new PairMap<number, number, [series: number, at: number, value: number]>();
    for (const { publicKey, samples } of entries) {
      for (const s of samples) {
        const series = idOf.get(publicKey, s.field)!;
        unique.set(series, s.observedAt, [series, s.observedAt, s.value]);
      }
    }
    const rows = [...unique.values()];
    // New samples are added to their minute's rollup. A statement that inserted fewer rows than it
    // carried met stored samples: its rows are written again as upserts (the new value wins) and
    // their minutes recomputed from the samples (a replaced value cannot be subtracted from a min or max).
    const replaced: Array<[series: number, at: number, value: number]> = [];
    await insertNew(this.db, this.dialect, rows, (_, first, count, changed) => {
      if (changed < count) for (let j = first; j < first + count; j++) replaced.push(rows[j]!);
    });
    for (let i = 0; i < replaced.length; ) {
      const n = Math.min(MAX_UPSERT_ROWS, 2 ** Math.floor(Math.log2(replaced.length - i)));
      await upsert(n)(this.db, this.dialect, ...replaced.slice(i, i + n).flat());
      i += n;
    }
    const recompute = new PairMap<number, number, [series: number, minute: number]>();
    for (const [series, at] of replaced) if (at >= 0) recompute.set(series, at - (at % ROLLUP_MS), [series, at - (at % ROLLUP_MS)]);
    const added = new PairMap<number, number, [series: number, minute: number, n: number, total: number, low: number, high: number]>();
    for (const [series, at, value] of rows) {
      if (at < 0) continue;
      const minute = at - (at % ROLLUP_MS);
      if (recompute.get(series, minute)) continue;
      const a = added.get(series, minute);
      if (!a) added.set(series, minute, [series, minute, 1, value, value, value]);
      else {
        a[2]++;
        a[3] += value;
        a[4] = Math.min(a[4], value);
        a[5] = Math.max(a[5], value);
      }
    }
    await (this.dialect === "postgres" ? addToRollupsPostgres : addToRollupsSqlite)(this.db, this.dialect, [...added.values()]);
    for (const [series, minute] of recompute.values()) await rollUp(this.db, this.dialect, series, minute, minute + ROLLUP_MS);
    return entries as E[];
  }

  /** The newest sample of each field that has one, in the order asked. */
  async latest(publicKey: string, fields: readonly string[]): Promise<Sample[]> {
    if (fields.length === 0) return [];
    const rows = await this.db
      .selectFrom("telemetry_series as s")
      .innerJoin("telemetry_samples as t", "t.series_id", "s.id")
      .select(["s.field", "t.observed_at", "t.value"])
      .where("s.public_key", "=", publicKey)
      .where("s.field", "in", fields)
      .where("t.observed_at", "=", (eb) =>
        eb.selectFrom("telemetry_samples as u").select("u.observed_at").whereRef("u.series_id", "=", "s.id").orderBy("u.observed_at", "desc").limit(1),
      )
      .execute();
    const byField = new Map(rows.map((r) => [r.field, { field: r.field, observedAt: r.observed_at, value: r.value }]));
    return fields.flatMap((f) => byField.get(f) ?? []);
  }

  async range(q: { publicKey: string; field: string; start: number; end: number; order: "asc" | "desc"; limit: number }): Promise<Point[]> {
    const id = await this.series(q.publicKey, q.field);
    if (id === undefined) return [];
    const rows = await this.run(
      this.db
        .selectFrom("telemetry_samples")
        .select(["observed_at", "value"])
        .where("series_id", "=", id)
        .where("observed_at", ">=", q.start)
        .where("observed_at", "<", q.end)
        .orderBy("observed_at", q.order)
        .limit(q.limit)
        .compile(),
    );
    return rows.map((r) => ({ t: r.observed_at, value: r.value }));
  }

  /**
   * The last sample in each `step`-wide step counted from `start`, at its own time, for at most
   * `limit` non-empty steps. One statement walks from sample to sample: ascending, a seek finds
   * the first sample at or after the cursor (so its step) and another the last of that step;
   * descending, the last sample before the cursor is already the last of its step. Empty steps
   * cost nothing, and the window's other samples are never read.
   */
  async lastPerStep(q: { publicKey: string; field: string; start: number; end: number; step: number; order: "asc" | "desc"; limit: number }): Promise<Point[]> {
    const id = await this.series(q.publicKey, q.field);
    if (id === undefined) return [];
    const S = big(q.start);
    const E = big(q.end);
    const STEP = big(q.step);
    const inWindow = sql`series_id = ${id} and observed_at >= ${S} and observed_at < ${E}`;
    // One bound on each side of every range: given two, SQLite seeks by one and filters the rest by scanning.
    const least = sql.raw(this.dialect === "sqlite" ? "min" : "least");
    // Each point's value is a primary-key lookup in the select list: as a join, SQLite chose to
    // scan the samples once per step.
    const valueAt = sql`(select value from telemetry_samples where series_id = ${id} and observed_at = points.at)`;
    const query =
      q.order === "asc"
        ? sql<{ observed_at: number; value: number }>`
        with recursive walk(n, k) as (
          select 1, (select (observed_at - ${S}) / ${STEP} from telemetry_samples where ${inWindow} order by observed_at limit 1)
          union all
          select n + 1, (select (observed_at - ${S}) / ${STEP} from telemetry_samples
                         where series_id = ${id} and observed_at >= ${S} + (k + 1) * ${STEP} and observed_at < ${E} order by observed_at limit 1)
          from walk where k is not null and n < ${q.limit}
        ),
        points(n, at) as (
          select n, (select observed_at from telemetry_samples
                     where series_id = ${id} and observed_at >= ${S} + k * ${STEP} and observed_at < ${least}(${S} + (k + 1) * ${STEP}, ${E}) order by observed_at desc limit 1)
          from walk where k is not null
        )
        select at as observed_at, ${valueAt} as value from points order by n`
        : sql<{ observed_at: number; value: number }>`
        with recursive points(n, at) as (
          select 1, (select observed_at from telemetry_samples where ${inWindow} order by observed_at desc limit 1)
          union all
          select n + 1, (select observed_at from telemetry_samples
                         where series_id = ${id} and observed_at >= ${S} and observed_at < ${S} + ((at - ${S}) / ${STEP}) * ${STEP} order by observed_at desc limit 1)
          from points where at is not null and n < ${q.limit}
        )
        select at as observed_at, ${valueAt} as value from points where at is not null order by n`;
    const rows = await this.run(query.compile(this.db));
    return rows.map((r) => ({ t: Number(r.observed_at), value: r.value }));
  }

  /**
   * One point per non-empty bucket, `t` being the bucket's start, in ascending order. Each bucket is
   * its own primary-key range read, so neither database sorts or hashes the samples (callers
   * bound the bucket count).
   */
  async aggregate(q: { publicKey: string; field: string; start: number; end: number; bucket: number; fn: AggregateFunction }): Promise<Point[]> {
    const id = await this.series(q.publicKey, q.field);
    if (id === undefined) return [];
    // Bucket i covers [a, b) = [start + i·bucket, start + (i+1)·bucket) ∩ [start, end).
    const a = sql`${big(q.start)} + i * ${big(q.bucket)}`;
    const [least, greatest] = this.dialect === "sqlite" ? [sql.raw("min"), sql.raw("max")] : [sql.raw("least"), sql.raw("greatest")];
    const b = sql`${least}(${a} + ${big(q.bucket)}, ${big(q.end)})`;
    const buckets = sql`with recursive buckets(i) as (select 0 union all select i + 1 from buckets where i + 1 < ${Math.ceil((q.end - q.start) / q.bucket)})`;
    const samples = (from: unknown, to: unknown) => sql`from telemetry_samples where series_id = ${id} and observed_at >= ${from} and observed_at < ${to}`;
    if (q.fn === "last") {
      const last = sql`(select value ${samples(a, b)} order by observed_at desc limit 1)`;
      const rows = await this.run(sql<{ i: number; v: number | null }>`${buckets} select i, ${last} as v from buckets order by i`.compile(this.db));
      return rows.filter((r) => r.v !== null).map((r) => ({ t: q.start + Number(r.i) * q.bucket, value: Number(r.v) }));
    }
    // Whole minutes [a', b') come from the rollups; the partial minutes at either end, and anything
    // before 1970 (a' is never below 0), from the samples. Integer division truncates: for a
    // negative b, b' lies after b and the rollup and tail ranges are empty.
    const a1 = sql`${greatest}(((${a} + ${big(ROLLUP_MS - 1)}) / ${big(ROLLUP_MS)}) * ${big(ROLLUP_MS)}, 0)`;
    const b1 = sql`(${b} / ${big(ROLLUP_MS)}) * ${big(ROLLUP_MS)}`;
    const head = samples(a, sql`${least}(${a1}, ${b})`);
    const tail = samples(sql`${greatest}(${a1}, ${b1})`, b);
    const rollups = sql`from telemetry_rollups where series_id = ${id} and minute >= ${a1} and minute < ${b1}`;
    // An average needs a count and a sum from each part: one subquery each returns both, as text
    // ("<count> <sum>"), so that the partial minutes are read once.
    const both = (n: string, total: string) => `cast(${n} as text) || ' ' || cast(coalesce(${total}, 0) as text)`;
    const [sampleFn, rollupFn] = (
      {
        avg: [both("count(*)", "sum(value)"), both("coalesce(sum(n), 0)", "sum(total)")],
        sum: ["sum(value)", "sum(total)"],
        count: ["count(*)", "sum(n)"],
        min: ["min(value)", "min(low)"],
        max: ["max(value)", "max(high)"],
      } as const
    )[q.fn];
    const query = sql<{ i: number; hv: number | string | null; rv: number | string | null; tv: number | string | null }>`
      ${buckets} select i, (select ${sql.raw(sampleFn)} ${head}) as hv, (select ${sql.raw(rollupFn)} ${rollups}) as rv, (select ${sql.raw(sampleFn)} ${tail}) as tv
      from buckets order by i`;
    const points: Point[] = [];
    for (const r of await this.run(query.compile(this.db))) {
      const parts = [r.hv, r.rv, r.tv].filter((v) => v !== null);
      let value: number;
      if (q.fn === "avg") {
        const [n, total] = parts.map((p) => String(p).split(" ").map(Number)).reduce(([n1, s1], [n2, s2]) => [n1! + n2!, s1! + s2!], [0, 0]);
        if (n === 0) continue;
        value = total! / n!;
      } else {
        const numbers = parts.map(Number);
        if (numbers.length === 0 || (q.fn === "count" && numbers.every((x) => x === 0))) continue;
        value = q.fn === "min" ? Math.min(...numbers) : q.fn === "max" ? Math.max(...numbers) : numbers.reduce((x, y) => x + y, 0);
      }
      points.push({ t: q.start + Number(r.i) * q.bucket, value });
    }
    return points;
  }

  /**
   * Deletes samples older than `before`, series by series in id order from `afterSeries`, until
   * `maxRows` rows are deleted or `maxSeries` series visited; returns where to go on from, or
   * undefined when the last series was reached. Each series' old samples are a prefix of its key range.
   */
  async deleteBefore(before: number, afterSeries: number, maxRows: number, maxSeries = 500): Promise<{ deleted: number; next: number | undefined }> {
    const series = await this.db.selectFrom("telemetry_series").select("id").where("id", ">", afterSeries).orderBy("id").limit(maxSeries).execute();
    let deleted = 0;
    for (const { id } of series) {
      const r = await this.db
        .deleteFrom("telemetry_samples")
        .where("series_id", "=", id)
        .where("observed_at", "in", (eb) =>
          eb
            .selectFrom("telemetry_samples")
            .select("observed_at")
            .where("series_id", "=", id)
            .where("observed_at", "<", before)
            .orderBy("observed_at")
            .limit(maxRows - deleted),
        )
        .executeTakeFirst();
      if (r.numDeletedRows > 0n) await this.trimRollups(id);
      deleted += Number(r.numDeletedRows);
      if (deleted >= maxRows) return { deleted, next: id - 1 };
    }
    return { deleted, next: series.length === maxSeries ? series.at(-1)!.id : undefined };
  }

  /** After old samples were deleted: drops the rollups of minutes before the oldest sample left, and recomputes its minute. */
  private async trimRollups(series: number): Promise<void> {
    const oldest = (
      await this.db.selectFrom("telemetry_samples").select("observed_at").where("series_id", "=", series).orderBy("observed_at").limit(1).executeTakeFirst()
    )?.observed_at;
    const minute = oldest === undefined ? Number.MAX_SAFE_INTEGER : oldest - (oldest % ROLLUP_MS);
    await this.db.deleteFrom("telemetry_rollups").where("series_id", "=", series).where("minute", "<", minute).execute();
    if (oldest !== undefined && oldest >= 0) await rollUp(this.db, this.dialect, series, minute, minute + ROLLUP_MS);
  }

  private async series(publicKey: string, field: string): Promise<number | undefined> {
    return (await seriesId(this.db, this.dialect, publicKey, field))[0]?.id;
  }
}

/** A map keyed by two values. */
class PairMap<A, B, V> {
  private readonly outer = new Map<A, Map<B, V>>();

  get(a: A, b: B): V | undefined {
    return this.outer.get(a)?.get(b);
  }

  set(a: A, b: B, value: V): void {
    let inner = this.outer.get(a);
    if (!inner) {
      inner = new Map();
      this.outer.set(a, inner);
    }
    inner.set(b, value);
  }

  *values(): IterableIterator<V> {
    for (const inner of this.outer.values()) yield* inner.values();
  }
}

/** A parameter typed as a 64-bit integer on both databases (PostgreSQL cannot infer it in arithmetic). */
function big(n: number): RawBuilder<number> {
  return sql<number>`cast(${n} as bigint)`;
}
