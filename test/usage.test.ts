import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import OpenAI from "openai";
import { type ConfigInput, loadConfig } from "../src/config/config.ts";
import { PerchApiError } from "../src/sdk/client.ts";
import { assertFails, perch, perchJson } from "./support/cli.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { STORES, startTestServer, type TestServer, tempDir } from "./support/server.ts";

const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");
const KEYS = { app: "sk-usage-app", capped: "sk-usage-capped", race: "sk-usage-race", free: "sk-usage-free" };
const CAP = 3;
const RACE_CAP = 20;

const config = (upstream: FakeUpstream, quiet: FakeUpstream, database_url: string | undefined) => ({
  ...(database_url ? { database_url } : {}),
  providers: [
    { id: "up", kind: "openai-compatible" as const, base_url: upstream.url, max_retries: 0 },
    { id: "quiet", kind: "openai-compatible" as const, base_url: quiet.url, max_retries: 0 },
  ],
  models: [
    { id: "chat", kind: "chat" as const, provider: "up", upstream_model: "m" },
    { id: "quiet-chat", kind: "chat" as const, provider: "quiet", upstream_model: "q" },
  ],
  api_keys: [
    { name: "app", sha256: sha256(KEYS.app) },
    { name: "capped", sha256: sha256(KEYS.capped), limits: [{ per: "day" as const, requests: CAP }] },
    { name: "race", sha256: sha256(KEYS.race), limits: [{ per: "day" as const, requests: RACE_CAP }] },
    { name: "free", sha256: sha256(KEYS.free) },
  ],
  usage: { limits: [{ scope: "device" as const, per: "day" as const, tokens: 1_000_000 }] },
});

/** The store's rows of a principal, written first (what a node holds goes out within a second anyway). */
async function stored(server: TestServer, o: { key?: string; apiKeyId?: string }) {
  const rows = await server.domain.usage.report({ ...o, days: 1 });
  const sum = { requests: 0, input_tokens: 0, output_tokens: 0, estimated: 0, speech_chars: 0, audio_ms: 0 };
  for (const r of rows) {
    sum.requests += r.requests;
    sum.input_tokens += r.input_tokens;
    sum.output_tokens += r.output_tokens;
    sum.speech_chars += r.speech_chars;
    sum.audio_ms += r.audio_ms;
    sum.estimated = Math.max(sum.estimated, r.estimated);
  }
  return sum;
}

