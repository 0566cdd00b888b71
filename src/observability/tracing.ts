import { type Attributes, type AttributeValue, ROOT_CONTEXT, type Span, SpanKind, SpanStatusCode, TraceFlags, type Tracer, trace } from "@opentelemetry/api";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-proto";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { BatchSpanProcessor, type ReadableSpan, type SpanExporter, type SpanProcessor, TracerProvider } from "@opentelemetry/sdk-trace";
import { ATTR_SERVICE_NAME, ATTR_SERVICE_VERSION } from "@opentelemetry/semantic-conventions";
import { Counter, type Registry } from "prom-client";
import type { Config } from "../config/config.ts";

/**
 * Traces of this node (voice.md §8), through the OpenTelemetry SDK: one tracer provider per node,
 * never registered globally (two nodes in one process share nothing), its spans batched and sent
 * over OTLP/HTTP protobuf. Without an endpoint there is no provider at all: the code of a turn or
 * a request holds `undefined` instead of a `Traced`, and `traced?.child(…)` does nothing.
 *
 * A collector that is slow, silent or away never holds a turn: ending a span only puts it in a
 * bounded queue; beyond it spans are dropped and counted, as are the spans of a failed export.
 */

const SHUTDOWN_WAIT_MS = 2000;

export type TracingConfig = Config["tracing"];

export interface TracingOptions {
  registry: Registry;
  env?: NodeJS.ProcessEnv;
  /** `service.instance.id`. */
  node: string;
  version: string;
  /** Where the exporter's failures are told (once per kind of failure until an export succeeds). */
  warn?: (message: string, err?: unknown) => void;
}

/** The tracing of one node; `undefined` (no SDK object at all) when tracing is off. */
export class Tracing {
  /** Whether span attributes may hold what people said (`tracing.include_text`). */
  readonly includeText: boolean;
  private readonly sampleRatio: number;
  private readonly provider: TracerProvider;
  private readonly tracer: Tracer;

  private constructor(config: TracingConfig, provider: TracerProvider) {
    this.includeText = config.include_text;
    this.sampleRatio = config.sample_ratio;
    this.provider = provider;
    this.tracer = provider.getTracer("perch");
  }

  /** The node's tracing, or undefined when no endpoint is configured. */
  static of(config: TracingConfig, o: TracingOptions): Tracing | undefined {
    const otlp = config.otlp;
    if (!otlp) return undefined;
    const env = o.env ?? process.env;
    const headers: Record<string, string> = {};
    for (const [header, variable] of Object.entries(otlp.headers_env)) {
      const value = env[variable];
      if (value) headers[header] = value;
    }
    const dropped = new Counter({
      name: "perch_tracing_spans_dropped_total",
      help: "Finished spans never delivered to the collector: queue_full (the export queue was full) or export_failed (the collector failed or did not answer in time)",
      labelNames: ["reason"] as const,
      registers: [o.registry],
    });
    const exported = new Counter({
      name: "perch_tracing_spans_exported_total",
      help: "Finished spans the collector accepted",
      registers: [o.registry],
    });
    for (const reason of ["queue_full", "export_failed"]) dropped.inc({ reason }, 0);
    const exporter = new OTLPTraceExporter({
      url: `${otlp.endpoint.replace(/\/+$/, "")}/v1/traces`,
      headers,
      timeoutMillis: otlp.timeout_ms,
    });
    const queue = new BoundedQueue(otlp.max_queue_size, () => dropped.inc({ reason: "queue_full" }));
    const counted = new CountingExporter(exporter, queue, {
      exported: (n) => exported.inc(n),
      failed: (n, first, err) => {
        dropped.inc({ reason: "export_failed" }, n);
        if (first) o.warn?.("spans could not be exported to the collector; they are dropped (told again once an export succeeded)", err);
      },
    });
    const batch = new BatchSpanProcessor({
      exporter: counted,
      maxQueueSize: otlp.max_queue_size,
      maxExportBatchSize: Math.min(otlp.max_export_batch_size, otlp.max_queue_size),
      scheduledDelayMillis: otlp.schedule_delay_ms,
      exportTimeoutMillis: otlp.timeout_ms + 1000,
    });
    const provider = new TracerProvider({
      resource: resourceFromAttributes({ [ATTR_SERVICE_NAME]: config.service_name, [ATTR_SERVICE_VERSION]: o.version, "service.instance.id": o.node }),
      spanProcessors: [queue.processor(batch)],
    });
    return new Tracing(config, provider);
  }

  /**
   * A new trace: its root span (`kind` server for a request, internal for a voice turn), or
   * undefined for a trace not kept (`tracing.sample_ratio`): decided here, before the SDK, so that a
   * trace not kept costs nothing more than tracing off (its children are never made).
   */
  root(name: string, attributes?: Attributes, kind: SpanKind = SpanKind.INTERNAL, startTime?: number): Traced | undefined {
    if (this.sampleRatio < 1 && !(Math.random() < this.sampleRatio)) return undefined;
    return new Traced(this, this.tracer.startSpan(name, { kind, attributes, root: true, ...(startTime !== undefined ? { startTime } : {}) }));
  }

