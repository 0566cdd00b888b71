import { Counter, Gauge, Histogram, type Registry } from "prom-client";

/** The tools contract's metrics (tools.md §3). */
export class ToolMetrics {
  private readonly calls: Counter<"source" | "result">;
  private readonly seconds: Histogram<"source">;
  private readonly up: Gauge<"server">;

  constructor(registry: Registry) {
    this.calls = new Counter({
      name: "perch_tool_calls_total",
      help: "Tool calls an agent made, by source (builtin, device, or the MCP server id) and result (ok, error, timeout)",
      labelNames: ["source", "result"] as const,
      registers: [registry],
    });
    this.seconds = new Histogram({
      name: "perch_tool_call_seconds",
      help: "Tool call duration by source",
      labelNames: ["source"] as const,
      buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
      registers: [registry],
    });
    this.up = new Gauge({
      name: "perch_mcp_servers_up",
      help: "Whether each configured MCP server is connected (1) or away (0)",
      labelNames: ["server"] as const,
      registers: [registry],
    });
  }

  call(source: string, result: "ok" | "error" | "timeout", seconds: number): void {
    this.calls.inc({ source, result });
    this.seconds.observe({ source }, seconds);
  }

  serverUp(server: string, up: boolean): void {
    this.up.set({ server }, up ? 1 : 0);
  }
}