for (const store of STORES) {
  describe(`usage and limits on the Compatible API (${store.name})`, () => {
    let server: TestServer;
    let upstream: FakeUpstream;
    let quiet: FakeUpstream;
    const client = (apiKey: string) => new OpenAI({ apiKey, baseURL: `${server.url}/openai/v1`, maxRetries: 0 });

    before(async () => {
      upstream = await startFakeUpstream();
      quiet = await startFakeUpstream();
      quiet.reportsUsage = false;
      server = await startTestServer({ config: config(upstream, quiet, await store.url()) });
    });

    after(async () => {
      await server?.stop();
      await upstream?.close();
      await quiet?.close();
    });

    test("tokens as the provider reports them, a request each, in the store", async () => {
      const app = client(KEYS.app);
      await app.chat.completions.create({ model: "chat", messages: [{ role: "user", content: "hi" }] });
      const stream = await app.chat.completions.create({ model: "chat", messages: [{ role: "user", content: "hi" }], stream: true });
      for await (const _ of stream) {
        // read to the end
      }
      const s = await stored(server, { apiKeyId: "app" });
      // The completion and the stream's usage chunk (asked for by Perch) each report 7 + 3.
      assert.deepEqual([s.requests, s.input_tokens, s.output_tokens, s.estimated], [2, 14, 6, 0]);
    });

    test("a streaming upstream is asked for its usage, and the client's stream stays as it asked", async () => {
      const app = client(KEYS.app);
      const before = upstream.received.length;
      const res = await fetch(`${server.url}/openai/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${KEYS.app}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "chat", messages: [{ role: "user", content: "hi" }], stream: true }),
      });
      const text = await res.text();
      assert.equal(upstream.received[before]?.body.stream_options?.include_usage, true);
      assert.ok(!text.includes('"usage"'), text);
      assert.ok(text.includes("Hello from m") && text.trimEnd().endsWith("data: [DONE]"), text);
      // A client that asks gets the usage chunk, and `usage: null` before it.
      const asked = await app.chat.completions.create({
        model: "chat",
        messages: [{ role: "user", content: "hi" }],
        stream: true,
        stream_options: { include_usage: true },
      });
      const usages: unknown[] = [];
      for await (const chunk of asked) usages.push(chunk.usage);
      assert.deepEqual(usages.at(-1), { prompt_tokens: 7, completion_tokens: 3, total_tokens: 10 });
      assert.ok(usages.slice(0, -1).every((u) => u === null));
    });

    test("a provider that reports no usage: tokens estimated from the text and flagged", async () => {
      const free = client(KEYS.free);
      await free.chat.completions.create({ model: "quiet-chat", messages: [{ role: "user", content: "twelve chars" }] });
      const stream = await free.chat.completions.create({ model: "quiet-chat", messages: [{ role: "user", content: "twelve chars" }], stream: true });
      for await (const _ of stream) {
        // read to the end
      }
      const s = await stored(server, { apiKeyId: "free" });
      // "twelve chars" is 12 characters (3 tokens), "Hello from q" 12 (3 tokens), twice.
      assert.deepEqual([s.requests, s.input_tokens, s.output_tokens, s.estimated], [2, 6, 6, 1]);
    });

    test("a key at its limit gets 429 insufficient_quota with Retry-After, and nothing more is counted", async () => {
      const capped = client(KEYS.capped);
      for (let i = 0; i < CAP; i++) await capped.chat.completions.create({ model: "chat", messages: [{ role: "user", content: "hi" }] });
      const calls = upstream.received.length;
      const res = await fetch(`${server.url}/openai/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${KEYS.capped}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "chat", messages: [{ role: "user", content: "hi" }] }),
      });
      assert.equal(res.status, 429);
      const body = (await res.json()) as { error: { type: string; code: string; message: string } };
      assert.equal(body.error.type, "insufficient_quota");
      assert.equal(body.error.code, "insufficient_quota");
      assert.match(body.error.message, /daily requests limit \(3\).*resets at \d{4}-\d\d-\d\dT00:00:00/);
      const retryAfter = Number(res.headers.get("retry-after"));
      const toMidnight = (Date.UTC(new Date().getUTCFullYear(), new Date().getUTCMonth(), new Date().getUTCDate() + 1) - Date.now()) / 1000;
      assert.ok(Math.abs(retryAfter - toMidnight) < 5, `${retryAfter} vs ${toMidnight}`);
      assert.equal(upstream.received.length, calls, "no model call");
      // The SDK sees OpenAI's own quota error.
      await assert.rejects(
        capped.chat.completions.create({ model: "chat", messages: [{ role: "user", content: "hi" }] }),
        (e: unknown) => e instanceof OpenAI.RateLimitError && (e.error as { code?: string }).code === "insufficient_quota",
      );
      assert.equal((await stored(server, { apiKeyId: "capped" })).requests, CAP);
      const metrics = await (await fetch(`${server.url}/metrics`)).text();
      assert.match(metrics, /perch_usage_limited_total\{scope="api_key",counter="requests"\} [1-9]/);
      assert.match(metrics, /perch_usage_total\{counter="input_tokens",agent="chat"\} [1-9]/);
      assert.ok(!metrics.includes("capped"), "no label per key");
    });

    test("a device: its use in GET /me/usage and /side-control/usage, its own limits refuse it", async () => {
      const device = server.client();
      await device.login();
      const chat = client(device.accessToken!);
      await chat.chat.completions.create({ model: "chat", messages: [{ role: "user", content: "hi" }] });
      let view = await device.usage();
      assert.equal(view.day.used.requests, 1);
      assert.equal(view.day.used.input_tokens, 7);
      assert.equal(view.month.used.output_tokens, 3);
      assert.deepEqual(view.day.limits, { tokens: 1_000_000 });
      assert.deepEqual(view.month.limits, {});
      assert.equal(view.limited, null);
      const phone = server.client();
      await phone.login({ deviceToken: (await device.createDeviceToken()).token });
      assert.deepEqual((await phone.sideControl.usage()).day.used, view.day.used);
      // The operator's own limits for this device replace the configured ones.
      await server.domain.usage.setDeviceLimits(device.publicKey, [{ per: "day", tokens: 10 }]);
      await assert.rejects(chat.chat.completions.create({ model: "chat", messages: [{ role: "user", content: "hi" }] }), OpenAI.RateLimitError);
      view = await device.usage();
      assert.deepEqual(view.day.limits, { tokens: 10 });
      assert.equal(view.limited, "tokens");
      await server.domain.usage.setDeviceLimits(device.publicKey, null);
      await chat.chat.completions.create({ model: "chat", messages: [{ role: "user", content: "hi" }] });
      // Removed with the device's registration (what a node had not written yet too).
      await server.domain.usage.meter.flush();
      await chat.chat.completions.create({ model: "chat", messages: [{ role: "user", content: "hi" }] });
      await server.domain.peers.remove(device.publicKey);
      await server.domain.usage.meter.flush();
      assert.equal((await stored(server, { key: device.publicKey })).requests, 0);
    });

    test("embedded engines are counted like providers: tts-1's characters and request", async () => {
      const speech = await client(KEYS.free).audio.speech.create({ model: "tts-1", voice: "alloy", input: "Hello there.", response_format: "wav" });
      assert.ok((await speech.arrayBuffer()).byteLength > 1000);
      const [row] = (await server.domain.usage.report({ apiKeyId: "free", days: 1 })).filter((r) => r.agent === "tts-1");
      assert.deepEqual([row?.requests, row?.speech_chars], [1, "Hello there.".length]);
    });

    test("the Public API documents the usage routes", async () => {
      const doc = (await (await fetch(`${server.url}/openapi.json`)).json()) as { paths: Record<string, unknown> };
      assert.ok(doc.paths["/me/usage"] && doc.paths["/side-control/usage"]);
      const device = server.client();
      await device.login();
      await assert.rejects(
        fetch(`${server.url}/side-control/usage`, { headers: { authorization: `Bearer ${device.accessToken}` } }).then(async (r) => {
          if (!r.ok) throw new PerchApiError(r.status, ((await r.json()) as { error: { code: string } }).error.code, "");
        }),
        (e: unknown) => e instanceof PerchApiError && e.status === 403,
      );
    });
  });

  describe(`racing at a request limit: two nodes, 64 clients (${store.name})`, () => {
    let nodes: TestServer[];
    let upstream: FakeUpstream;
    let quiet: FakeUpstream;

    before(async () => {
      upstream = await startFakeUpstream();
      quiet = await startFakeUpstream();
      upstream.defaultReply = () => ({ content: "ok", delayMs: 5 });
      const url = await store.url();
      const dataDir = tempDir();
      nodes = [];
      for (const name of ["a", "b"]) nodes.push(await startTestServer({ dataDir, config: { ...config(upstream, quiet, url), node_name: `usage-${name}` } }));
    });

    after(async () => {
      for (const n of nodes ?? []) await n.stop();
      await upstream?.close();
      await quiet?.close();
    });

    test("answered ≤ N + nodes, and the store counts exactly the answered", async () => {
      let answered = 0;
      let refused = 0;
      await Promise.all(
        Array.from({ length: 64 }, async (_, i) => {
          const c = new OpenAI({ apiKey: KEYS.race, baseURL: `${nodes[i % 2]!.url}/openai/v1`, maxRetries: 0 });
          for (let j = 0; j < 2; j++) {
            try {
              await c.chat.completions.create({ model: "chat", messages: [{ role: "user", content: "go" }] });
              answered++;
            } catch (e) {
              assert.ok(e instanceof OpenAI.RateLimitError, String(e));
              refused++;
            }
          }
        }),
      );
      assert.equal(answered + refused, 128);
      assert.ok(answered <= RACE_CAP + nodes.length, `answered ${answered}`);
      assert.ok(answered >= RACE_CAP, `answered ${answered}`);
      // Both nodes give back what they claimed and did not use.
      for (const n of nodes) await n.domain.usage.meter.flush("all");
      assert.equal((await stored(nodes[0]!, { apiKeyId: "race" })).requests, answered);
    });
  });
}

