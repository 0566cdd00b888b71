/**
 * `npm run -s bench -- mcp-bounds`: what a hostile MCP server's answers cost the node, read through
 * Perch's bounded fetch (4 MiB a response) and, side by side in the same run, through the SDK's
 * transport as it is (everything read). A 50 MB tool result (as an event stream and as JSON) and
 * a 12 MB `tools/list`, each from a real MCP server (the SDK's) in a process of its own: the
 * call's time (the server's own serialising included), this process's peak memory (heap, array
 * buffers and external, sampled every 5 ms) above its level before the call, and the event loop's
 * longest stall during it. Ratios floor the bounded figure at 1 MB and 1 ms.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { monitorEventLoopDelay } from "node:perf_hooks";
import v8 from "node:v8";
import vm from "node:vm";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { boundedFetch } from "../src/mcp/bounded-fetch.ts";
import { McpToolClient } from "../src/mcp/mcp-client.ts";
import { ROOT, round } from "./support.ts";

v8.setFlagsFromString("--expose-gc");
const gc = vm.runInNewContext("gc") as () => void;
const settle = async () => {
  for (let i = 0; i < 3; i++) {
    gc();
    await new Promise((r) => setTimeout(r, 50));
  }
};

async function startBig(mode: "sse" | "json"): Promise<{ url: string; child: ChildProcess }> {
  const child = spawn(process.execPath, ["--import", "tsx", `${ROOT}bench/mcp-big-server.ts`, mode], { cwd: ROOT, stdio: ["ignore", "pipe", "inherit"] });
  const port = await new Promise<string>((resolve) => child.stdout!.once("data", (d: Buffer) => resolve(d.toString().trim())));
  return { url: `http://127.0.0.1:${port}/mcp`, child };
}

/** One measured act: its time, the peak RSS above before, the longest event-loop stall. */
const held = () => {
  const m = process.memoryUsage();
  return m.heapUsed + m.external + m.arrayBuffers;
};

async function measure(act: () => Promise<unknown>): Promise<{ ms: number; peak_mb: number; max_loop_stall_ms: number; outcome: string }> {
  await settle();
  const base = held();
  let peak = base;
  const sampler = setInterval(() => {
    peak = Math.max(peak, held());
  }, 5);
  const loop = monitorEventLoopDelay({ resolution: 5 });
  loop.enable();
  const started = performance.now();
  let outcome: string;
  try {
    const r = await act();
    outcome = typeof r === "string" ? r : "ok";
  } catch (err) {
    outcome = `failed: ${(err as Error).message.slice(0, 80)}`;
  }
  const ms = performance.now() - started;
  loop.disable();
  clearInterval(sampler);
  peak = Math.max(peak, held());
  return { ms: round(ms), peak_mb: round((peak - base) / 1e6), max_loop_stall_ms: round(loop.max / 1e6), outcome };
}

async function client(url: string, bounded: boolean): Promise<McpToolClient> {
  const mcp = new McpToolClient({ timeoutMs: 60_000, onIgnored: () => {} });
  mcp.client.onerror = () => {};
  const transport = new StreamableHTTPClientTransport(new URL(url), bounded ? { fetch: boundedFetch() } : {});
  // Connect without listing (the list is measured on its own).
  await mcp.client.connect(transport, { timeout: 60_000 });
  return mcp;
}

export async function mcpBoundsBench(): Promise<unknown> {
  const cases: Record<string, unknown> = {};
  for (const mode of ["sse", "json"] as const) {
    const { url, child } = await startBig(mode);
    try {
      for (const what of ["call_50mb", "list_12mb"] as const) {
        const row: Record<string, unknown> = {};
        for (const bounded of [true, false]) {
          const mcp = await client(url, bounded);
          try {
            row[bounded ? "bounded" : "unbounded"] = await measure(async () => {
              if (what === "list_12mb") {
                await mcp.list();
                return `${mcp.tools.length} tools`;
              }
              const o = await mcp.call("big", {}, { timeoutMs: 60_000, signal: new AbortController().signal });
              return `${o.isError ? "error" : "ok"}, ${o.text.length} characters`;
            });
          } finally {
            await mcp.close().catch(() => {});
          }
        }
        const b = row.bounded as { ms: number; peak_mb: number; max_loop_stall_ms: number };
        const u = row.unbounded as typeof b;
        row.ratio_unbounded_over_bounded = {
          ms: round(u.ms / b.ms),
          peak_memory: round(u.peak_mb / Math.max(b.peak_mb, 1)),
          max_loop_stall: round(u.max_loop_stall_ms / Math.max(b.max_loop_stall_ms, 1)),
        };
        cases[`${what}_${mode}`] = row;
      }
    } finally {
      child.kill();
    }
  }
  return { bench: "mcp-bounds", response_bound_bytes: 4 * 1024 * 1024, note: "shared machine: compare the ratios of one run", cases };
}
