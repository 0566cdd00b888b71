/**
 * The voice bench's memory phase (issue 38), two parts:
 *
 * - First turn with memory on versus off, side by side in one run: rounds of two fresh devices on
 *   the same server, one answered by an agent without memory, one by the same agent with memory
 *   (its device's memory seeded with `max_chars` of text), their order alternating; each device's
 *   first turn's server `first_token` and `speech_to_audio` (turn.metrics).
 * - Rewrites a second one node sustains with the scripted model: a node in this process (SQLite,
 *   and PostgreSQL when `PERCH_BENCH_DATABASE_URL` or `PERCH_TEST_DATABASE_URL` is set), rewrites of
 *   BENCH_MEMORY_DEVICES devices' memories submitted by BENCH_MEMORY_CONCURRENCY workers for
 *   BENCH_MEMORY_SECONDS: each one model call over HTTP to the scripted upstream and one
 *   conditional write.
 *
 * BENCH_VOICE_MEMORY_ROUNDS (default 8) rounds of the first part.
 */
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { loadConfig } from "../src/config/config.ts";
import { encodeKey, generateKeyPair, type KeyPair } from "../src/crypto/keys.ts";
import { PerchClient } from "../src/sdk/client.ts";
import { startServer } from "../src/server.ts";
import type { RewriteResult } from "../src/voice/memory-rewriter.ts";
import { ROOT, round } from "./support.ts";
import type { DeviceMessage, TurnReport } from "./voice-device.ts";

const ROUNDS = Number(process.env.BENCH_VOICE_MEMORY_ROUNDS ?? 8);
const DEVICES = Number(process.env.BENCH_MEMORY_DEVICES ?? 200);
const CONCURRENCY = Number(process.env.BENCH_MEMORY_CONCURRENCY ?? 32);
const SECONDS = Number(process.env.BENCH_MEMORY_SECONDS ?? 10);
const PG_URL = process.env.PERCH_BENCH_DATABASE_URL || process.env.PERCH_TEST_DATABASE_URL || undefined;
export const MEMORY_CHARS = 2_000;
/** The agent with memory the phase adds beside the bench's `talker`. */
export const MEMORY_AGENT = "talker-mem";

function pct(samples: number[]): { p50: number; p95: number; n: number } {
  const s = [...samples].sort((a, b) => a - b);
  const at = (q: number) => round(s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? Number.NaN);
  return { p50: at(0.5), p95: at(0.95), n: s.length };
}

/** A memory of `chars` characters, sentences of facts. */
function seedText(chars: number): string {
  const facts = ["Mia is seven.", "She likes chess.", "Her brother is Tom.", "The family prefers Celsius.", "Bedtime is at eight."];
  let text = "";
  for (let i = 0; text.length + facts[i % facts.length]!.length + 1 <= chars; i++) text += `${text ? " " : ""}${facts[i % facts.length]}`;
  return text;
}

/** The agents of the bench with the memory agent added. */
export function withMemoryAgent(agent: Record<string, unknown>): Array<Record<string, unknown>> {
  return [agent, { ...agent, id: MEMORY_AGENT, memory: { enabled: true, max_chars: MEMORY_CHARS } }];
}

export type RunDevice = (privateKeyHex: string, turns: number) => Promise<DeviceMessage[]>;

/** First turns of devices whose agent remembers (memory seeded) and of devices whose agent does not, alternating. */
export async function firstTurnWithMemory(url: string, env: Record<string, string>, run: RunDevice) {
  const on: TurnReport[] = [];
  const off: TurnReport[] = [];
  const errors: string[] = [];
  const first = (reports: DeviceMessage[]) => {
    for (const r of reports) if (r.type === "error") errors.push(r.message);
    return reports.find((r): r is TurnReport => r.type === "turn");
  };
  const registered = async (remembers: boolean): Promise<KeyPair> => {
    const keyPair = generateKeyPair();
    const device = new PerchClient({ baseUrl: url, keyPair });
    await device.login();
    if (remembers) {
      // Not spawnSync: a blocked event loop would miss the server closing an idle kept-alive connection.
      await promisify(execFile)(join(ROOT, "bin/perch"), ["peers", "voice", encodeKey(keyPair.publicKey), MEMORY_AGENT], { env: { ...process.env, ...env } });
      const phone = new PerchClient({ baseUrl: url, keyPair: generateKeyPair() });
      await phone.login({ deviceToken: (await device.createDeviceToken()).token });
      await phone.request("PUT", "/side-control/memory", { body: { text: seedText(MEMORY_CHARS) } });
    }
    return keyPair;
  };
  const hex = (k: KeyPair) => Buffer.from(k.privateKey).toString("hex");
  for (let i = 0; i < ROUNDS; i++) {
    const [a, b] = [await registered(false), await registered(true)];
    for (const [key, remembers] of i % 2 === 0
      ? ([
          [a, false],
          [b, true],
        ] as const)
      : ([
          [b, true],
          [a, false],
        ] as const)) {
      const turn = first(await run(hex(key), 2));
      if (turn) (remembers ? on : off).push(turn);
    }
  }
  const figure = (turns: TurnReport[], k: string) => pct(turns.map((t) => t.server[k]).filter((x): x is number => typeof x === "number"));
  const onFirst = figure(on, "first_token");
  const offFirst = figure(off, "first_token");
  const onAudio = figure(on, "speech_to_audio");
  const offAudio = figure(off, "speech_to_audio");
  return {
    rounds: ROUNDS,
    memory_chars: MEMORY_CHARS,
    errors,
    first_token_ms: { memory_on: onFirst, memory_off: offFirst, p50_difference: round(onFirst.p50 - offFirst.p50) },
    speech_to_audio_ms: { memory_on: onAudio, memory_off: offAudio, p50_difference: round(onAudio.p50 - offAudio.p50) },
  };
}

