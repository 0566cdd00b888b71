/**
 * `npm run -s bench -- tools`: device tools through one node (in this process, beside its devices).
 *
 * - Round trip of a device tool call (Perch's MCP client → service stream 3 → the device SDK's
 *   `McpServer` handler → back), beside `all.ping` on the same connection (server → device, a new
 *   stream 0 per call, as Perch calls it) and the device's own `all.ping`, interleaved.
 * - 100 devices each offering 32 tools: the time from opening service 3 to the tools being listed;
 *   the node's heap per tool session (after GC), measured over in-memory streams before anything
 *   else runs (the devices share this process, and WebRTC's churn would blur it).
 */
import { mkdtempSync, rmSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { duplexPair } from "node:stream";
import v8 from "node:v8";
import vm from "node:vm";
import pino from "pino";
import { loadConfig } from "../src/config/config.ts";
import { generateKeyPair } from "../src/crypto/keys.ts";
import { DeviceToolSession } from "../src/mcp/device.ts";
import { SERVICE } from "../src/protocol/channel.ts";
import { RpcMethod } from "../src/protocol/gen/rpc_pb.ts";
import { rpcPayload } from "../src/protocol/rpc.ts";
import { PerchConnection } from "../src/sdk/webrtc.ts";
import { startServer } from "../src/server.ts";
import { round } from "./support.ts";

const env = (name: string, fallback: number) => Number(process.env[name] ?? fallback);
const CALLS = env("BENCH_TOOLS_CALLS", 300);
const DEVICES = env("BENCH_TOOLS_DEVICES", 100);
const TOOLS = env("BENCH_TOOLS_PER_DEVICE", 32);
const GOALS = { tool_call_p50_over_ping_ms: 2, heap_kb_per_session: 50 };

function pct(values: number[]) {
  const s = [...values].sort((a, b) => a - b);
  const at = (p: number) => round(s[Math.min(s.length - 1, Math.floor(p * s.length))] ?? Number.NaN);
  return { p50: at(0.5), p99: at(0.99), n: s.length };
}

v8.setFlagsFromString("--expose-gc");
const gc = vm.runInNewContext("gc") as () => void;
async function heapAfterGc(): Promise<number> {
  for (let i = 0; i < 3; i++) {
    gc();
    await new Promise((r) => setTimeout(r, 20));
  }
  return process.memoryUsage().heapUsed;
}

/** A device's tool list of `n` tools, as a device would describe them. */
function toolList(n: number) {
  return Array.from({ length: n }, (_, i) => ({
    name: `tool_${i}`,
    description: `Sets or reads setting number ${i} of the device (a value from 0 to 100), and says what it is now.`,
    inputSchema: { type: "object", properties: { value: { type: "integer", minimum: 0, maximum: 100 } }, required: ["value"] },
  }));
}

/**
 * The node's own heap per tool session: `DeviceToolSession`s over in-memory stream pairs (the
 * devices' ends answered by `answerTools`), measured apart from any WebRTC object.
 */
async function sessionHeapKb(n: number, listLine: (id: unknown) => string): Promise<number> {
  const pairs = Array.from({ length: n }, () => duplexPair());
  for (const [, device] of pairs) answerTools(device, listLine);
  const before = await heapAfterGc();
  const logger = pino({ level: "silent" });
  const sessions = pairs.map(([node], i) => new DeviceToolSession(node, { publicKey: `device-${i}`, logger }));
  await Promise.all(sessions.map((s) => s.start()));
  if (sessions.some((s) => s.tools.length !== TOOLS)) throw new Error("a session did not list its tools");
  const kb = ((await heapAfterGc()) - before) / 1024 / n;
  await Promise.all(sessions.map((s) => s.close()));
  return kb;
}

/** A minimal MCP server on a device's stream 3 (answers initialize and tools/list), so that the heap measured is the node's. */
function answerTools(stream: NodeJS.ReadWriteStream, listLine: (id: unknown) => string): void {
  let buffer = "";
  stream.on("data", (c: Buffer) => {
    buffer += c.toString();
    for (let nl = buffer.indexOf("\n"); nl !== -1; nl = buffer.indexOf("\n")) {
      const m = JSON.parse(buffer.slice(0, nl));
      buffer = buffer.slice(nl + 1);
      if (m.method === "initialize") {
        stream.write(
          `${JSON.stringify({ jsonrpc: "2.0", id: m.id, result: { protocolVersion: m.params.protocolVersion, capabilities: { tools: {} }, serverInfo: { name: "bench", version: "0" } } })}\n`,
        );
      } else if (m.method === "tools/list") stream.write(listLine(m.id));
    }
  });
}

async function until(fn: () => boolean, ms: number): Promise<void> {
  const end = Date.now() + ms;
  while (!fn()) {
    if (Date.now() > end) throw new Error("timed out");
    await new Promise((r) => setTimeout(r, 2));
  }
}

export async function toolsBench(): Promise<unknown> {
  const list = toolList(TOOLS);
  const listLine = (id: unknown) => `${JSON.stringify({ jsonrpc: "2.0", id, result: { tools: list } })}\n`;
  // First, while nothing else runs in this process: the heap figure is not blurred by WebRTC's.
  await sessionHeapKb(5, listLine); // warm-up: what the first session builds once (schemas, caches) is not per session
  const perSessionKb = await sessionHeapKb(DEVICES, listLine);
  const dataDir = mkdtempSync(join(tmpdir(), "perch-bench-tools-"));
  const config = loadConfig({}, { port: 0, host: "127.0.0.1", data_dir: dataDir, log_level: "silent", rate_limits: { login_per_key: 0, offer_per_key: 0 } });
  const server = await startServer({ config });
  const transport = server.transport!;
  const devices: PerchConnection[] = [];
  try {
    // Round trip: one device, its SDK's McpServer with an `echo` tool.
    const conn = await PerchConnection.connect({ baseUrl: server.url, keyPair: generateKeyPair() });
    devices.push(conn);
    let handled = 0;
    await conn.offerTools([
      {
        name: "echo",
        description: "Says back what it is given.",
        inputSchema: { type: "object", properties: { n: { type: "integer" } } },
        handler: (args) => {
          handled++;
          return String(args.n);
        },
      },
    ]);
    await until(() => transport.deviceTools(conn.publicKey)?.tools.length === 1, 10_000);
    const session = transport.deviceTools(conn.publicKey)!;
    const connection = transport.connection(conn.publicKey)!;
    const signal = new AbortController().signal;
    const tool: number[] = [];
    const serverPing: number[] = [];
    const devicePing: number[] = [];
    for (let i = -30; i < CALLS; i++) {
      let t = performance.now();
      const outcome = await session.call("echo", { n: i }, { timeoutMs: 5_000, signal });
      if (outcome.text !== String(i)) throw new Error(`echo answered ${outcome.text}`);
      if (i >= 0) tool.push(performance.now() - t);
      t = performance.now();
      await connection.call(RpcMethod.ALL_PING, rpcPayload.ping());
      if (i >= 0) serverPing.push(performance.now() - t);
      const { rttMs } = await conn.ping();
      if (i >= 0) devicePing.push(rttMs);
    }
    const roundTrip = { tool_call_ms: pct(tool), server_to_device_ping_ms: pct(serverPing), device_to_server_ping_ms: pct(devicePing), handled };

    // 100 devices × 32 tools.
    for (let i = 0; i < DEVICES; i++) devices.push(await PerchConnection.connect({ baseUrl: server.url, keyPair: generateKeyPair() }));
    const listMs: number[] = [];
    const started = performance.now();
    await Promise.all(
      devices.slice(1).map(async (d) => {
        const t = performance.now();
        answerTools(await d.openStream(SERVICE.TOOLS), listLine);
        await until(() => transport.deviceTools(d.publicKey)?.tools.length === TOOLS, 30_000);
        listMs.push(performance.now() - t);
      }),
    );
    const allListedMs = performance.now() - started;

    return {
      suite: "tools",
      load_average: loadavg().map(round),
      round_trip: roundTrip,
      tool_call_p50_over_ping_ms: round(roundTrip.tool_call_ms.p50 - roundTrip.server_to_device_ping_ms.p50),
      sessions: {
        devices: DEVICES,
        tools_per_device: TOOLS,
        heap_kb_per_session: round(perSessionKb),
        list_after_open_ms: pct(listMs),
        all_listed_ms: round(allListedMs),
      },
      goals: GOALS,
    };
  } finally {
    for (const d of devices) d.close();
    await server.close();
    rmSync(dataDir, { recursive: true, force: true });
  }
}
