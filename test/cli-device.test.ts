import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { networkInterfaces } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { encodeKey, generateKeyPair } from "../src/crypto/keys.ts";
import type { DeviceToken, PeerSelf, PeerStatus } from "../src/protocol/public.ts";
import { assertFails, perch, perchJson } from "./support/cli.ts";
import { startTestServer, type TestServer, tempDir } from "./support/server.ts";

describe("perch device: the SDK from the command line", () => {
  let server: TestServer;
  let keyFile: string;
  let publicKey: string;
  let args: string[];
  before(async () => {
    server = await startTestServer();
    const pair = generateKeyPair();
    publicKey = encodeKey(pair.publicKey);
    keyFile = join(tempDir(), "device.json");
    writeFileSync(keyFile, JSON.stringify({ public_key: publicKey, private_key: encodeKey(pair.privateKey) }));
    args = ["device", "--server", server.url, "--key-file", keyFile];
  });
  after(() => server.stop());

  test("me, status, token and sessions act as the device", async () => {
    const me = await perchJson<PeerSelf>([...args, "me"], {});
    assert.equal(me.public_key, publicKey);

    const stored = await perchJson<PeerStatus>([...args, "status", "--set", '{"volume":12,"muted":true}'], {});
    assert.equal(stored.volume, 12);
    assert.deepEqual(await server.domain.peers.status(publicKey), stored);
    assert.deepEqual(await perchJson<PeerStatus>([...args, "status"], {}), stored);

    const issued = await perch([...args, "token"], {});
    assert.equal(issued.code, 0, issued.stderr);
    const token = JSON.parse(issued.stdout) as DeviceToken & { link: string; link_from: string };
    // The server listens on all addresses: the link is on this machine's LAN address when it has one (issue 39).
    const lan = Object.values(networkInterfaces())
      .flat()
      .find((a) => a?.family === "IPv4" && !a.internal)?.address;
    assert.equal(token.link_from, lan ? "lan_address" : "server");
    assert.equal(token.link, `${lan ? server.url.replace("127.0.0.1", lan) : server.url}/app/#token=${token.token}`);
    // The link as a QR code in the terminal (half-block characters), and in words.
    assert.match(issued.stderr, /[▀▄█]{10,}/);
    assert.ok(issued.stderr.includes(`Open on the phone (valid 5 minutes, once): ${token.link}`));
    const quiet = await perch([...args, "token", "--no-qr", "--app-url", "https://phone.example/app/"], {});
    assert.equal(quiet.stderr, "");
    assert.match((JSON.parse(quiet.stdout) as { link: string }).link, /^https:\/\/phone\.example\/app\/#token=[A-Za-z0-9_-]{43}$/);
    const phone = server.client();
    await phone.login({ deviceToken: token.token });
    assert.equal((await phone.sideControl.status()).volume, 12);
    const sessions = await perchJson<{ items: Array<{ controller_public_key: string }> }>([...args, "sessions"], {});
    assert.deepEqual(
      sessions.items.map((s) => s.controller_public_key),
      [phone.publicKey],
    );
  });

  test("server errors, bad input and an unreachable server exit 1 with a message", async () => {
    assertFails(await perch([...args, "status", "--set", '{"volume":101}'], {}), /400 INVALID_STATUS/);
    assertFails(await perch([...args, "status", "--set", "not json"], {}), /--set must be a JSON document/);
    assertFails(await perch(["device", "--server", server.url, "--key-file", join(tempDir(), "missing.json"), "me"], {}), /cannot read a key pair/);
    assertFails(await perch(["device", "--server", "http://127.0.0.1:1", "--key-file", keyFile, "me"], {}), /cannot reach/);
    assert.equal((await server.domain.peers.status(publicKey)).volume, 12, "nothing changed");
  });
});
