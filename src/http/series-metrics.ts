import type { Registry } from "prom-client";

/**
 * A counter and a histogram for the metrics every request updates, in prom-client's format and
 * read by its registry like any of its own, but found by their label values in one map lookup and
 * counted in place. prom-client's `inc` and `observe` validate and hash a labels object on every
 * call: the six updates of a relayed chat call were about 5 % of its CPU (docs/benchmarks.md).
 */

interface MetricOptions<L extends string> {
  name: string;
  help: string;
  labelNames: readonly L[];
  registers: Registry[];
}

type Labels = Record<string, string | number>;
interface Sample {
  value: number;
  labels: Labels;
  metricName?: string;
  /** The series' own labels, after `labels` (`le`) in the text format, as prom-client's histograms export them. */
  sharedLabels?: Labels;
}

abstract class SeriesMetric<L extends string, S extends { labels: Record<L, string> }> {
  readonly name: string;
  readonly help: string;
  readonly aggregator = "sum";
  abstract readonly type: "counter" | "histogram";
  private readonly labelNames: readonly L[];
  private series = new Map<string, S>();

  constructor(o: MetricOptions<L>) {
    this.name = o.name;
    this.help = o.help;
    this.labelNames = o.labelNames;
    for (const registry of o.registers) registry.registerMetric(this as never);
  }

  /** The series of these label values, in `labelNames`' order (made at its first use). */
  protected at(values: readonly string[]): S {
    const key = values.length === 1 ? values[0]! : values.length === 2 ? `${values[0]}\u0000${values[1]}` : values.join("\u0000");
    let s = this.series.get(key);
    if (!s) {
      const labels = {} as Record<L, string>;
      this.labelNames.forEach((name, i) => {
        labels[name] = values[i]!;
      });
      s = this.create(labels);
      this.series.set(key, s);
    }
    return s;
  }

  protected abstract create(labels: Record<L, string>): S;
  protected abstract samples(s: S): Sample[];

  /** What the registry's text format reads. */
  async getForPromString(): Promise<{ name: string; help: string; type: string; values: Sample[]; aggregator: string }> {
    return {
      name: this.name,
      help: this.help,
      type: this.type,
      values: [...this.series.values()].flatMap((s) => this.samples(s)),
      aggregator: this.aggregator,
    };
  }

  /** What the registry's JSON reads: every sample's labels in one object. */
  async get(): Promise<{ name: string; help: string; type: string; values: Sample[]; aggregator: string }> {
    const metric = await this.getForPromString();
    metric.values = metric.values.map(({ sharedLabels, ...v }) => ({ ...v, labels: { ...v.labels, ...sharedLabels } }));
    return metric;
  }

  reset(): void {
    this.series = new Map();
  }
}

export class SeriesCounter<L extends string> extends SeriesMetric<L, { labels: Record<L, string>; value: number }> {
  readonly type = "counter";

  /** Adds `by` (1 by default) to the series of `values`; a count that is not a finite, non-negative number (a provider's odd usage) is left out. */
  inc(values: readonly string[], by = 1): void {
    if (!(by >= 0 && Number.isFinite(by))) return;
    this.at(values).value += by;
  }

  protected create(labels: Record<L, string>) {
    return { labels, value: 0 };
  }

  protected samples(s: { labels: Record<L, string>; value: number }): Sample[] {
    return [{ value: s.value, labels: s.labels }];
  }
}

interface HistogramSeries<L extends string> {
  labels: Record<L, string>;
  /** Observations per bucket (not cumulative), the last one above every bound. */
  counts: Float64Array;
  sum: number;
  count: number;
}

export class SeriesHistogram<L extends string> extends SeriesMetric<L, HistogramSeries<L>> {
  readonly type = "histogram";
  private readonly bounds: readonly number[];

  constructor(o: MetricOptions<L> & { buckets: readonly number[] }) {
    super(o);
    this.bounds = [...o.buckets].sort((a, b) => a - b);
  }

  observe(values: readonly string[], value: number): void {
    if (!Number.isFinite(value)) return;
    const s = this.at(values);
    let i = 0;
    while (i < this.bounds.length && value > this.bounds[i]!) i++;
    s.counts[i]! += 1;
    s.sum += value;
    s.count += 1;
  }

  protected create(labels: Record<L, string>): HistogramSeries<L> {
    return { labels, counts: new Float64Array(this.bounds.length + 1), sum: 0, count: 0 };
  }

  protected samples(s: HistogramSeries<L>): Sample[] {
    const bucket = `${this.name}_bucket`;
    let cumulative = 0;
    const out: Sample[] = this.bounds.map((le, i) => {
      cumulative += s.counts[i]!;
      return { value: cumulative, labels: { le }, metricName: bucket, sharedLabels: s.labels };
    });
    out.push(
      { value: s.count, labels: { le: "+Inf" }, metricName: bucket, sharedLabels: s.labels },
      { value: s.sum, labels: {}, metricName: `${this.name}_sum`, sharedLabels: s.labels },
      { value: s.count, labels: {}, metricName: `${this.name}_count`, sharedLabels: s.labels },
    );
    return out;
  }
}