/** Rewrites a second one node in this process sustains on `databaseUrl` (SQLite when undefined) with the scripted model at `upstreamUrl`. */
async function rewriteRate(upstreamUrl: string, databaseUrl: string | undefined) {
  const dir = mkdtempSync(join(tmpdir(), "perch-bench-memory-"));
  const config = loadConfig(
    {},
    {
      port: 0,
      host: "127.0.0.1",
      data_dir: dir,
      log_level: "warn",
      webrtc: { enabled: false },
      ...(databaseUrl ? { database_url: databaseUrl } : {}),
      providers: [{ id: "local", kind: "openai-compatible", base_url: upstreamUrl, max_retries: 0 }],
      models: [{ id: "chat", kind: "chat", provider: "local", upstream_model: "scripted" }],
      agents: [{ id: "talker", model: "chat", memory: { enabled: true, max_chars: MEMORY_CHARS } }],
      voice: { agent: "talker" },
    },
  );
  const server = await startServer({ config });
  try {
    const keys: string[] = [];
    const now = Date.now();
    await server.store.transaction(async (tx) => {
      for (let i = 0; i < DEVICES; i++) {
        const key = encodeKey(generateKeyPair().publicKey);
        keys.push(key);
        await tx.peers.register({ public_key: key, role: "client", status: "active", device_info: "{}", created_at: now, updated_at: now });
      }
    });
    const said = [
      { role: "user" as const, text: "My name is Mia and I like chess." },
      { role: "assistant" as const, text: "Nice to meet you, Mia." },
    ];
    const policy = { max_chars: MEMORY_CHARS, idle_ms: 120_000, model: "chat" };
    const counts: Record<RewriteResult, number> = { ok: 0, failed: 0, skipped: 0 };
    const durations: number[] = [];
    const until = performance.now() + SECONDS * 1000;
    let next = 0;
    const cpu = process.cpuUsage();
    const started = performance.now();
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (performance.now() < until) {
          const deviceKey = keys[next++ % keys.length]!;
          const t = performance.now();
          counts[await server.memory.submit({ deviceKey, startedAt: 0, policy, said })]++;
          durations.push(performance.now() - t);
        }
      }),
    );
    const seconds = (performance.now() - started) / 1000;
    const used = process.cpuUsage(cpu);
    const cpuMs = (used.user + used.system) / 1000;
    return {
      devices: DEVICES,
      concurrency: CONCURRENCY,
      seconds: round(seconds),
      results: counts,
      rewrites_per_second: round(counts.ok / seconds),
      rewrite_ms: pct(durations),
      // The node's CPU (this process: the node and the submitting loop) per rewrite, and what one core of it sustains.
      node_cpu_ms_per_rewrite: round(cpuMs / Math.max(1, counts.ok)),
      rewrites_per_node_core_second: round((counts.ok / cpuMs) * 1000),
    };
  } finally {
    await server.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

export async function rewriteRates(upstreamUrl: string) {
  return {
    goal_rewrites_per_second: "≥ 200 on SQLite and PostgreSQL",
    sqlite: await rewriteRate(upstreamUrl, undefined),
    postgres: PG_URL ? await rewriteRate(upstreamUrl, PG_URL) : "skipped: set PERCH_BENCH_DATABASE_URL (or PERCH_TEST_DATABASE_URL)",
  };
}
