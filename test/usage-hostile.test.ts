import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, before, describe, test } from "node:test";
import OpenAI from "openai";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { STORES, startTestNode, type TestNode } from "./support/server.ts";

const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");
const KEY = "sk-usage-hostile";

for (const store of STORES) {
  describe(`usage: a provider's malformed usage (${store.name})`, () => {
    let server: TestNode;
    let upstream: FakeUpstream;

    before(async () => {
      upstream = await startFakeUpstream();
      const database_url = await store.url();
      server = await startTestNode({
        config: {
          ...(database_url ? { database_url } : {}),
          providers: [{ id: "up", kind: "openai-compatible" as const, base_url: upstream.url, max_retries: 0 }],
          models: [{ id: "chat", kind: "chat" as const, provider: "up", upstream_model: "m" }],
          api_keys: [{ name: "hostile", sha256: sha256(KEY) }],
          usage: { limits: [{ scope: "device" as const, per: "day" as const, requests: 1000 }] },
        },
      });
    });

    after(async () => {
      await server?.stop();
      await upstream?.close();
    });

    test("never fails the request, and what reaches the store are whole, non-negative counts (the next counts too)", async () => {
      const chat = new OpenAI({ apiKey: KEY, baseURL: `${server.url}/openai/v1`, maxRetries: 0, fetch: server.fetch });
      const hostile: unknown[] = [
        { prompt_tokens: "abc", completion_tokens: 1.5, total_tokens: 1 },
        { prompt_tokens: -5, completion_tokens: 1e300, total_tokens: 1 },
        { prompt_tokens: 1e30, completion_tokens: Number.NaN, total_tokens: 1 },
      ];
      for (const usage of hostile) {
        upstream.reply({ content: "x", usage } as never);
        const r = await chat.chat.completions.create({ model: "chat", messages: [{ role: "user", content: "hi" }] });
        assert.equal(r.choices[0]?.message.content, "x");
      }
      // An honest provider's counts after them reach the store.
      await chat.chat.completions.create({ model: "chat", messages: [{ role: "user", content: "hi" }] });
      await server.domain.usage.meter.flush();
      assert.deepEqual(server.domain.usage.meter.unwritten("api_key:hostile", "2000-01-01"), [], "everything written");
      const rows = await server.domain.usage.report({ apiKeyId: "hostile", days: 1 });
      assert.equal(rows.length, 1);
      const row = rows[0]!;
      assert.equal(row.requests, 4);
      for (const f of ["input_tokens", "output_tokens"] as const) {
        assert.ok(Number.isSafeInteger(Number(row[f])) && Number(row[f]) >= 0, `${f}: ${row[f]}`);
      }
      // 7 + 3 of the honest call are in; the 1.5 rounded to 2, the rest dropped or capped.
      assert.ok(Number(row.output_tokens) >= 5, String(row.output_tokens));
      const metrics = await (await server.fetch(`${server.url}/metrics`)).text();
      assert.match(metrics, /perch_usage_total\{counter="input_tokens",agent="chat"\} \d+\n/);
    });

    test("request units the node claimed ahead are not handed out past a limit lowered meanwhile (the operator's 0 means none)", async () => {
      const ask = (chat: OpenAI) => chat.chat.completions.create({ model: "chat", messages: [{ role: "user", content: "hi" }] });
      const device = server.client();
      await device.login();
      const chat = new OpenAI({ apiKey: device.accessToken!, baseURL: `${server.url}/openai/v1`, maxRetries: 0, fetch: server.fetch });
      // The first request claims a few units ahead under the limit of 1,000.
      await ask(chat);
      // Lowered as `perch peers limits` does from another process: in the store, read again by the node within a second.
      await server.store.transaction((tx) => tx.usage.setDeviceLimits(device.publicKey, JSON.stringify([{ per: "day", requests: 2 }])));
      await new Promise((resolve) => setTimeout(resolve, 1_100));
      await ask(chat);
      await assert.rejects(ask(chat), OpenAI.RateLimitError);
      await server.domain.usage.meter.flush(true);
      assert.equal(
        (await server.domain.usage.report({ key: device.publicKey, days: 1 })).reduce((n, r) => n + r.requests, 0),
        2,
      );
      // Lowered through this node: at once.
      const other = server.client();
      await other.login();
      const otherChat = new OpenAI({ apiKey: other.accessToken!, baseURL: `${server.url}/openai/v1`, maxRetries: 0, fetch: server.fetch });
      await ask(otherChat);
      await server.domain.usage.setDeviceLimits(other.publicKey, [{ per: "day", requests: 0 }]);
      await assert.rejects(ask(otherChat), OpenAI.RateLimitError);
    });
  });
}
