import { Counter, Gauge, Histogram, Registry } from "prom-client";

/** Prometheus metrics of one node, served at `GET /metrics`. */
export class Metrics {
  readonly registry = new Registry();
  readonly requests = new Counter({
    name: "perch_http_requests_total",
    help: "HTTP requests by route and status",
    labelNames: ["method", "route", "status"] as const,
    registers: [this.registry],
  });
  readonly latency = new Histogram({
    name: "perch_http_request_duration_seconds",
    help: "HTTP request latency by route and status",
    labelNames: ["method", "route", "status"] as const,
    buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
    registers: [this.registry],
  });

  constructor(countActiveSessions: () => Promise<number>) {
    new Gauge({
      name: "perch_active_sessions",
      help: "Live (unexpired, unrevoked) sessions in the store",
      registers: [this.registry],
      async collect() {
        this.set(await countActiveSessions());
      },
    });
  }

  observe(method: string, route: string, status: number, seconds: number): void {
    const labels = { method, route, status: String(status) };
    this.requests.inc(labels);
    this.latency.observe(labels, seconds);
  }
}
