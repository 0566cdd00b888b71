import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { rmSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import { ManualClock } from "../src/domain/clock.ts";
import { DAY_MS } from "../src/domain/context.ts";
import type { ConversationRecorder } from "../src/domain/conversations.ts";
import { PerchApiError, PerchClient } from "../src/sdk/client.ts";
import { perchJson } from "./support/cli.ts";
import { countRows, pairPhone, storedRows } from "./support/conversations.ts";
import { STORES, startTestServer, type TestServer, tempDir } from "./support/server.ts";
import { EventStream } from "./support/sse.ts";
import { eventually } from "./support/webrtc.ts";

function refused(status: number, code: string) {
  return (e: unknown) => {
    assert.ok(e instanceof PerchApiError, String(e));
    assert.equal(`${e.status} ${e.code}`, `${status} ${code}`);
    return true;
  };
}

type Entry = {
  conversation_id: string;
  turn: number;
  role: string;
  text: string;
  at_unix_ms: number;
  interrupted?: boolean;
  tool?: { name: string; is_error: boolean };
};
type List = {
  stored: boolean;
  items: Array<{ id: string; started_at_unix_ms: number; ended_at_unix_ms?: number; turns: number; last_text: string; first_question?: string }>;
  has_next: boolean;
  next_cursor?: string;
};

const API_KEY = "sk-perch-conversations-test";
const sha256 = (text: string) => createHash("sha256").update(text).digest("hex");

const list = (phone: PerchClient, query: Record<string, string | number> = {}) => phone.request<List>("GET", "/side-control/conversations", { query });
const one = (phone: PerchClient, id: string) =>
  phone.request<{ id: string; started_at_unix_ms: number; items: Entry[] }>("GET", `/side-control/conversations/${encodeURIComponent(id)}`);

/** A reply longer than one bus message, with characters JSON escapes and characters of several bytes. */
const LONG = `"Quoted" \\ line\nbreak — ${"ünïcödé 🐦 ".repeat(600)}end.`;

/** A conversation of the device driven through the domain (the voice path is in voice-conversations.test.ts). */
async function converse(server: TestServer, key: string, lines: Array<Parameters<ConversationRecorder["add"]>[0]>): Promise<string> {
  const errors: unknown[] = [];
  const rec = server.domain.conversations.open(key, (err) => errors.push(err));
  for (const l of lines) rec.add(l);
  rec.close();
  await rec.settled();
  assert.deepEqual(errors, []);
  return rec.id;
}

for (const store of STORES) {
  describe(`stored conversations (${store.name})`, () => {
    let server: TestServer;
    let databaseUrl: string | undefined;
    const clock = new ManualClock(Date.UTC(2026, 0, 1));

    before(async () => {
      databaseUrl = await store.url();
      server = await startTestServer({
        clock,
        cleanupIntervalMs: 50,
        config: {
          database_url: databaseUrl,
          voice: { store_transcripts: true, transcript_retention_days: 30 },
          api_keys: [{ name: "ops", sha256: sha256(API_KEY) }],
        },
      });
    });
    after(async () => {
      await server?.stop();
    });

    test("entries go live to the controller in order, whole however long, and are stored as sent", async () => {
      const { phone, key } = await pairPhone(server);
      const stream = await EventStream.must(server.url, phone.accessToken);
      const id = await converse(server, key, [
        { turn: 1, role: "user", text: "What is the weather like?" },
        { turn: 1, role: "tool", text: "sunny, 21 °C", tool: { name: "home.weather", is_error: false } },
        { turn: 1, role: "assistant", text: "It is sunny and", interrupted: true },
        { turn: 2, role: "user", text: "Tell me a long story." },
        { turn: 2, role: "assistant", text: LONG },
      ]);
      const live = await stream.until((s) => s.events("conversation").length >= 5 && s.events("conversation"), "five entries");
      stream.close();
      const entries = live.map((e) => e.data as Entry);
      assert.deepEqual(
        entries.map((e) => [e.conversation_id, e.turn, e.role, e.text, e.interrupted, e.tool?.name]),
        [
          [id, 1, "user", "What is the weather like?", undefined, undefined],
          [id, 1, "tool", "sunny, 21 °C", undefined, "home.weather"],
          [id, 1, "assistant", "It is sunny and", true, undefined],
          [id, 2, "user", "Tell me a long story.", undefined, undefined],
          [id, 2, "assistant", LONG, undefined, undefined],
        ],
      );
      const page = await list(phone);
      assert.equal(page.stored, true);
      assert.deepEqual(
        page.items.map((c) => [c.id, c.turns, c.last_text, c.first_question, c.started_at_unix_ms, c.ended_at_unix_ms]),
        [[id, 2, LONG, "What is the weather like?", clock.now(), clock.now()]],
      );
      const stored = await one(phone, id);
      assert.equal(stored.id, id);
      assert.deepEqual(stored.items, entries, "the stored entries are the live ones");
    });

    test("the list pages newest first with a cursor; bad queries are refused", async () => {
      const { phone, key } = await pairPhone(server);
      const ids: string[] = [];
      for (let i = 0; i < 5; i++) {
        clock.advance(1_000);
        ids.push(await converse(server, key, [{ turn: 1, role: "user", text: `question ${i}` }]));
      }
      // Two conversations starting in the same millisecond are ordered by id.
      ids.push(await converse(server, key, [{ turn: 1, role: "user", text: "question 5" }]));
      const seen: string[] = [];
      let cursor: string | undefined;
      let pages = 0;
      do {
        const page = await list(phone, cursor ? { limit: 2, cursor } : { limit: 2 });
        pages++;
        assert.ok(page.items.length <= 2);
        seen.push(...page.items.map((c) => c.id));
        cursor = page.has_next ? page.next_cursor : undefined;
        if (page.has_next) assert.ok(page.next_cursor);
      } while (cursor);
      assert.equal(pages, 3);
      const last = ids.slice(-2).sort().reverse();
      assert.deepEqual(seen, [...last, ...ids.slice(0, 4).reverse()]);
      assert.equal((await list(phone)).items.length, 6, "limit defaults to 20");

      const bad: Array<Record<string, string | number>> = [
        { limit: 0 },
        { limit: 101 },
        { limit: "ten" },
        { cursor: "not-a-cursor" },
        { cursor: "WzEsMl0" },
        { order: "asc" },
      ];
      for (const query of bad) {
        await assert.rejects(list(phone, query), refused(400, "INVALID_REQUEST"), JSON.stringify(query));
      }
      await assert.rejects(one(phone, "no-such-conversation"), refused(404, "CONVERSATION_NOT_FOUND"));
    });

    test("only the device's controllers reach its conversations: another device's gets 404, a primary session 403", async () => {
      const { device, phone, key } = await pairPhone(server);
      const other = await pairPhone(server);
      const id = await converse(server, key, [{ turn: 1, role: "user", text: "private words" }]);
      await assert.rejects(one(other.phone, id), refused(404, "CONVERSATION_NOT_FOUND"));
      await assert.rejects(other.phone.request("DELETE", `/side-control/conversations/${id}`), refused(404, "CONVERSATION_NOT_FOUND"));
      await other.phone.request("DELETE", "/side-control/conversations");
      assert.deepEqual((await list(other.phone)).items, []);
      await assert.rejects(device.request("GET", "/side-control/conversations"), refused(403, "SIDE_CONTROL_SESSION_REQUIRED"));
      await assert.rejects(device.request("GET", `/side-control/conversations/${id}`, { bearer: null }), refused(401, "INVALID_SESSION"));
      // An operator's API key works on the Compatible API and reaches no conversation.
      const models = await fetch(`${server.url}/openai/v1/models`, { headers: { authorization: `Bearer ${API_KEY}` } });
      assert.equal(models.status, 200, await models.clone().text());
      for (const [method, path] of [
        ["GET", "/side-control/conversations"],
        ["GET", `/side-control/conversations/${id}`],
        ["DELETE", `/side-control/conversations/${id}`],
        ["DELETE", "/side-control/conversations"],
      ] as const) {
        await assert.rejects(device.request(method, path, { bearer: API_KEY }), refused(401, "INVALID_SESSION"), `${method} ${path}`);
      }
      assert.equal((await one(phone, id)).items[0]!.text, "private words", "still there for its own controller");
    });

    test("delete one and delete all remove the rows from the database", async () => {
      const { phone, key } = await pairPhone(server);
      const a = await converse(server, key, [
        { turn: 1, role: "user", text: "one" },
        { turn: 1, role: "assistant", text: "two" },
      ]);
      const b = await converse(server, key, [{ turn: 1, role: "user", text: "three" }]);
      const c = await converse(server, key, [{ turn: 1, role: "user", text: "four" }]);
      assert.deepEqual(await storedRows(server, databaseUrl, key), [3, 4]);
      await phone.request("DELETE", `/side-control/conversations/${a}`);
      await assert.rejects(one(phone, a), refused(404, "CONVERSATION_NOT_FOUND"));
      await assert.rejects(phone.request("DELETE", `/side-control/conversations/${a}`), refused(404, "CONVERSATION_NOT_FOUND"));
      assert.equal(await countRows(server, databaseUrl, "select count(*) as n from conversation_entries where conversation_id = $1", [a]), 0);
      assert.deepEqual(await storedRows(server, databaseUrl, key), [2, 2]);
      await phone.request("DELETE", "/side-control/conversations");
      assert.deepEqual((await list(phone)).items, []);
      assert.equal(await countRows(server, databaseUrl, "select count(*) as n from conversation_entries where conversation_id in ($1, $2)", [b, c]), 0);
      assert.deepEqual(await storedRows(server, databaseUrl, key), [0, 0]);
    });

    test("a conversation still going: what it says after delete all (a reply finishing) or after it is deleted is not written back", async () => {
      const { phone, key } = await pairPhone(server);
      for (const remove of [
        () => phone.request("DELETE", "/side-control/conversations"),
        (id: string) => phone.request("DELETE", `/side-control/conversations/${id}`),
      ]) {
        const errors: unknown[] = [];
        const rec = server.domain.conversations.open(key, (err) => errors.push(err));
        rec.add({ turn: 1, role: "user", text: "tell me a long story" });
        await rec.settled();
        assert.equal((await list(phone)).items.length, 1);
        await remove(rec.id);
        // The reply finishes after the delete, then the conversation goes on.
        rec.add({ turn: 1, role: "assistant", text: "once upon a time", interrupted: true });
        rec.add({ turn: 2, role: "user", text: "and then?" });
        rec.close();
        await rec.settled();
        assert.deepEqual(errors, []);
        assert.deepEqual((await list(phone)).items, []);
        await assert.rejects(one(phone, rec.id), refused(404, "CONVERSATION_NOT_FOUND"));
        assert.deepEqual(await storedRows(server, databaseUrl, key), [0, 0]);
      }
      // A conversation after the delete is stored as ever.
      const next = await converse(server, key, [{ turn: 1, role: "user", text: "a new one" }]);
      assert.deepEqual(
        (await list(phone)).items.map((c) => c.id),
        [next],
      );
    });

    test("delete all racing a conversation's writes: once both are done, nothing of it is stored", async () => {
      const { phone, key } = await pairPhone(server);
      for (let round = 0; round < 5; round++) {
        const rec = server.domain.conversations.open(key, (err) => assert.fail(String(err)));
        rec.add({ turn: 1, role: "user", text: "first" });
        await rec.settled();
        const deleting = server.domain.conversations.deleteAll(key);
        for (let i = 0; i < 20; i++) rec.add({ turn: 1, role: "assistant", text: `piece ${i}` });
        await Promise.all([deleting, rec.settled()]);
        assert.deepEqual((await list(phone)).items, [], `round ${round}`);
      }
    });

    test("a conversation its node left open (the node died) ends at its last entry when the device converses again", async () => {
      const { phone, key } = await pairPhone(server);
      const errors: unknown[] = [];
      const left = server.domain.conversations.open(key, (err) => errors.push(err));
      left.add({ turn: 1, role: "user", text: "are you there?" });
      await left.settled();
      const lastEntryAt = clock.now();
      clock.advance(60_000);
      const other = await pairPhone(server);
      const othersOpen = server.domain.conversations.open(other.key, (err) => errors.push(err));
      othersOpen.add({ turn: 1, role: "user", text: "another device, still talking" });
      await othersOpen.settled();
      assert.equal((await list(phone)).items[0]?.ended_at_unix_ms, undefined, "open while nothing says otherwise");
      clock.advance(60_000);
      const next = await converse(server, key, [{ turn: 1, role: "user", text: "hello again" }]);
      const items = (await list(phone)).items.map((c) => [c.id, c.ended_at_unix_ms]);
      assert.deepEqual(items, [
        [next, clock.now()],
        [left.id, lastEntryAt],
      ]);
      assert.equal((await list(other.phone)).items[0]?.ended_at_unix_ms, undefined, "another device's open conversation stays open");
      assert.deepEqual(errors, []);
    });

    test("they go with the device's registration", async () => {
      const { phone, key } = await pairPhone(server);
      const id = await converse(server, key, [{ turn: 1, role: "user", text: "hello" }]);
      // One deleted before: its deletion's record goes with the device too (not a refusal to remove it).
      const gone = await converse(server, key, [{ turn: 1, role: "user", text: "deleted first" }]);
      await phone.request("DELETE", `/side-control/conversations/${gone}`);
      assert.equal(await countRows(server, databaseUrl, "select count(*) as n from conversation_deletions where public_key = $1", [key]), 1);
      assert.deepEqual(await storedRows(server, databaseUrl, key), [1, 1]);
      assert.equal(await server.domain.peers.remove(key), true);
      assert.equal(await countRows(server, databaseUrl, "select count(*) as n from conversation_deletions where public_key = $1", [key]), 0);
      assert.deepEqual(await storedRows(server, databaseUrl, key), [0, 0]);
      assert.equal(await countRows(server, databaseUrl, "select count(*) as n from conversation_entries where conversation_id = $1", [id]), 0);
    });

    test("perch peers transcripts prints the device's stored conversations; --delete deletes them", async () => {
      const { key } = await pairPhone(server);
      const id = await converse(server, key, [
        { turn: 1, role: "user", text: "Is it raining?" },
        { turn: 1, role: "assistant", text: "No." },
      ]);
      const env = { PERCH_DATA_DIR: server.dataDir, PERCH_VOICE_STORE_TRANSCRIPTS: "true", ...(databaseUrl ? { PERCH_DATABASE_URL: databaseUrl } : {}) };
      const printed = await perchJson<{ stored: boolean; conversations: Array<{ id: string; items: Entry[] }> }>(["peers", "transcripts", key], env);
      assert.equal(printed.stored, true);
      assert.deepEqual(
        printed.conversations.map((c) => [c.id, c.items.map((e) => e.text)]),
        [[id, ["Is it raining?", "No."]]],
      );
      assert.deepEqual(await perchJson(["peers", "transcripts", key, "--delete"], env), { public_key: key, deleted: 1 });
      assert.deepEqual(await storedRows(server, databaseUrl, key), [0, 0]);
    });

    test("the retention job deletes conversations whose last entry is older than transcript_retention_days", async () => {
      const { key } = await pairPhone(server);
      const old = await converse(server, key, [{ turn: 1, role: "user", text: "long ago" }]);
      clock.advance(20 * DAY_MS);
      const recent = await converse(server, key, [{ turn: 1, role: "user", text: "lately" }]);
      clock.advance(10 * DAY_MS + 1);
      const count = (id: string) => countRows(server, databaseUrl, "select count(*) as n from conversations where id = $1", [id]);
      await eventually(async () => ((await count(old)) === 0 ? true : undefined), 10_000, "the old conversation to go");
      assert.equal(await countRows(server, databaseUrl, "select count(*) as n from conversation_entries where conversation_id = $1", [old]), 0);
      assert.equal(await count(recent), 1, "the recent one stays");
      assert.equal(await countRows(server, databaseUrl, "select count(*) as n from conversation_entries where conversation_id = $1", [recent]), 1);
    });
  });

  describe(`conversations while storing is off (${store.name})`, () => {
    let server: TestServer;
    let databaseUrl: string | undefined;

    before(async () => {
      databaseUrl = await store.url();
      server = await startTestServer({ config: { database_url: databaseUrl } });
    });
    after(async () => {
      await server?.stop();
    });

    test("entries still go live; nothing is stored; the list says so", async () => {
      const { phone, key } = await pairPhone(server);
      const stream = await EventStream.must(server.url, phone.accessToken);
      const id = await converse(server, key, [
        { turn: 1, role: "user", text: "Hello there" },
        { turn: 1, role: "assistant", text: "Hi!" },
      ]);
      const live = await stream.until((s) => s.events("conversation").length >= 2 && s.events("conversation"), "two entries");
      stream.close();
      assert.deepEqual(
        live.map((e) => (e.data as Entry).text),
        ["Hello there", "Hi!"],
      );
      assert.deepEqual(await list(phone), { stored: false, items: [], has_next: false });
      await assert.rejects(one(phone, id), refused(404, "CONVERSATION_NOT_FOUND"));
      assert.equal(await countRows(server, databaseUrl, "select count(*) as n from conversations"), 0);
      assert.equal(await countRows(server, databaseUrl, "select count(*) as n from conversation_entries"), 0);
    });

    test("what was stored while storing was on is neither listed nor read once it is off, and can still be deleted", async () => {
      const dataDir = tempDir();
      const on = await startTestServer({ dataDir, config: { database_url: databaseUrl, voice: { store_transcripts: true } } });
      let key: string;
      let id: string;
      let owner: PerchClient;
      try {
        ({ device: owner, key } = await pairPhone(on));
        id = await converse(on, key, [{ turn: 1, role: "user", text: "kept from before" }]);
      } finally {
        await on.close();
      }
      const off = await startTestServer({ dataDir, config: { database_url: databaseUrl } });
      try {
        const phone = off.client();
        const device = new PerchClient({ baseUrl: off.url, keyPair: owner.keyPair });
        await device.login();
        await phone.login({ deviceToken: (await device.createDeviceToken()).token });
        assert.deepEqual(await list(phone), { stored: false, items: [], has_next: false });
        await assert.rejects(one(phone, id), refused(404, "CONVERSATION_NOT_FOUND"));
        assert.deepEqual(await storedRows(off, databaseUrl, key), [1, 1]);
        await phone.request("DELETE", `/side-control/conversations/${id}`);
        assert.deepEqual(await storedRows(off, databaseUrl, key), [0, 0]);
      } finally {
        await off.stop();
        rmSync(dataDir, { recursive: true, force: true });
      }
    });
  });
}
