import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { encodeKey, generateKeyPair } from "../src/crypto/keys.ts";
import { PerchClient } from "../src/sdk/client.ts";
import { engines } from "./support/engines.ts";
import { type FakeRealtime, startFakeRealtime } from "./support/fake-realtime.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { memoryConfig, rewriteOf, scriptMemoryModel } from "./support/memory.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { spoken, voiceDevice } from "./support/voice.ts";
import { eventually } from "./support/webrtc.ts";

type Memory = { enabled: boolean; text: string; updated_at_unix_ms?: number; max_chars: number };
type Message = { role: string; content: unknown };

/**
 * Devices converse over real WebRTC through the SDK with an agent that remembers; the model is a
 * scripted one over HTTP, which writes the memory as "Heard: <each user line>."
 */
describe("memory across a device's conversations (real WebRTC)", () => {
  let upstream: FakeUpstream;
  let server: TestServer;
  const keyPair = generateKeyPair();
  let phone: PerchClient;
  let owner: PerchClient;

  /** The conversation requests (streamed turns) the model got since `from`. */
  const turnRequests = (from: number) =>
    upstream.received
      .slice(from)
      .map((r) => r.body)
      .filter((b) => b.stream && !rewriteOf(b));

  /** One turn of a device: it says `text`, and the reply's turn finishes. */
  async function converse(device: Awaited<ReturnType<typeof voiceDevice>>, text: string, n = 1): Promise<string> {
    const mic = await device.conn.microphone();
    await mic.say(await spoken(text));
    await device.log.wait((s) => s.stream === `out-${n}` && s.label === "turn.metrics", 60_000, `turn ${n}`);
    return device.log.all.find((s) => s.stream === `in-${n}` && s.type === "TEXT_DONE" && s.label === "user.transcript")!.text!;
  }

  before(async () => {
    upstream = await startFakeUpstream();
    scriptMemoryModel(upstream);
    await engines().transcription?.start?.();
    server = await startTestServer({ config: memoryConfig(upstream.url) });
    owner = new PerchClient({ baseUrl: server.url, keyPair });
    await owner.login();
    phone = server.client();
    await phone.login({ deviceToken: (await owner.createDeviceToken()).token });
  });
  after(async () => {
    await server?.stop();
    await upstream?.close();
  });

  test("a name and a hobby said; after the device leaves the phone sees the memory; the next conversation's model gets it as notes; another device's and the Compatible API never", async () => {
    assert.deepEqual(await phone.request<Memory>("GET", "/side-control/memory"), { enabled: true, text: "", max_chars: 2_000 });
    const first = await voiceDevice(server, { keyPair });
    const from = upstream.received.length;
    const heard = await converse(first, "My name is Peter and I love playing football.");
    assert.match(heard, /peter|football/i, `heard: ${heard}`);
    const firstTurn = turnRequests(from)[0]!;
    assert.equal((firstTurn.messages as Message[]).filter((m) => m.role === "system").length, 1, "no memory yet: the agent's instructions only");
    first.conn.close();

    const memory = await eventually(
      async () => {
        const m = await phone.request<Memory>("GET", "/side-control/memory");
        return m.text ? m : undefined;
      },
      30_000,
      "the memory written after the device left",
    );
    assert.equal(memory.text, `Heard: ${heard.trim().replace(/[.!?]*$/, "")}.`, "what the scripted model wrote");
    const rewrite = upstream.received.map((r) => rewriteOf(r.body)).find(Boolean)!;
    assert.deepEqual(rewrite.conversation[0], { user: heard }, "the rewrite read the conversation's transcript");

    // The next conversation: the model gets the memory as notes after the agent's instructions.
    const again = await voiceDevice(server, { keyPair });
    const next = upstream.received.length;
    await converse(again, "What is my name?");
    const [instructions, notes, ...rest] = turnRequests(next)[0]!.messages as Message[];
    assert.deepEqual(instructions, { role: "system", content: "You speak briefly." });
    assert.equal(notes?.role, "system");
    assert.match(String(notes?.content), /What you remember about the people you talk with/);
    assert.ok(String(notes?.content).includes(memory.text), "the memory, in a system message");
    assert.ok(
      rest.every((m) => !String(m.content).includes(memory.text)),
      "not as user text",
    );
    again.conn.close();

    // Another device converses with the same agent: it never gets this device's memory.
    const other = await voiceDevice(server);
    const otherFrom = upstream.received.length;
    await converse(other, "Hello, who am I?");
    for (const body of turnRequests(otherFrom)) {
      const system = (body.messages as Message[]).filter((m) => m.role === "system");
      assert.deepEqual(system, [{ role: "system", content: "You speak briefly." }], "another device's conversation carries no memory");
      assert.ok(!JSON.stringify(body.messages).includes(memory.text));
    }
    other.conn.close();
    assert.notEqual(encodeKey(other.conn.keyPair.publicKey), encodeKey(keyPair.publicKey));

    // The same agent on the Compatible API, called by the same device: never the memory.
    const compatFrom = upstream.received.length;
    const res = await fetch(`${server.url}/openai/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${owner.accessToken}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "talker", messages: [{ role: "user", content: "What is my name?" }] }),
    });
    assert.equal(res.status, 200, await res.clone().text());
    // (The other device's rewrite may come in meanwhile.)
    const compat = upstream.received
      .slice(compatFrom)
      .map((r) => r.body)
      .filter((b) => !rewriteOf(b));
    assert.equal(compat.length, 1);
    assert.deepEqual(
      (compat[0]!.messages as Message[]).filter((m) => m.role === "system"),
      [{ role: "system", content: "You speak briefly." }],
      "no memory on the Compatible API",
    );
  });

  test("an edit from the phone is what the next conversation uses; turned off, nothing is given and nothing written", async () => {
    await phone.request("PUT", "/side-control/memory", { body: { text: "Peter prefers Celsius." } });
    const device = await voiceDevice(server, { keyPair });
    const from = upstream.received.length;
    await converse(device, "What is the temperature?");
    assert.match(String((turnRequests(from)[0]!.messages as Message[])[1]?.content), /Peter prefers Celsius\./);
    device.conn.close();
    await eventually(async () => (await phone.request<Memory>("GET", "/side-control/memory")).text.includes("Heard:") || undefined, 30_000, "the rewrite");
    await server.memory.settled();

    await phone.request("PUT", "/side-control/memory", { body: { enabled: false } });
    const before = await phone.request<Memory>("GET", "/side-control/memory");
    const off = await voiceDevice(server, { keyPair });
    const offFrom = upstream.received.length;
    await converse(off, "Remember that I have a dog.");
    const system = (turnRequests(offFrom)[0]!.messages as Message[]).filter((m) => m.role === "system");
    assert.deepEqual(system, [{ role: "system", content: "You speak briefly." }], "nothing given while off");
    off.conn.close();
    // The rewrite after the close is skipped: nothing written.
    await eventually(
      async () => (await fetch(`${server.url}/metrics`).then((r) => r.text())).includes('perch_memory_rewrites_total{result="skipped"} 1') || undefined,
      30_000,
      "the skipped rewrite",
    );
    assert.deepEqual(await phone.request<Memory>("GET", "/side-control/memory"), before);
  });
});

/** A realtime agent that remembers (voice.md §6): the memory joins the session's instructions; its chat `memory.model` rewrites it. */
describe("memory of a realtime agent (real WebRTC, a fake realtime provider)", () => {
  const KEY = "sk-realtime-memory-test";
  process.env.PERCH_TEST_REALTIME_MEMORY_KEY = KEY;
  let fake: FakeRealtime;
  let upstream: FakeUpstream;
  let server: TestServer;

  before(async () => {
    fake = await startFakeRealtime();
    upstream = await startFakeUpstream();
    scriptMemoryModel(upstream);
    server = await startTestServer({
      engines: engines(),
      config: {
        providers: [
          { id: "rt", kind: "openai-compatible" as const, base_url: fake.url, api_key_env: "PERCH_TEST_REALTIME_MEMORY_KEY", timeout_ms: 3_000 },
          { id: "local", kind: "openai-compatible" as const, base_url: upstream.url, max_retries: 0 },
        ],
        models: [
          { id: "live", kind: "realtime" as const, provider: "rt", upstream_model: "gpt-realtime" },
          { id: "chat", kind: "chat" as const, provider: "local", upstream_model: "scripted" },
        ],
        agents: [{ id: "talker", model: "live", instructions: "Be brief.", voice: "marin", memory: { enabled: true, model: "chat", idle_ms: 1_500 } }],
        voice: { agent: "talker" },
      },
    });
  });
  after(async () => {
    await server?.stop();
    await fake?.close();
    await upstream?.close();
  });

  test("the memory is appended to the session's instructions; after the conversation the chat memory model rewrites it", async () => {
    const owner = server.client();
    await owner.login();
    const phone = server.client();
    await phone.login({ deviceToken: (await owner.createDeviceToken()).token });
    await phone.request("PUT", "/side-control/memory", { body: { text: "Peter prefers Celsius." } });
    const before = fake.sessions.length;
    fake.transcript = "I love playing football.";
    fake.script({ kind: "reply", text: "Football is great.", ms: 600 });
    const { conn, log } = await voiceDevice(server, { keyPair: owner.keyPair });
    const mic = await conn.microphone();
    await fake.until(
      () => fake.sessions.slice(before).some((s) => String(s.session?.instructions ?? "").includes("Peter prefers Celsius.")),
      10_000,
      "the memory in the session's instructions",
    );
    const instructions = String(fake.sessions.slice(before).find((s) => s.session)!.session!.instructions);
    assert.ok(instructions.startsWith("Be brief."), instructions);
    assert.match(instructions, /What you remember about the people you talk with/);
    await mic.say(await spoken("I love playing football."));
    await log.wait((s) => s.stream === "out-1" && s.label === "turn.metrics", 30_000, "the turn");
    conn.close();
    const memory = await eventually(
      async () => {
        const m = await phone.request<Memory>("GET", "/side-control/memory");
        return m.text !== "Peter prefers Celsius." ? m : undefined;
      },
      30_000,
      "the rewrite",
    );
    assert.equal(memory.text, "Peter prefers Celsius. Heard: I love playing football.");
    const rewrite = upstream.received.map((r) => rewriteOf(r.body)).find(Boolean)!;
    assert.equal(upstream.received.find((r) => rewriteOf(r.body))!.body.model, "scripted", "the chat memory model");
    assert.deepEqual(rewrite.conversation, [{ user: "I love playing football." }, { assistant: "Football is great." }]);
  });
  test("after an idle end the next conversation's session has the memory as it is then: forgotten since, it is no longer in the instructions", async () => {
    const owner = server.client();
    await owner.login();
    const phone = server.client();
    await phone.login({ deviceToken: (await owner.createDeviceToken()).token });
    await phone.request("PUT", "/side-control/memory", { body: { text: "Quentin drinks tea." } });
    const before = fake.sessions.length;
    fake.transcript = "I love playing chess.";
    fake.script({ kind: "reply", text: "Chess is great.", ms: 400 }, { kind: "reply", text: "Hello again.", ms: 400 });
    const { conn, log } = await voiceDevice(server, { keyPair: owner.keyPair });
    const mic = await conn.microphone();
    const session = () => fake.sessions.slice(before).find((s) => s.session);
    await fake.until(() => String(session()?.session?.instructions ?? "").includes("Quentin drinks tea."), 10_000, "the memory in the instructions");
    await mic.say(await spoken("I love playing chess."));
    await log.wait((s) => s.stream === "out-1" && s.label === "turn.metrics", 30_000, "the first turn");
    // The conversation ends idle and is rewritten; then the phone forgets.
    await eventually(
      async () => ((await phone.request<Memory>("GET", "/side-control/memory")).text.includes("Heard:") ? true : undefined),
      30_000,
      "the rewrite after the idle end",
    );
    await phone.request("DELETE", "/side-control/memory");
    await mic.say(await spoken("Hello there."));
    await log.wait((s) => s.stream === "out-2" && s.label === "turn.metrics", 30_000, "the next conversation's turn");
    const instructions = String(session()!.session!.instructions);
    assert.equal(instructions, "Be brief.", "forgotten: the next conversation's session has no memory");
    conn.close();
  });
});
