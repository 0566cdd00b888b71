/**
 * Conversations in Side Control, part of `npm run bench -- events` (`BENCH_EVENTS_ONLY=conversations`
 * for this part alone). Two nodes in this process:
 *
 * - The live path: devices' conversations on node A (each entry goes in as the conversation emits
 *   it: a voice event through the transcript observer, `src/voice/transcript.ts`, to the node's
 *   recorder, stored too) and one phone per device streaming `GET /side-control/events` from node B
 *   over PostgreSQL. Latency: the final transcript's event leaving the conversation → the
 *   `conversation` event parsed at the phone. (The recognition before it is the voice bench's
 *   `transcription` stage.)
 * - Reads at 1,000,000 stored entries of one device (50,000 conversations of 20 entries), on
 *   SQLite and on PostgreSQL: the first page, a page deep in the list (by its cursor), and one
 *   conversation, each over HTTP one at a time; beside them `GET /side-control/status` with the
 *   same bearer (what any Side Control read costs here) and the list's store reads alone.
 *
 * Sizes: BENCH_CONV_DEVICES (50), BENCH_CONV_INTERVAL_MS (1000: an entry per device this often),
 * BENCH_CONV_ENTRIES (1000000), BENCH_CONV_READS (200); BENCH_CONV_ONLY (`live` or `reads`).
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import pg from "pg";
import { loadConfig } from "../src/config/config.ts";
import { generateKeyPair } from "../src/crypto/keys.ts";
import { PerchClient } from "../src/sdk/client.ts";
import { type RunningServer, startServer } from "../src/server.ts";
import { encodeVoiceEvent, VoiceEvents } from "../src/voice/peer-events.ts";
import { observeTranscript } from "../src/voice/transcript.ts";
import { parseSseBlock, sseBlocks } from "../test/support/sse.ts";
import { percentiles } from "./support.ts";

const DEVICES = Number(process.env.BENCH_CONV_DEVICES ?? 50);
const INTERVAL_MS = Number(process.env.BENCH_CONV_INTERVAL_MS ?? 1000);
const WINDOW_S = Number(process.env.BENCH_EVENTS_WINDOW_S ?? 20);
const ENTRIES = Number(process.env.BENCH_CONV_ENTRIES ?? 1_000_000);
const READS = Number(process.env.BENCH_CONV_READS ?? 200);
const PER_CONVERSATION = 20;

async function node(dir: string, databaseUrl: string | undefined, nodeName: string): Promise<RunningServer> {
  const config = loadConfig(
    {},
    {
      port: 0,
      host: "127.0.0.1",
      data_dir: dir,
      log_level: "warn",
      node_name: nodeName,
      webrtc: { enabled: false },
      rate_limits: { login_per_key: 0, login_per_address: 0, device_token_per_device: 0, offer_per_key: 0 },
      voice: { store_transcripts: true },
      ...(databaseUrl ? { database_url: databaseUrl } : {}),
    },
  );
  const server = await startServer({ config });
  // The recogniser's models load on every core after the start: measured only once they have.
  await server.engines.transcription?.start?.();
  return server;
}

/** A registered device on `a` and a phone's Side Control bearer for it. */
async function paired(a: RunningServer, b: RunningServer): Promise<{ key: string; bearer: string }> {
  const device = new PerchClient({ baseUrl: a.url, keyPair: generateKeyPair() });
  await device.login();
  const phone = new PerchClient({ baseUrl: b.url, keyPair: generateKeyPair() });
  const login = await phone.login({ deviceToken: (await device.createDeviceToken()).token });
  return { key: device.publicKey, bearer: login.access_token };
}

/** Reads `conversation` events of one stream, calling `seen(text)` as each is parsed. */
async function watch(url: string, bearer: string, signal: AbortSignal, seen: (text: string) => void): Promise<void> {
  const res = await fetch(`${url}/side-control/events`, { headers: { authorization: `Bearer ${bearer}` }, signal });
  if (!res.ok || !res.body) throw new Error(`events refused: ${res.status}`);
  (async () => {
    for await (const block of sseBlocks(res.body!)) {
      const { event, data } = parseSseBlock(block);
      if (event === "conversation" && data !== undefined) seen((JSON.parse(data) as { text: string }).text);
    }
  })().catch(() => {});
}

