import { monitorEventLoopDelay } from "node:perf_hooks";
import { Counter, collectDefaultMetrics, Gauge, Registry } from "prom-client";
import { LOAD_STATES, type LoadState } from "../ai/speech/loading.ts";
import { type ClassStats, JOB_CLASSES, type Scheduler } from "../ai/speech/scheduler.ts";
import { SeriesCounter, SeriesHistogram } from "./series-metrics.ts";

/** One per process: the event loop's delay, sampled every 10 ms. */
const loopDelay = monitorEventLoopDelay({ resolution: 10 });
loopDelay.enable();

/** Prometheus metrics of one node, served at `GET /metrics`. */
export class Metrics {
  readonly registry = new Registry();
  readonly requests = new SeriesCounter({
    name: "perch_http_requests_total",
    help: "HTTP requests by route and status",
    labelNames: ["method", "route", "status"] as const,
    registers: [this.registry],
  });
  readonly latency = new SeriesHistogram({
    name: "perch_http_request_duration_seconds",
    help: "HTTP request latency by route and status",
    labelNames: ["method", "route", "status"] as const,
    buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
    registers: [this.registry],
  });

  readonly aiRequests = new SeriesCounter({
    name: "perch_ai_requests_total",
    help: "Compatible API requests by route, model and status (streams count when they end)",
    labelNames: ["route", "model", "status"] as const,
    registers: [this.registry],
  });
  readonly aiLatency = new SeriesHistogram({
    name: "perch_ai_request_duration_seconds",
    help: "Compatible API request duration by route and model, to the last byte",
    labelNames: ["route", "model"] as const,
    buckets: [0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
    registers: [this.registry],
  });
  readonly aiTokens = new SeriesCounter({
    name: "perch_ai_tokens_total",
    help: "Tokens by model and kind (prompt, completion), as the provider reported them",
    labelNames: ["model", "kind"] as const,
    registers: [this.registry],
  });
  readonly aiErrors = new SeriesCounter({
    name: "perch_ai_errors_total",
    help: "Compatible API errors by route, model and OpenAI error type, including errors after a stream started",
    labelNames: ["route", "model", "type"] as const,
    registers: [this.registry],
  });

  /** `engineSchedulers`: the queues of the node's engines (its engine host's); `engineStates`: where their loading stands. */
  constructor(
    countActiveSessions: () => Promise<number>,
    engineSchedulers: () => readonly Scheduler[] = () => [],
    engineStates: () => ReadonlyArray<{ engine: string; state: LoadState }> = () => [],
  ) {
    // Node's own figures: resident memory, heap by space, event-loop lag, GC, handles, descriptors.
    collectDefaultMetrics({ register: this.registry });
    new Gauge({
      name: "perch_event_loop_lag_max_seconds",
      help: "The longest the event loop was held (its delay beyond the 10 ms sampling interval) since the previous scrape",
      registers: [this.registry],
      collect() {
        this.set(Math.max(0, loopDelay.max / 1e9 - 0.01));
        loopDelay.reset();
      },
    });
    new Gauge({
      name: "perch_active_sessions",
      help: "Live (unexpired, unrevoked) sessions in the store",
      registers: [this.registry],
      async collect() {
        this.set(await countActiveSessions());
      },
    });
    engineQueueMetrics(this.registry, engineSchedulers);
    new Gauge({
      name: "perch_engine_state",
      help: "Where each embedded engine's loading stands: 1 for its state (not_loaded until its first use or a preload, loading, ready, failed), 0 for the others",
      labelNames: ["engine", "state"],
      registers: [this.registry],
      collect() {
        this.reset();
        for (const { engine, state } of engineStates()) for (const s of LOAD_STATES) this.set({ engine, state: s }, s === state ? 1 : 0);
      },
    });
  }

  observe(method: string, route: string, status: number, seconds: number): void {
    const labels = [method, route, statusText(status)];
    this.requests.inc(labels);
    this.latency.observe(labels, seconds);
  }

  /** One Compatible API request: `model` is the id the client sent when it is a known one, else "unknown". */
  observeAi(route: string, model: string, status: number, seconds: number, errorType?: string): void {
    this.aiRequests.inc([route, model, statusText(status)]);
    this.aiLatency.observe([route, model], seconds);
    if (errorType) this.aiErrors.inc([route, model, errorType]);
  }

  tokens(model: string, usage: { prompt_tokens?: number; completion_tokens?: number } | undefined): void {
    if (!usage) return;
    if (usage.prompt_tokens) this.aiTokens.inc([model, "prompt"], usage.prompt_tokens);
    if (usage.completion_tokens) this.aiTokens.inc([model, "completion"], usage.completion_tokens);
  }
}

/** HTTP statuses as label values, made once. */
const STATUS_TEXT = Array.from({ length: 600 }, (_, i) => String(i));
function statusText(status: number): string {
  return STATUS_TEXT[status] ?? String(status);
}

/**
 * The embedded engines' queues (src/ai/speech/scheduler.ts), per engine and class of work:
 * depth and the oldest wait now, jobs started, seconds waited and refusals since the process
 * started (the mean wait is the rate of one over the other).
 */
function engineQueueMetrics(registry: Registry, schedulers: () => readonly Scheduler[]): void {
  const labelNames = ["engine", "class"] as const;
  const each = (fill: (labels: { engine: string; class: string }, s: ClassStats) => void) => {
    for (const scheduler of schedulers()) {
      const stats = scheduler.stats();
      for (const cls of JOB_CLASSES) fill({ engine: scheduler.name, class: cls }, stats[cls]);
    }
  };
  // Gauges and counters alike are filled from the schedulers' own figures when scraped.
  const metric = (Kind: typeof Gauge | typeof Counter) => (name: string, help: string, value: (s: ClassStats) => number) =>
    new Kind({
      name,
      help,
      labelNames,
      registers: [registry],
      collect(this: Gauge<"engine" | "class"> | Counter<"engine" | "class">) {
        this.reset();
        each((labels, s) => this.inc(labels, value(s)));
      },
    });
  const gauge = metric(Gauge);
  const counter = metric(Counter);
  new Gauge({
    name: "perch_engine_jobs_running",
    help: "Jobs running on an embedded engine's workers now, by engine",
    labelNames: ["engine"],
    registers: [registry],
    collect() {
      this.reset();
      for (const scheduler of schedulers()) this.inc({ engine: scheduler.name }, scheduler.busy);
    },
  });
  gauge("perch_engine_queue_depth", "Jobs waiting for an embedded engine, by engine and class (conversation, api, partial)", (s) => s.depth);
  gauge("perch_engine_queue_oldest_wait_seconds", "How long the oldest waiting job has waited, by engine and class", (s) => s.oldestWait);
  counter(
    "perch_engine_jobs_total",
    "Jobs started on an embedded engine (a sentence, an utterance, a batch of voice activity), by engine and class",
    (s) => s.started,
  );
  counter("perch_engine_queue_wait_seconds_total", "Seconds jobs waited before they started, summed, by engine and class", (s) => s.waited);
  counter("perch_engine_degraded_total", "Jobs run in an engine's fast mode to keep their deadline (Moonshine tiny), by engine and class", (s) => s.degraded);
  counter(
    "perch_engine_refused_total",
    "Jobs refused because they could not start in time (429, or an overloaded voice turn), by engine and class",
    (s) => s.refused,
  );
}
