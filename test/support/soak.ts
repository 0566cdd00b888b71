/**
 * The soak's measured process: a real server and a device SDK client in one process, `cycles`
 * connect/disconnect cycles, usage before and after printed as JSON. It exits on its own, because
 * node-datachannel's native callbacks can keep an event loop alive past the last test.
 */
import { readdirSync } from "node:fs";
import v8 from "node:v8";
import vm from "node:vm";
import pino from "pino";
import { generateKeyPair } from "../../src/crypto/keys.ts";
import { engines } from "./engines.ts";
import { startTestServer } from "./server.ts";
import { connect, eventually } from "./webrtc.ts";

v8.setFlagsFromString("--expose-gc");
const gc = vm.runInNewContext("gc") as () => void;
const cycles = Number(process.argv[2] ?? 200);
/**
 * Cycles run in this many lanes at once, each lane sequential: a connect costs little CPU but about
 * 300 ms of ICE and DTLS round trips, so two lanes keep the count (and the leak check) for about half the time.
 * (More lanes cost RSS the sequential cycles never showed, which the 80 MB bound then mistakes for a leak.)
 */
const lanes = Number(process.argv[3] ?? 2);

async function usage() {
  gc();
  await new Promise((r) => setTimeout(r, 100));
  gc();
  return {
    fds: readdirSync("/proc/self/fd").length,
    handles: (process as unknown as { _getActiveHandles(): unknown[] })._getActiveHandles().length,
    heap_mb: process.memoryUsage().heapUsed / 2 ** 20,
    rss_mb: process.memoryUsage().rss / 2 ** 20,
  };
}

// Warnings (a refused answer, say) go to stderr, which the test prints when the soak fails.
// Voice is on, so that every connection also opens (and must free) a voice conversation.
const server = await startTestServer({
  logger: pino({ level: "warn" }, pino.destination(2)),
  config: {
    providers: [{ id: "unused", kind: "openai-compatible", base_url: "http://127.0.0.1:9/v1" }],
    models: [{ id: "chat", kind: "chat", provider: "unused", upstream_model: "none" }],
    agents: [{ id: "talker", model: "chat" }],
    voice: { agent: "talker" },
  },
});
const voice = server.transport!.voice as unknown as { size: number };
let peakConversations = 0;
let lastKey = "";
const lane = async (n: number) => {
  const keyPair = generateKeyPair();
  for (let i = 0; i < n; i++) {
    // Every other connection reuses the lane's key (a device reconnecting), the rest are new devices.
    const conn = await connect(server, { keyPair: i % 2 === 0 ? keyPair : generateKeyPair() });
    if (i % 10 === 0 && (await conn.http(1, "GET", "/me")).status !== 200) throw new Error("GET /me over stream 1 failed");
    // Some conversations hear audio (silence: the uplink decodes, resamples and runs the detector).
    if (i % 10 === 5) {
      await conn.microphone();
      await new Promise((r) => setTimeout(r, 200));
    }
    peakConversations = Math.max(peakConversations, voice.size);
    conn.close();
    await eventually(() => !server.transport!.connection(conn.publicKey), 5000, "the server to let go of the connection");
    lastKey = conn.publicKey;
  }
};
const run = async (n: number) => {
  await Promise.all(Array.from({ length: lanes }, (_, l) => lane(Math.floor(n / lanes) + (l < n % lanes ? 1 : 0))));
  await eventually(() => server.transport!.size === 0, 5000, "the server to let go of every connection");
};
// The engines load in the background after the start (flite's workers in this process, some 100 MB or
// more): loaded before the first measure, so that the soak measures connections, not them.
await Promise.all([engines().speech.warmUp(), engines().transcription.start?.()]);
// Warm-up: the first connections grow the allocator's per-thread arenas and the caches for good, at
// every lane. Since the server checks a libwebrtc device's candidates at once (the connects overlap
// their DTLS and ICE differently), the process's first 200–300 connections raise its RSS by up to
// about 90 MB, where it stays: measured, 400 connections more after 400 added 4 MB. So the warm-up
// is 200 connections; a leak of a connection's native stack (about 430 KB) still shows as 80 MB.
await run(Number(process.argv[4] ?? 200));
const before = await usage();
const started = performance.now();
await run(cycles);
const seconds = (performance.now() - started) / 1000;
const after = await usage();
const offline = !(await server.domain.peers.runtime(lastKey)).online;
const conversations = { peak: peakConversations, open: voice.size };
await server.stop();
process.stdout.write(`${JSON.stringify({ cycles, lanes, seconds, before, after, offline, conversations })}\n`);
process.exit(0);
