/**
 * `npm run bench -- usage`: what counting usage costs on the hot paths, counting on and off side by
 * side in one run (two `perch serve` processes of this checkout, one with `usage.count: false`),
 * rounds alternating so that a machine whose speed moves moves both alike:
 * - the chat proxy's CPU per call as a ratio to the provider's own (32 connections, non-streaming;
 *   the counting server's API key has a daily request limit far away, so its claims run too);
 * - `GET /me/status` (requests a second and CPU per request);
 * - a voice turn's end of speech → first reply audio sent (server side, p50), embedded engines;
 * then counting under load: 2 nodes on PostgreSQL (`PERCH_BENCH_DATABASE_URL` or
 * `PERCH_TEST_DATABASE_URL`), 64 concurrent API clients on one key with a limit of N requests:
 * requests answered (≤ N + 2) and the store's count of them (= answered).
 * `BENCH_USAGE_ROUNDS` (2), `BENCH_DURATION_S` (10) per load, `BENCH_USAGE_TURNS` (4) turns a round,
 * `BENCH_USAGE_PHASES` (chat,status,voice,race).
 */
import { createHash } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { generateKeyPair } from "../src/crypto/keys.ts";
import { PerchClient } from "../src/sdk/client.ts";
import { startUpstream } from "./compat.ts";
import { benchConfig, freshPgDatabase, load, round, type Server, startServer, withCpu } from "./support.ts";
import { devices, questionFile, turnFigures } from "./voice.ts";
import type { DeviceMessage } from "./voice-device.ts";

const ROUNDS = Number(process.env.BENCH_USAGE_ROUNDS ?? 2);
const TURNS = Number(process.env.BENCH_USAGE_TURNS ?? 4);
const PHASES = new Set((process.env.BENCH_USAGE_PHASES ?? "chat,status,voice,race").split(","));
const PG_URL = process.env.PERCH_BENCH_DATABASE_URL || process.env.PERCH_TEST_DATABASE_URL || undefined;
const API_KEY = "sk-perch-bench-usage";
const RACE_LIMIT = Number(process.env.BENCH_USAGE_RACE_LIMIT ?? 500);
const RACE_CLIENTS = 64;

const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");

export async function usageBench(): Promise<unknown> {
  const loadBefore = loadavg();
  const upstream = await startUpstream();
  const dir = mkdtempSync(join(tmpdir(), "perch-bench-usage-"));
  const out: Record<string, unknown> = { suite: "usage", rounds: ROUNDS, load_before: loadBefore.map(round) };
  const servers: Server[] = [];
  try {
    const start = async (name: "on" | "off", extra: Record<string, unknown> = {}) => {
      const d = mkdtempSync(join(dir, `${name}-`));
      const counting = name === "on";
      const server = await startServer({
        PERCH_DATA_DIR: d,
        PERCH_LOG_LEVEL: "warn",
        ...benchConfig(d, {
          providers: [{ id: "upstream", kind: "openai-compatible", base_url: upstream.url, max_retries: 0 }],
          models: [{ id: "chat", kind: "chat", provider: "upstream", upstream_model: "short" }],
          api_keys: [{ name: "bench", sha256: sha256(API_KEY), ...(counting ? { limits: [{ per: "day", requests: 1_000_000_000 }] } : {}) }],
          usage: counting ? { limits: [{ scope: "device", per: "day", requests: 1_000_000_000, tokens: 1_000_000_000 }] } : { count: false },
          ...extra,
        }),
      });
      servers.push(server);
      return server;
    };
    if (PHASES.has("chat") || PHASES.has("status")) {
      const on = await start("on");
      const off = await start("off");
      await Promise.all([on.settled(), off.settled()]);
      if (PHASES.has("chat")) out.chat_proxy_cpu = await chatPhase(upstream, { on, off });
      if (PHASES.has("status")) out.me_status = await statusPhase({ on, off });
      for (const s of [on, off]) await s.stop();
    }
    if (PHASES.has("voice")) out.voice_turn = await voicePhase(dir, upstream.url, start);
    out.race = PHASES.has("race") ? await racePhase(dir, upstream.url) : "not measured";
  } finally {
    for (const s of servers) await s.stop();
    upstream.child.kill();
    rmSync(dir, { recursive: true, force: true });
  }
  out.load_after = loadavg().map(round);
  return out;
}

