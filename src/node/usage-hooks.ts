import type { Logger } from "pino";
import { Counter, type Registry } from "prom-client";
import type { Domain } from "../domain/index.ts";
import type { MeterHooks } from "../domain/usage-meter.ts";

/**
 * What the node's usage meter tells: `perch_usage_total{counter,agent}` and
 * `perch_usage_limited_total{scope,counter}` (never a label per device or key), store errors
 * logged and counted, and a device's Side Control streams told when its limit is reached or resets.
 */
export function usageHooks(domain: Domain, registry: Registry, logger: Logger): MeterHooks {
  const total = new Counter({
    name: "perch_usage_total",
    help: "Usage counted, by counter and agent or model (audio_seconds in seconds)",
    labelNames: ["counter", "agent"],
    registers: [registry],
  });
  const limited = new Counter({
    name: "perch_usage_limited_total",
    help: "Work refused by a usage limit, by the limit's scope and counter",
    labelNames: ["scope", "counter"],
    registers: [registry],
  });
  const storeErrors = new Counter({
    name: "perch_usage_store_errors_total",
    help: "Store errors while counting usage (the work went on; the counts are written later)",
    registers: [registry],
  });
  let lastLog = Number.NEGATIVE_INFINITY;
  // Each (counter, agent) series found once: a labelled increment looks its labels up every time.
  const series = new Map<string, Counter.Internal>();
  const inc = (counter: string, agent: string, n: number) => {
    const k = `${counter}\0${agent}`;
    let child = series.get(k);
    if (!child) {
      child = total.labels({ counter, agent });
      series.set(k, child);
    }
    child.inc(n);
  };
  return {
    counted: (agent, c) => {
      if (c.requests) inc("requests", agent, c.requests);
      if (c.input_tokens) inc("input_tokens", agent, c.input_tokens);
      if (c.output_tokens) inc("output_tokens", agent, c.output_tokens);
      if (c.speech_chars) inc("speech_chars", agent, c.speech_chars);
      if (c.audio_ms) inc("audio_seconds", agent, c.audio_ms / 1000);
      if (c.tool_calls) inc("tool_calls", agent, c.tool_calls);
    },
    refused: (limit) => limited.inc({ scope: limit.scope, counter: limit.counter }),
    storeError: (err) => {
      storeErrors.inc();
      // At most a line a second while the store is away.
      const now = Date.now();
      if (now - lastLog < 1_000) return;
      lastLog = now;
      logger.warn({ err: err instanceof Error ? err.message : String(err) }, "usage could not be counted in the store; kept for the next write");
    },
    deviceLimited: (key) => {
      domain.usage.announce(key).catch((err: unknown) => logger.warn({ err: err instanceof Error ? err.message : String(err) }, "usage event not sent"));
    },
  };
}
