/**
 * The client address behind trusted proxies, and rate limits that hold across window boundaries
 * with bounded memory.
 */
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { ManualClock } from "../src/domain/clock.ts";
import { RateLimiter } from "../src/domain/rate-limiter.ts";
import type { PerchClient } from "../src/sdk/client.ts";
import { assertFails, perch } from "./support/cli.ts";
import { startTestServer, type TestServer, tempDir } from "./support/server.ts";

const NO_LIMITS = { login_per_key: 0, login_per_address: 0, device_token_per_device: 0 };

/** A fresh login of `client` through a proxy that sent `forwarded` as X-Forwarded-For (the test process is the proxy, on loopback). */
async function loginVia(server: TestServer, client: PerchClient, forwarded: string | undefined): Promise<number> {
  const res = await fetch(`${server.url}/login`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${await client.assertion()}`,
      "x-public-key": client.publicKey,
      ...(forwarded === undefined ? {} : { "x-forwarded-for": forwarded }),
    },
  });
  await res.arrayBuffer();
  return res.status;
}

describe("client address behind proxies", () => {
  test("behind a trusted loopback proxy, entries the client writes cannot choose its address or lock out a victim", async () => {
    const server = await startTestServer({ config: { trust_proxy: "loopback", rate_limits: { ...NO_LIMITS, login_per_address: 3 } } });
    try {
      // The attacker is 203.0.113.7; the proxy appends that to whatever the attacker wrote.
      const statuses: number[] = [];
      for (let i = 0; i < 8; i++) statuses.push(await loginVia(server, server.client(), `10.${i}.0.1, 198.51.100.${i}, 203.0.113.7`));
      assert.deepEqual(statuses, [200, 200, 200, 429, 429, 429, 429, 429], "spoofed entries do not escape the per-address limit");
      // Naming the victim does not spend the victim's allowance.
      for (let i = 0; i < 5; i++) assert.equal(await loginVia(server, server.client(), "192.0.2.50, 203.0.113.7"), 429);
      assert.equal(await loginVia(server, server.client(), "192.0.2.50"), 200, "the victim logs in");
      // Trusted hops are skipped: 10.0.0.9 is not trusted, so it is the client behind the loopback proxy.
      assert.equal(await loginVia(server, server.client(), "203.0.113.7, 10.0.0.9"), 200);
    } finally {
      await server.stop();
    }
  });

  test("with no trusted proxy (the default) X-Forwarded-For is ignored", async () => {
    const server = await startTestServer({ config: { rate_limits: { ...NO_LIMITS, login_per_address: 2 } } });
    try {
      assert.equal(await loginVia(server, server.client(), "192.0.2.1"), 200);
      assert.equal(await loginVia(server, server.client(), "192.0.2.2"), 200);
      assert.equal(await loginVia(server, server.client(), "192.0.2.3"), 429, "all three are 127.0.0.1");
    } finally {
      await server.stop();
    }
  });

  test("a boolean trustProxy is refused at start-up with the new form; so is a value proxy-addr cannot read", async () => {
    const dataDir = tempDir();
    const file = join(dataDir, "perch.json");
    writeFileSync(file, JSON.stringify({ trustProxy: true }));
    // Six processes refused at start-up, at once (each is mostly a process starting).
    const serve = (env: Record<string, string>) => perch(["serve"], { PERCH_DATA_DIR: dataDir, PERCH_PORT: "0", PERCH_CONFIG: "", ...env });
    const [booleans, fromFile, bad] = await Promise.all([
      Promise.all(["true", "1", "false", "0"].map((value) => serve({ PERCH_TRUST_PROXY: value }))),
      serve({ PERCH_CONFIG: file }),
      serve({ PERCH_TRUST_PROXY: "loopback,not-an-address" }),
    ]);
    for (const r of booleans) assertFails(r, /trust_proxy.*PERCH_TRUST_PROXY=loopback/);
    assertFails(fromFile, /trust_proxy.*loopback/);
    assertFails(bad, /trust_proxy.*not-an-address/);
  });
});

describe("rate limits (GCRA)", () => {
  test("60 logins of one key cannot be made in one second across a minute boundary", async () => {
    const minute = Math.floor(Date.now() / 60_000) * 60_000;
    const clock = new ManualClock(minute + 59_500);
    const server = await startTestServer({ clock, config: { rate_limits: { ...NO_LIMITS, login_per_key: 30 } } });
    try {
      const k = server.client();
      let accepted = 0;
      for (let i = 0; i < 60; i++) {
        if (i === 30) clock.set(minute + 60_400); // past the boundary, 0.9 s later
        if ((await loginVia(server, k, undefined)) === 200) accepted++;
      }
      assert.equal(accepted, 30, "the burst is the limit; nothing refilled in 0.9 s");
      clock.advance(2_000); // one request's worth (60 s / 30)
      assert.equal(await loginVia(server, k, undefined), 200);
      assert.equal(await loginVia(server, k, undefined), 429);
    } finally {
      await server.stop();
    }
  });

  test("memory stays bounded whatever the number of keys, and a key being limited stays limited", () => {
    const clock = new ManualClock(1_800_000_000_000);
    const limiter = new RateLimiter(5, clock, 1_000);
    for (let i = 0; i < 5; i++) assert.equal(limiter.hit("hot"), 0);
    assert.ok(limiter.hit("hot") > 0);
    for (let i = 0; i < 200_000; i++) {
      limiter.hit(`key-${i}`);
      if (i % 500 === 0) assert.ok(limiter.hit("hot") > 0, "still limited");
      if (i % 20_000 === 0) clock.advance(1); // time barely moves: every entry stays live
    }
    assert.ok(limiter.size <= 1_000, `size ${limiter.size}`);

    const defaults = new RateLimiter(30, clock, 100_000);
    for (let i = 0; i < 200_000; i++) defaults.hit(`key-${i}`);
    assert.equal(defaults.size, 100_000);
  });

  test("a full bucket is the same as no entry: check and hit agree with the limit", () => {
    const clock = new ManualClock(0);
    const limiter = new RateLimiter(3, clock, 10);
    for (let i = 0; i < 3; i++) {
      assert.equal(limiter.check("k"), 0);
      assert.equal(limiter.hit("k"), 0);
    }
    assert.equal(limiter.check("k"), 20, "one request refills every 20 s");
    assert.equal(limiter.hit("k"), 20, "a refused hit counts nothing");
    clock.advance(20_000);
    assert.equal(limiter.hit("k"), 0);
    clock.advance(60_000);
    assert.equal(limiter.check("k"), 0);
    assert.equal(limiter.size, 0, "an entry whose time has passed is dropped");
  });
});