/** Non-streaming chat at 32 connections: CPU per call of each server over the provider's, counting on and off, alternating. */
async function chatPhase(upstream: Awaited<ReturnType<typeof startUpstream>>, s: { on: Server; off: Server }) {
  const body = JSON.stringify({ model: "chat", messages: [{ role: "user", content: "Say something short." }] });
  const through = (server: Server) => ({
    url: `${server.url}/openai/v1/chat/completions`,
    method: "POST" as const,
    headers: { authorization: `Bearer ${API_KEY}`, "content-type": "application/json" },
    body,
  });
  const direct = { url: `${upstream.url}/chat/completions`, method: "POST" as const, headers: { "content-type": "application/json" }, body };
  for (const o of [direct, through(s.on), through(s.off)]) await load("warm-up", { ...o, duration: 3 });
  const rounds: Array<Record<string, unknown>> = [];
  const sum = { direct: 0, on: 0, off: 0 };
  for (let i = 0; i < ROUNDS; i++) {
    const d = await withCpu(upstream.child.pid!, () => load("direct", direct));
    const on = await withCpu(s.on.child.pid!, () => load("counting on", through(s.on)));
    const off = await withCpu(s.off.child.pid!, () => load("counting off", through(s.off)));
    sum.direct += d.server_cpu_us_per_request;
    sum.on += on.server_cpu_us_per_request;
    sum.off += off.server_cpu_us_per_request;
    rounds.push({
      provider_cpu_us: d.server_cpu_us_per_request,
      on: {
        rps: on.requests_per_second,
        cpu_us: on.server_cpu_us_per_request,
        non_2xx: on.non_2xx,
        over_provider: round(on.server_cpu_us_per_request / d.server_cpu_us_per_request),
      },
      off: {
        rps: off.requests_per_second,
        cpu_us: off.server_cpu_us_per_request,
        non_2xx: off.non_2xx,
        over_provider: round(off.server_cpu_us_per_request / d.server_cpu_us_per_request),
      },
    });
  }
  return {
    rounds,
    on_over_provider: round(sum.on / sum.direct),
    off_over_provider: round(sum.off / sum.direct),
    on_over_off: round(sum.on / sum.off),
    goal: "counting on ≤ 3.5× the provider's CPU per call",
    goal_met: sum.on / sum.direct <= 3.5,
  };
}

/** `GET /me/status` at 32 connections, a device's bearer on each server, alternating. */
async function statusPhase(s: { on: Server; off: Server }) {
  const bearer = async (server: Server) => {
    const c = new PerchClient({ baseUrl: server.url, keyPair: generateKeyPair() });
    await c.login();
    await c.putStatus({ volume: 40, battery_percent: 80 });
    return c.accessToken!;
  };
  const opts = async (server: Server) => ({ url: `${server.url}/me/status`, headers: { authorization: `Bearer ${await bearer(server)}` } });
  const on = await opts(s.on);
  const off = await opts(s.off);
  for (const o of [on, off]) await load("warm-up", { ...o, duration: 3 });
  const rounds: Array<Record<string, unknown>> = [];
  const sum = { on: 0, off: 0, onRps: 0, offRps: 0 };
  for (let i = 0; i < ROUNDS; i++) {
    const a = await withCpu(s.on.child.pid!, () => load("status, counting on", on));
    const b = await withCpu(s.off.child.pid!, () => load("status, counting off", off));
    sum.on += a.server_cpu_us_per_request;
    sum.off += b.server_cpu_us_per_request;
    sum.onRps += a.requests_per_second;
    sum.offRps += b.requests_per_second;
    rounds.push({
      on: { rps: a.requests_per_second, cpu_us: a.server_cpu_us_per_request, p50_ms: a.latency_ms.p50 },
      off: { rps: b.requests_per_second, cpu_us: b.server_cpu_us_per_request, p50_ms: b.latency_ms.p50 },
    });
  }
  return { rounds, on_over_off_cpu: round(sum.on / sum.off), on_over_off_rps: round(sum.onRps / sum.offRps) };
}

