import assert from "node:assert/strict";
import { rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { PerchConnection } from "../src/sdk/webrtc.ts";
import { type ServerProcess, STORES, spawnServer, tempDir } from "./support/server.ts";
import { UdpRelay } from "./support/udp-relay.ts";
import { connect, eventually } from "./support/webrtc.ts";

/**
 * The attack that used to end the node (issue 11), against `perch serve` in its own process: in
 * rounds, devices open HTTP exchanges on streams 1 and 2 announcing a large body and sending part
 * of it, run speed tests on stream 0, and leave mid-exchange: some close their peer connection at
 * once, some vanish without a word (the way back lost while a download fills the link, before the
 * early answers could leave, then everything). After every round the process is still running and answers a well-behaved device
 * and a TCP client.
 */

const ROUNDS = 3;
const ATTACKERS = 6;

const partialBody = (method: string, path: string, length: number) =>
  Buffer.from(`${method} ${path} HTTP/1.1\r\nHost: perch\r\nContent-Type: application/json\r\nContent-Length: ${length}\r\n\r\n{"volume":`);

interface Attacker {
  conn: PerchConnection;
  relay: UdpRelay | undefined;
}

/** One attacker: its exchanges started, its download under way. */
async function attack(url: string, vanish: boolean): Promise<Attacker> {
  const relay = vanish ? await UdpRelay.start() : undefined;
  const conn = await connect({ url }, relay ? { rtc: relay.rtc() } : {});
  const streams = await Promise.all([conn.openStream(1), conn.openStream(1), conn.openStream(2), conn.openStream(2)]);
  for (const s of streams) s.on("error", () => {});
  void conn.speedTest(4 * 1024 * 1024, 0).catch(() => {});
  void conn.speedTest(0, 256 * 1024).catch(() => {});
  if (relay) {
    // The download fills the link, and then the way back is lost: the early answers stay queued.
    await new Promise((r) => setTimeout(r, 300));
    relay.cut("to-device");
  }
  // Answered at once (over a body limit), then drained by Hono; and read until the request times out.
  streams[0]!.port.send(partialBody("PUT", "/me/status", 40_000_000));
  streams[1]!.port.send(partialBody("PUT", "/me/status", 1_000));
  streams[2]!.port.send(partialBody("POST", "/v1/chat/completions", 40_000_000));
  streams[3]!.port.send(partialBody("POST", "/v1/chat/completions", 100_000));
  return { conn, relay };
}

function leave(a: Attacker): void {
  if (a.relay) {
    // Gone without a word.
    a.relay.cut("both");
    a.conn.close();
  } else {
    a.conn.close();
  }
}

for (const store of STORES) {
  describe(`hostile devices against a server process (${store.name})`, () => {
    let server: ServerProcess;
    let dataDir: string;
    before(async () => {
      dataDir = tempDir();
      const config = join(dataDir, "perch.json");
      writeFileSync(config, JSON.stringify({ rate_limits: { login_per_key: 0, login_per_address: 0, device_token_per_device: 0, offer_per_key: 0 } }));
      const databaseUrl = await store.url();
      server = await spawnServer({
        PERCH_DATA_DIR: dataDir,
        PERCH_CONFIG: config,
        PERCH_LOG_LEVEL: "warn",
        ...(databaseUrl ? { PERCH_DATABASE_URL: databaseUrl } : {}),
      });
    });
    after(async () => {
      const code = await server?.stop();
      rmSync(dataDir, { recursive: true, force: true });
      assert.equal(code, 0, `the server exits cleanly on SIGTERM:\n${server?.output().slice(-3000)}`);
    });

    test("rounds of partial bodies, speed tests and abrupt leaving: the process stays up and keeps serving others", async () => {
      const bystander = await connect(server);
      const attackers: Attacker[] = [];
      try {
        for (let round = 1; round <= ROUNDS; round++) {
          const wave = await Promise.all(Array.from({ length: ATTACKERS }, (_, i) => attack(server.url, i % 2 === 0)));
          attackers.push(...wave);
          // Leave once the server has the exchanges (its early answers are on their way back).
          await new Promise((r) => setTimeout(r, 300));
          for (const a of wave) leave(a);
          // Past the drain wait of Hono's adapter (500 ms), which used to call a missing socket method.
          await new Promise((r) => setTimeout(r, 1_200));
          assert.equal(server.process.exitCode, null, `the server process died in round ${round}:\n${server.output().slice(-3000)}`);
          assert.equal((await bystander.http(1, "GET", "/me")).status, 200, `round ${round}: a well-behaved device is served`);
          assert.ok((await bystander.ping()).serverTime > 0);
          assert.equal((await fetch(`${server.url}/healthz`)).status, 200, `round ${round}: TCP clients are served`);
        }
        // The devices that closed are released; the node holds the bystander and (until liveness notices) the vanished ones.
        const held = async () => Number(/^perch_webrtc_connections (\d+)/m.exec(await (await fetch(`${server.url}/metrics`)).text())?.[1]);
        await eventually(async () => (await held()) <= 1 + (ROUNDS * ATTACKERS) / 2, 10_000, "the closed devices released");
        assert.doesNotMatch(server.output(), /uncaught|destroySoon|TypeError/i);
      } finally {
        bystander.close();
        for (const a of attackers) {
          a.conn.close();
          a.relay?.close();
        }
      }
    });
  });
}