describe("usage: bad configuration, and the command line", () => {
  test("a limit with an unknown scope, counter or period, a bad value or an unknown agent refuses the configuration, naming the path", () => {
    const bad: Array<[unknown, RegExp]> = [
      [{ limits: [{ scope: "room", per: "day", requests: 1 }] }, /usage\.limits\.0\.scope/],
      [{ limits: [{ scope: "device", per: "week", requests: 1 }] }, /usage\.limits\.0\.per/],
      [{ limits: [{ scope: "device", per: "day", naps: 1 }] }, /usage\.limits\.0.*naps/],
      [{ limits: [{ scope: "device", per: "day", tokens: -1 }] }, /usage\.limits\.0\.tokens/],
      [{ limits: [{ scope: "device", per: "day", tokens: 1.5 }] }, /usage\.limits\.0\.tokens/],
      [{ limits: [{ scope: "device", per: "day" }] }, /usage\.limits\.0.*at least one of/],
      [{ limits: [{ scope: "device", per: "day", agent: "nobody", requests: 1 }] }, /usage\.limits\.0\.agent: unknown agent or model nobody/],
      [{ count: false, limits: [{ scope: "device", per: "day", requests: 1 }] }, /usage\.limits: limits need usage counted/],
    ];
    for (const [usage, message] of bad) assert.throws(() => loadConfig({}, { usage } as ConfigInput), message, JSON.stringify(usage));
    assert.throws(
      () =>
        loadConfig({}, { api_keys: [{ name: "k", sha256: sha256("k"), limits: [{ scope: "api_key", per: "day", requests: 1 }] }] } as unknown as ConfigInput),
      /api_keys\.0\.limits\.0.*scope/,
    );
    assert.throws(
      () => loadConfig({}, { api_keys: [{ name: "k", sha256: sha256("k"), limits: [{ per: "day", agent: "ghost", tokens: 5 }] }] } as ConfigInput),
      /api_keys\.0\.limits\.0\.agent/,
    );
    // tts-1 is a model of the catalog: a limit may name it.
    loadConfig({}, { usage: { limits: [{ scope: "all_devices", per: "month", agent: "tts-1", speech_chars: 0 }] } });
  });

  test("perch usage and perch peers limits, against the store a server counted in", async () => {
    const upstream = await startFakeUpstream();
    const quiet = await startFakeUpstream();
    const dir = tempDir();
    const file = join(dir, "perch.json");
    const cfg = config(upstream, quiet, undefined);
    writeFileSync(file, JSON.stringify({ ...cfg, data_dir: dir }));
    const server = await startTestServer({ dataDir: dir, config: cfg });
    try {
      const device = server.client();
      await device.login();
      const chat = new OpenAI({ apiKey: device.accessToken!, baseURL: `${server.url}/openai/v1`, maxRetries: 0 });
      await chat.chat.completions.create({ model: "chat", messages: [{ role: "user", content: "hi" }] });
      await new OpenAI({ apiKey: KEYS.app, baseURL: `${server.url}/openai/v1`, maxRetries: 0 }).chat.completions.create({
        model: "chat",
        messages: [{ role: "user", content: "hi" }],
      });
      await server.domain.usage.meter.flush();
      const env = { PERCH_CONFIG: file };
      const all = await perchJson<Array<Record<string, unknown>>>(["usage", "--json"], env);
      assert.deepEqual(
        all.map((r) => [r.device ?? r.api_key_id, r.agent, r.requests, r.input_tokens, r.output_tokens]).sort(),
        [
          [device.publicKey, "chat", 1, 7, 3],
          ["app", "chat", 1, 7, 3],
        ].sort(),
      );
      const mine = await perchJson<Array<Record<string, unknown>>>(["usage", "--key", device.publicKey, "--days", "2", "--json"], env);
      assert.equal(mine.length, 1);
      const text = await perch(["usage", "--api-key-id", "app"], env);
      assert.match(text.stdout, /api key app\s+chat\s+1\s+7\s+3/);
      assertFails(await perch(["usage", "--api-key-id", "nobody"], env), /no API key nobody/);
      assertFails(await perch(["usage", "--key", server.client().publicKey], env), /no registered peer/);
      assertFails(await perch(["usage", "--days", "0"], env), /--days/);
      // Past what a date can say: refused by name, not a RangeError's stack.
      assertFails(await perch(["usage", "--days", "9999999999"], env), /--days takes a whole number of days from 1 to 100000/);
      // The operator's own limits for the device: set, refused at once by the server, cleared.
      const set = await perchJson<{ limits: unknown }>(["peers", "limits", device.publicKey, "--tokens-per-day", "5", "--requests-per-month", "100"], env);
      assert.deepEqual(set.limits, [
        { per: "day", tokens: 5 },
        { per: "month", requests: 100 },
      ]);
      await eventuallyRefused(chat);
      const shown = await perchJson<{ limits: unknown; usage: { limited: string } }>(["peers", "limits", device.publicKey], env);
      assert.equal(shown.usage.limited, "tokens");
      assertFails(await perch(["peers", "limits", server.client().publicKey, "--tokens-per-day", "1"], env), /no registered peer/);
      assertFails(await perch(["peers", "limits", device.publicKey, "--tokens-per-day", "-1"], env), /whole number/);
      // A number past 2^53 would be stored, then read back as no limits at all: refused.
      assertFails(await perch(["peers", "limits", device.publicKey, "--tokens-per-day", "99999999999999999999"], env), /whole number/);
      await perchJson(["peers", "limits", device.publicKey, "--clear"], env);
      await eventuallyAnswered(chat);
    } finally {
      await server.stop();
      await upstream.close();
      await quiet.close();
    }
  });
});

/** The server reads a device's own limits again within a second. */
async function eventuallyRefused(chat: OpenAI): Promise<void> {
  for (let i = 0; ; i++) {
    try {
      await chat.chat.completions.create({ model: "chat", messages: [{ role: "user", content: "hi" }] });
    } catch (e) {
      assert.ok(e instanceof OpenAI.RateLimitError, String(e));
      return;
    }
    assert.ok(i < 30, "refused within a second or so");
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function eventuallyAnswered(chat: OpenAI): Promise<void> {
  for (let i = 0; ; i++) {
    try {
      await chat.chat.completions.create({ model: "chat", messages: [{ role: "user", content: "hi" }] });
      return;
    } catch (e) {
      assert.ok(e instanceof OpenAI.RateLimitError, String(e));
      assert.ok(i < 30, "answered again within a second or so");
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}
