/**
 * The request metrics' own counter and histogram (src/http/series-metrics.ts) against
 * prom-client's: the same observations give the same exposition, text and JSON.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { Counter, Histogram, Registry } from "prom-client";
import { SeriesCounter, SeriesHistogram } from "../src/http/series-metrics.ts";

const BUCKETS = [0.001, 0.005, 0.025, 0.1, 1];
const OBSERVED: Array<[string, string, number]> = [
  ["GET", "/a", 0.0004],
  ["GET", "/a", 0.001], // on a bound: that bucket
  ["GET", "/a", 0.03],
  ["POST", '/b"c\\d', 7], // above every bound; a label value to escape
  ["GET", "/a", 0.1],
];

function theirs() {
  const registry = new Registry();
  const counter = new Counter({ name: "t_total", help: "h", labelNames: ["method", "route"], registers: [registry] });
  const histogram = new Histogram({ name: "t_seconds", help: "h", labelNames: ["method", "route"], buckets: BUCKETS, registers: [registry] });
  for (const [method, route, v] of OBSERVED) {
    counter.inc({ method, route });
    counter.inc({ method, route }, 2);
    histogram.observe({ method, route }, v);
  }
  return registry;
}

function ours() {
  const registry = new Registry();
  const counter = new SeriesCounter({ name: "t_total", help: "h", labelNames: ["method", "route"], registers: [registry] });
  const histogram = new SeriesHistogram({ name: "t_seconds", help: "h", labelNames: ["method", "route"], buckets: BUCKETS, registers: [registry] });
  for (const [method, route, v] of OBSERVED) {
    counter.inc([method, route]);
    counter.inc([method, route], 2);
    histogram.observe([method, route], v);
  }
  return { registry, counter, histogram };
}

test("the same observations give prom-client's exposition, text and JSON", async () => {
  const { registry } = ours();
  assert.equal(await registry.metrics(), await theirs().metrics());
  const json = (x: unknown) => JSON.parse(JSON.stringify(x, (k, v) => (k === "exemplar" ? undefined : v)));
  assert.deepEqual(json(await registry.getMetricsAsJSON()), json(await theirs().getMetricsAsJSON()));
});

test("a count that is not a finite, non-negative number is left out; reset empties every series", async () => {
  const { registry, counter, histogram } = ours();
  const before = await registry.metrics();
  counter.inc(["GET", "/a"], -3);
  counter.inc(["GET", "/a"], Number.NaN);
  counter.inc(["GET", "/a"], "5" as unknown as number);
  histogram.observe(["GET", "/a"], Number.POSITIVE_INFINITY);
  assert.equal(await registry.metrics(), before);
  registry.resetMetrics();
  assert.equal(await registry.metrics(), "# HELP t_total h\n# TYPE t_total counter\n\n# HELP t_seconds h\n# TYPE t_seconds histogram\n");
});