/** A device's voice turns (embedded engines, the fake provider's model), counting on and off, rounds alternating. */
async function voicePhase(dir: string, upstreamUrl: string, start: (name: "on" | "off", extra?: Record<string, unknown>) => Promise<Server>) {
  const question = await questionFile(dir);
  const voice = {
    models: [{ id: "chat", kind: "chat", provider: "upstream", upstream_model: "scripted" }],
    providers: [{ id: "upstream", kind: "openai-compatible", base_url: upstreamUrl, max_retries: 0 }],
    agents: [{ id: "talker", model: "chat", instructions: "Answer briefly.", voice: "alloy" }],
    voice: { agent: "talker" },
  };
  const on = await start("on", voice);
  const off = await start("off", voice);
  const sides = { on: [] as DeviceMessage[], off: [] as DeviceMessage[] };
  // Warm-up: models loaded, flite compiled, on both.
  for (const s of [on, off]) await devices(s, question, 1, 1, "turns", 2);
  for (let i = 0; i < ROUNDS; i++) {
    sides.on.push(...(await devices(on, question, 1, 1, "turns", TURNS)));
    sides.off.push(...(await devices(off, question, 1, 1, "turns", TURNS)));
  }
  const a = turnFigures(sides.on);
  const b = turnFigures(sides.off);
  await on.stop();
  await off.stop();
  return {
    on: { turns: a.turns, errors: a.errors, server_speech_to_audio_ms: a.server_speech_to_audio_ms },
    off: { turns: b.turns, errors: b.errors, server_speech_to_audio_ms: b.server_speech_to_audio_ms },
    on_minus_off_p50_ms: round(a.server_speech_to_audio_ms.p50 - b.server_speech_to_audio_ms.p50),
    goal: "≤ +5 ms p50",
  };
}

/** Two nodes on one PostgreSQL database, 64 clients on one key with a limit of RACE_LIMIT requests a day. */
async function racePhase(dir: string, upstreamUrl: string): Promise<unknown> {
  if (!PG_URL) return "not measured: set PERCH_BENCH_DATABASE_URL (or PERCH_TEST_DATABASE_URL) to a PostgreSQL server";
  const url = await freshPgDatabase(PG_URL);
  const nodes: Server[] = [];
  try {
    for (const name of ["a", "b"]) {
      const d = mkdtempSync(join(dir, `race-${name}-`));
      nodes.push(
        await startServer({
          PERCH_DATA_DIR: d,
          PERCH_LOG_LEVEL: "warn",
          PERCH_NODE_NAME: `race-${name}`,
          PERCH_DATABASE_URL: url,
          ...benchConfig(d, {
            providers: [{ id: "upstream", kind: "openai-compatible", base_url: upstreamUrl, max_retries: 0 }],
            models: [{ id: "chat", kind: "chat", provider: "upstream", upstream_model: "short" }],
            api_keys: [{ name: "race", sha256: sha256(API_KEY), limits: [{ per: "day", requests: RACE_LIMIT }] }],
          }),
        }),
      );
    }
    const body = JSON.stringify({ model: "chat", messages: [{ role: "user", content: "go" }] });
    let answered = 0;
    let refused = 0;
    let other = 0;
    const started = performance.now();
    await Promise.all(
      Array.from({ length: RACE_CLIENTS }, async (_, i) => {
        const node = nodes[i % nodes.length]!;
        for (;;) {
          const res = await fetch(`${node.url}/openai/v1/chat/completions`, {
            method: "POST",
            headers: { authorization: `Bearer ${API_KEY}`, "content-type": "application/json" },
            body,
          });
          await res.arrayBuffer();
          if (res.status === 200) answered++;
          else if (res.status === 429) {
            refused++;
            return;
          } else other++;
        }
      }),
    );
    const seconds = (performance.now() - started) / 1000;
    for (const n of nodes) await n.stop();
    const pg = (await import("pg")).default;
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    let stored: number;
    try {
      const r = await client.query("select coalesce(sum(requests), 0)::int as n from usage_days where principal = 'api_key:race'");
      stored = r.rows[0].n as number;
    } finally {
      await client.end();
    }
    return {
      nodes: nodes.length,
      clients: RACE_CLIENTS,
      limit: RACE_LIMIT,
      answered,
      refused,
      other_statuses: other,
      stored_requests: stored,
      requests_per_second: round(answered / seconds),
      answered_within_limit_plus_nodes: answered <= RACE_LIMIT + nodes.length,
      stored_equals_answered: stored === answered,
    };
  } finally {
    for (const n of nodes) await n.stop();
  }
}