  /** @internal a child of `parent`. */
  startChild(parent: Span, name: string, attributes: Attributes | undefined, kind: SpanKind, startTime: number | undefined): Span {
    const ctx = trace.setSpan(ROOT, parent);
    return this.tracer.startSpan(name, { kind, attributes, ...(startTime !== undefined ? { startTime } : {}) }, ctx);
  }

  /** Sends what is queued, within a bound: a silent collector does not hold a node's close. */
  async shutdown(): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      this.provider.shutdown().catch(() => undefined),
      new Promise<void>((resolve) => {
        timer = setTimeout(resolve, SHUTDOWN_WAIT_MS);
      }),
    ]);
    clearTimeout(timer);
  }

  /** Exports what is queued now (tests). */
  async flush(): Promise<void> {
    await this.provider.forceFlush().catch(() => undefined);
  }
}

/** Spans are parented explicitly, never through an active context (no context manager is set up). */
const ROOT = ROOT_CONTEXT;

/**
 * One span and the tracing it belongs to: what the code of a turn or a request holds, to make
 * children and to end it. Words people said go in only through `text`, which drops them unless
 * `tracing.include_text` is on.
 */
export class Traced {
  readonly span: Span;
  private readonly tracing: Tracing;

  constructor(tracing: Tracing, span: Span) {
    this.tracing = tracing;
    this.span = span;
  }

  /** Whether `text` keeps what it is given (`tracing.include_text`): build the text only then. */
  get includesText(): boolean {
    return this.tracing.includeText;
  }

  /** The trace's id (32 hex digits), for log lines. */
  get traceId(): string {
    return this.span.spanContext().traceId;
  }

  child(name: string, attributes?: Attributes, kind: SpanKind = SpanKind.INTERNAL, startTime?: number): Traced {
    return new Traced(this.tracing, this.tracing.startChild(this.span, name, attributes, kind, startTime));
  }

  set(key: string, value: AttributeValue | undefined): this {
    if (value !== undefined) this.span.setAttribute(key, value);
    return this;
  }

  setAll(attributes: Attributes): this {
    this.span.setAttributes(attributes);
    return this;
  }

  /** What someone said or was told: an attribute only with `tracing.include_text`. */
  text(key: string, value: string | undefined): this {
    if (this.tracing.includeText && value !== undefined) this.span.setAttribute(key, value);
    return this;
  }

  event(name: string, attributes?: Attributes, time?: number): this {
    this.span.addEvent(name, attributes, time);
    return this;
  }

  rename(name: string): this {
    this.span.updateName(name);
    return this;
  }

  /** Marks the span failed: `error.type` and the status (the message only names what failed, never what was said). */
  fail(type: string, message?: string): this {
    this.span.setAttribute("error.type", type);
    this.span.setStatus({ code: SpanStatusCode.ERROR, ...(message ? { message } : {}) });
    return this;
  }

  end(endTime?: number): void {
    this.span.end(endTime);
  }
}

/**
 * The bound of the export queue, kept here so that a drop is counted: a span is handed to the batch
 * processor only while fewer than `max` wait for export, otherwise it is dropped at once. A span
 * leaves the count when its export starts (`taken`).
 */
class BoundedQueue {
  private waiting = 0;
  private readonly max: number;
  private readonly onDrop: () => void;

  constructor(max: number, onDrop: () => void) {
    this.max = max;
    this.onDrop = onDrop;
  }

  taken(n: number): void {
    this.waiting = Math.max(0, this.waiting - n);
  }

  processor(inner: SpanProcessor): SpanProcessor {
    return {
      onStart: (span, ctx) => inner.onStart(span, ctx),
      onEnd: (span) => {
        // A span recorded but not sampled is not exported (the batch processor skips it): not counted either.
        if ((span.spanContext().traceFlags & TraceFlags.SAMPLED) === 0) return;
        if (this.waiting >= this.max) {
          this.onDrop();
          return;
        }
        this.waiting++;
        inner.onEnd(span);
      },
      forceFlush: () => inner.forceFlush(),
      shutdown: () => inner.shutdown(),
    };
  }
}

/** The OTLP exporter, counting what it delivered and what it failed to. */
class CountingExporter implements SpanExporter {
  private readonly inner: SpanExporter;
  private readonly queue: BoundedQueue;
  private readonly count: { exported: (n: number) => void; failed: (n: number, first: boolean, err: unknown) => void };
  private failing = false;

  constructor(inner: SpanExporter, queue: BoundedQueue, count: CountingExporter["count"]) {
    this.inner = inner;
    this.queue = queue;
    this.count = count;
  }

  export(spans: ReadableSpan[], done: Parameters<SpanExporter["export"]>[1]): void {
    this.queue.taken(spans.length);
    this.inner.export(spans, (result) => {
      if (result.code === 0) {
        this.failing = false;
        this.count.exported(spans.length);
      } else {
        // Told once until an export succeeds again: a collector away for an hour is one warning.
        const first = !this.failing;
        this.failing = true;
        this.count.failed(spans.length, first, result.error);
      }
      done(result);
    });
  }

  shutdown(): Promise<void> {
    return this.inner.shutdown();
  }

  forceFlush(): Promise<void> {
    return this.inner.forceFlush?.() ?? Promise.resolve();
  }
}

export { SpanKind };