async function livePath(databaseUrl: string) {
  const dir = mkdtempSync(join(tmpdir(), "perch-bench-conv-"));
  const a = await node(dir, databaseUrl, "conv-a");
  const b = await node(dir, databaseUrl, "conv-b");
  const abort = new AbortController();
  try {
    const sent = new Map<string, number>();
    const latencies: number[] = [];
    const devices = [];
    for (let i = 0; i < DEVICES; i++) {
      const { key, bearer } = await paired(a, b);
      await watch(b.url, bearer, abort.signal, (text) => {
        const t0 = sent.get(text);
        if (t0 !== undefined) latencies.push(performance.now() - t0);
      });
      // The conversation's side of the seam: its events go out on a port the observer wraps.
      const recorder = a.domain.conversations.open(key, () => {});
      const port = observeTranscript(
        {
          publicKey: key,
          payloadType: 111,
          onPacket: () => () => {},
          sendFrame: () => true,
          sendEvent: (event) => {
            encodeVoiceEvent(event, 1n, BigInt(Date.now()));
            return true;
          },
        },
        (e) => recorder.add(e),
      ).port;
      devices.push({ events: new VoiceEvents(port), turn: 0, recorder });
    }
    await new Promise((r) => setTimeout(r, 1000));
    let n = 0;
    const started = performance.now();
    // Devices' turns spread over the interval.
    const timers = devices.map((d, i) =>
      setTimeout(
        () => {
          const tick = () => {
            const text = `What is the weather like today, number ${n++}?`;
            d.turn++;
            sent.set(text, performance.now());
            d.events.done(`in-${d.turn}`, "user.transcript", text);
          };
          tick();
          timers.push(setInterval(tick, INTERVAL_MS) as unknown as NodeJS.Timeout);
        },
        (i * INTERVAL_MS) / DEVICES,
      ),
    );
    await new Promise((r) => setTimeout(r, WINDOW_S * 1000));
    for (const t of timers) clearInterval(t);
    await new Promise((r) => setTimeout(r, 2000));
    for (const d of devices) d.recorder.close();
    await Promise.all(devices.map((d) => d.recorder.settled()));
    return {
      name: `two nodes (PostgreSQL): ${DEVICES} devices conversing on node A (an entry each every ${INTERVAL_MS} ms, stored), a phone each on node B`,
      entries_sent: sent.size,
      entries_received: latencies.length,
      entries_per_second: Math.round((sent.size / (performance.now() - started)) * 1000),
      latency_ms: percentiles(latencies),
      goals_ms: { p50: 300, p99: 1000 },
    };
  } finally {
    abort.abort();
    await Promise.all([a.close(), b.close()]);
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Fills the store with `ENTRIES` entries of the device in conversations of 20, with the database's own bulk insert. */
async function fill(store: "sqlite" | "postgres", dir: string, databaseUrl: string | undefined, key: string): Promise<void> {
  const conversations = Math.ceil(ENTRIES / PER_CONVERSATION);
  const t0 = Date.now() - conversations * 60_000;
  const statements = [
    `insert into conversations (id, public_key, started_at, ended_at, last_at, turns, entries, last_text)
     select 'c' || lpad_n, '${key}', ${t0} + n * 60000, ${t0} + n * 60000 + 50000, ${t0} + n * 60000 + 50000, ${PER_CONVERSATION / 2}, ${PER_CONVERSATION}, 'Good night, sleep well.'
     from ns`,
    `insert into conversation_entries (conversation_id, seq, turn, role, text, at, interrupted, tool_name, tool_is_error)
     select 'c' || lpad_n, s, s / 2 + 1, case when s % 2 = 0 then 'user' else 'assistant' end,
       case when s % 2 = 0 then 'Can you tell me a story about the moon?' else 'Once upon a time the moon came down to play by the sea.' end,
       ${t0} + n * 60000 + s * 2500, 0, null, null
     from ns, ss`,
  ];
  if (store === "sqlite") {
    const db = new DatabaseSync(join(dir, "perch.db"));
    db.exec("PRAGMA busy_timeout = 10000; PRAGMA foreign_keys = OFF");
    const ns = `with recursive nn(n) as (select 0 union all select n + 1 from nn where n + 1 < ${conversations}),
      ns as (select n, substr('000000000' || n, -9) as lpad_n from nn),
      ss(s) as (select 0 union all select s + 1 from ss where s + 1 < ${PER_CONVERSATION}) `;
    db.exec("begin");
    for (const s of statements) db.exec(ns + s);
    db.exec("commit");
    db.exec("analyze");
    db.close();
    return;
  }
  const c = new pg.Client({ connectionString: databaseUrl });
  await c.connect();
  try {
    const ns = `with ns as (select n, lpad(n::text, 9, '0') as lpad_n from generate_series(0::bigint, ${conversations - 1}) n),
      ss as (select s from generate_series(0, ${PER_CONVERSATION - 1}) s) `;
    for (const s of statements) await c.query(ns + s);
    await c.query("analyze conversations; analyze conversation_entries");
  } finally {
    await c.end();
  }
}

/** Each of `runs` timed `n` times, taking turns; percentiles per run. */
async function sideBySide(n: number, runs: Record<string, () => Promise<void>>): Promise<Record<string, { p50: number; p99: number }>> {
  const ms: Record<string, number[]> = Object.fromEntries(Object.keys(runs).map((k) => [k, []]));
  for (let i = 0; i < n; i++) {
    for (const [name, fn] of Object.entries(runs)) {
      const t = performance.now();
      await fn();
      ms[name]!.push(performance.now() - t);
    }
  }
  return Object.fromEntries(Object.entries(ms).map(([k, v]) => [k, percentiles(v)]));
}

async function reads(store: "sqlite" | "postgres", databaseUrl: string | undefined) {
  const dir = mkdtempSync(join(tmpdir(), "perch-bench-conv-"));
  let server = await node(dir, databaseUrl, "conv-reads");
  try {
    const { key, bearer } = await paired(server, server);
    const filling = Date.now();
    await fill(store, dir, databaseUrl, key);
    const fillS = (Date.now() - filling) / 1000;
    // Started again on the filled database, as a node would be.
    await server.close();
    server = await node(dir, databaseUrl, "conv-reads");
    const get = async <T>(path: string): Promise<T> => {
      const res = await fetch(`${server.url}${path}`, { headers: { authorization: `Bearer ${bearer}` } });
      if (!res.ok) throw new Error(`${path}: ${res.status} ${await res.text()}`);
      return (await res.json()) as T;
    };
    type Page = { items: Array<{ id: string }>; next_cursor?: string };
    // A cursor in the middle of the list: the one after the item there.
    const middleId = `c${String(Math.floor(ENTRIES / PER_CONVERSATION / 2)).padStart(9, "0")}`;
    const rows = await server.store.read((r) => r.conversations.get(key, middleId));
    const cursor = Buffer.from(JSON.stringify([rows!.started_at, rows!.id])).toString("base64url");
    const first = await get<Page>("/side-control/conversations");
    if (first.items.length !== 20) throw new Error("the first page is not full");
    // Round-robin, so that whatever else the machine does weighs on each alike.
    const figures = await sideBySide(READS, {
      first_page_ms: async () => void (await get<Page>("/side-control/conversations")),
      deep_page_ms: async () => void (await get<Page>(`/side-control/conversations?limit=100&cursor=${cursor}`)),
      one_conversation_ms: async () => void (await get(`/side-control/conversations/${middleId}`)),
      // The same bearer's cheapest Side Control read: what HTTP, the session and the machine's load add to each.
      baseline_status_ms: async () => void (await get("/side-control/status")),
      // The list's own store reads, without HTTP.
      store_first_page_ms: async () => void (await server.domain.conversations.list(key, undefined)),
      store_deep_page_ms: async () => void (await server.domain.conversations.list(key, cursor, 100)),
    });
    return {
      name: `${store}: reads at ${ENTRIES.toLocaleString("en")} stored entries of one device (${ENTRIES / PER_CONVERSATION} conversations)`,
      fill_s: Math.round(fillS * 10) / 10,
      ...figures,
      goal_p50_ms: 20,
    };
  } finally {
    await server.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

export async function conversationRuns(pgUrl: string | undefined, freshPgDatabase: (url: string) => Promise<string>): Promise<unknown[]> {
  const runs: unknown[] = [];
  const log = (r: unknown) => {
    process.stderr.write(`${JSON.stringify(r)}\n`);
    runs.push(r);
  };
  const only = process.env.BENCH_CONV_ONLY;
  if (only !== "live") {
    log(await reads("sqlite", undefined));
    if (pgUrl) log(await reads("postgres", await freshPgDatabase(pgUrl)));
  }
  if (pgUrl && only !== "reads") log(await livePath(await freshPgDatabase(pgUrl)));
  return runs;
}
