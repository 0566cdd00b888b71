import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { engines } from "./support/engines.ts";
import { type FakeRealtime, startFakeRealtime } from "./support/fake-realtime.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { spoken, voiceDevice } from "./support/voice.ts";

process.env.PERCH_TEST_REALTIME_KEY = "sk-realtime-usage-0123456789";
const REST = "That is enough for today.";

describe("usage of a realtime agent (voice.md §6, usage.md §3)", () => {
  let fake: FakeRealtime;
  let server: TestServer;

  before(async () => {
    fake = await startFakeRealtime();
    server = await startTestServer({
      engines: engines(),
      config: {
        providers: [{ id: "rt", kind: "openai-compatible", base_url: fake.url, api_key_env: "PERCH_TEST_REALTIME_KEY", timeout_ms: 3_000 }],
        models: [{ id: "live", kind: "realtime", provider: "rt", upstream_model: "gpt-realtime" }],
        agents: [{ id: "talker", model: "live", instructions: "Be brief.", voice: "marin", limited_reply: REST }],
        voice: { agent: "talker" },
        usage: { limits: [{ scope: "device", per: "day", requests: 1 }] },
      },
    });
  });
  after(async () => {
    await server?.stop();
    await fake?.close();
  });

  test("a session's audio both ways and its turn are counted; at the limit the session closes, and the next turn gets the limited reply", async () => {
    fake.transcript = "What is the weather like?";
    fake.script({ kind: "reply", text: "Sunny.", ms: 800 });
    const question = await spoken("What is the weather like?");
    const { conn, log } = await voiceDevice(server);
    const mic = await conn.microphone();
    await fake.until(() => fake.sessions.some((s) => s.session !== undefined), 10_000, "the session");
    const s = fake.sessions.at(-1)!;
    await mic.say(question);
    const first = JSON.parse((await log.wait((e) => e.stream === "out-1" && e.label === "turn.metrics", 30_000, "turn 1")).text!) as Record<string, unknown>;
    assert.equal(first.limited, undefined);
    // The one request of the day is used: the session is closed within a couple of seconds, and none opens again.
    await fake.until(() => s.closed, 5_000, "the session closed at the limit");
    await server.domain.usage.meter.flush();
    const key = conn.publicKey;
    const [row] = (await server.domain.usage.report({ key, days: 1 })).filter((r) => r.agent === "talker");
    assert.equal(row?.requests, 1);
    // Sent: at least the question; received: the reply's 0.8 s.
    assert.ok((row?.audio_ms ?? 0) >= question.length / 48 + 800 - 200, `audio ${row?.audio_ms} ms`);
    const sessions = fake.sessions.length;
    await mic.say(question);
    // The text pipeline answers it (its turns are numbered on their own, as after any change of agent kind).
    const metrics = () => log.all.filter((e) => e.label === "turn.metrics");
    await log.wait(() => metrics().length >= 2, 60_000, "the second turn");
    const second = JSON.parse(metrics()[1]!.text!) as Record<string, unknown>;
    assert.equal(second.limited, "requests");
    assert.equal(log.all.filter((e) => e.type === "TEXT_DONE" && e.label === "assistant.text").at(-1)?.text, REST);
    assert.equal(fake.sessions.length, sessions, "no session opened while limited");
    // The device reads its own usage over service stream 1, as over HTTP.
    const own = await conn.http(1, "GET", "/me/usage");
    assert.equal(own.status, 200);
    const usage = own.json<{ day: { used: { requests: number; audio_seconds: number }; limits: { requests: number } }; limited: string | null }>();
    assert.equal(usage.limited, "requests");
    assert.deepEqual([usage.day.used.requests, usage.day.limits.requests], [1, 1]);
    assert.ok(usage.day.used.audio_seconds > 1);
    const view = await (await fetch(`${server.url}/metrics`)).text();
    assert.match(view, /perch_usage_limited_total\{scope="device",counter="requests"\} [1-9]/);
    await conn.close();
  });
});
