/** `npm run bench -- webrtc`: the WebRTC transport of one `perch serve` process, measured by device SDK clients. */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { generateKeyPair } from "../src/crypto/keys.ts";
import { PerchConnection } from "../src/sdk/webrtc.ts";
import { benchConfig, startServer } from "./support.ts";

const CONNECTS = Number(process.env.BENCH_WEBRTC_CONNECTS ?? 30);
const PINGS = Number(process.env.BENCH_WEBRTC_PINGS ?? 300);
const REQUESTS = Number(process.env.BENCH_WEBRTC_REQUESTS ?? 300);

function pct(values: number[]) {
  const s = [...values].sort((a, b) => a - b);
  const at = (p: number) => Math.round((s[Math.min(s.length - 1, Math.floor(p * s.length))] ?? 0) * 100) / 100;
  return { p50: at(0.5), p99: at(0.99), n: s.length };
}

export async function webrtcBench(): Promise<unknown> {
  const dir = mkdtempSync(join(tmpdir(), "perch-bench-webrtc-"));
  const server = await startServer({
    PERCH_DATA_DIR: dir,
    PERCH_LOG_LEVEL: "warn",
    ...benchConfig(dir, { rateLimits: { loginPerKey: 0, loginPerAddress: 0, deviceTokenPerDevice: 0, offerPerKey: 0 } }),
  });
  try {
    const offer: number[] = [];
    const ready: number[] = [];
    for (let i = 0; i < CONNECTS; i++) {
      const c = await PerchConnection.connect({ baseUrl: server.url, keyPair: generateKeyPair() });
      offer.push(Number(/total;dur=([\d.]+)/.exec(c.timings.serverTiming)?.[1] ?? 0));
      ready.push(c.timings.ready);
      c.close();
    }
    const conn = await PerchConnection.connect({ baseUrl: server.url, keyPair: generateKeyPair() });
    const rtt: number[] = [];
    for (let i = 0; i < PINGS; i++) rtt.push((await conn.ping()).rttMs);
    let started = performance.now();
    for (let i = 0; i < REQUESTS; i++) await conn.http(1, "GET", "/healthz");
    const overStream = REQUESTS / ((performance.now() - started) / 1000);
    started = performance.now();
    for (let i = 0; i < REQUESTS; i++) await (await fetch(`${server.url}/healthz`, { headers: { connection: "close" } })).text();
    const overTcp = REQUESTS / ((performance.now() - started) / 1000);
    const bytes = 4 * 1024 * 1024;
    const down = await conn.speedTest(bytes, 0).catch(() => ({ ms: Number.NaN }));
    const up = await conn.speedTest(0, bytes).catch(() => ({ ms: Number.NaN }));
    conn.close();
    return {
      suite: "webrtc",
      offer_handling_ms_server: pct(offer),
      connect_to_ready_ms_client: pct(ready),
      rpc_ping_rtt_ms: pct(rtt),
      http_sequential_requests_per_second: {
        over_stream_1: Math.round(overStream),
        over_tcp_new_connection_each: Math.round(overTcp),
        ratio: Math.round((overStream / overTcp) * 100) / 100,
      },
      stream_throughput_mb_per_s: {
        down: Math.round((bytes / 2 ** 20 / (down.ms / 1000)) * 10) / 10,
        up: Math.round((bytes / 2 ** 20 / (up.ms / 1000)) * 10) / 10,
      },
      not_measured_yet: ["telemetry frames/s ingested", "concurrent devices held (node-datachannel crowd in separate processes)"],
    };
  } finally {
    await server.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}
