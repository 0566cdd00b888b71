import assert from "node:assert/strict";
import { once } from "node:events";
import { existsSync, writeFileSync } from "node:fs";
import { type AddressInfo, createServer } from "node:net";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { encodeKey, generateKeyPair } from "../src/crypto/keys.ts";
import { assertFails, perch } from "./support/cli.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { startTestServer, type TestServer, tempDir } from "./support/server.ts";
import { talkerConfig } from "./support/voice.ts";

/** A key file as `perch keygen` writes it, and its public key. */
function keyFile(): { file: string; publicKey: string } {
  const pair = generateKeyPair();
  const file = join(tempDir(), "device.json");
  const publicKey = encodeKey(pair.publicKey);
  writeFileSync(file, JSON.stringify({ public_key: publicKey, private_key: encodeKey(pair.privateKey) }));
  return { file, publicKey };
}

/**
 * `perch device` against a voice-capable server: bad flags said before anything is done, a failed
 * turn and a device no agent answers exit 1 with words for it (the latter without waiting the
 * reply's full minute), a refused connection says so, and without `--server` the port comes from
 * the configuration.
 */
// The tests run at once: each is its own command-line process and device key (only one scripts the
// model), and most of their time is a process starting or the 8 s a device no agent answers waits.
describe("perch device: what goes wrong is said, with exit 1", { timeout: 300_000, concurrency: true }, () => {
  let upstream: FakeUpstream;
  let server: TestServer;
  before(async () => {
    upstream = await startFakeUpstream();
    server = await startTestServer({ config: talkerConfig(upstream.url) });
  });
  after(async () => {
    await server?.stop();
    await upstream?.close();
  });

  const connect = (file: string, ...rest: string[]) => ["device", "--server", server.url, "--key-file", file, "connect", "--telemetry-interval", "0", ...rest];

  test("--say with nothing to say, and a --reply-wav that cannot be written, are refused before connecting", async () => {
    const { file, publicKey } = keyFile();
    assertFails(await perch(connect(file, "--say", ""), {}), /^perch: --say needs something to say\n$/);
    assertFails(await perch(connect(file, "--say", "   "), {}), /--say needs something to say/);
    const unwritable = join(tempDir(), "no-such-directory", "reply.wav");
    const r = await perch(connect(file, "--say", "Hello there.", "--reply-wav", unwritable), {});
    assertFails(r, /^perch: cannot write --reply-wav .*reply\.wav: ENOENT/);
    assert.doesNotMatch(r.stderr, /\n\s+at /, "no stack trace");
    assert.equal(existsSync(unwritable), false);
    assert.equal(await server.store.read((s) => s.peers.get(publicKey)), undefined, "the device never connected");
  });

  test("a turn that fails exits 1 naming the failure, and leaves no --reply-wav file", async () => {
    const { file } = keyFile();
    upstream.reply({ status: 500, error: { message: "the model fell over" } });
    const wav = join(tempDir(), "reply.wav");
    const r = await perch(connect(file, "--say", "What is the weather like today?", "--reply-wav", wav), {});
    assert.equal(r.code, 1, `${r.stdout}\n${r.stderr}`);
    assert.equal(existsSync(wav), false, "no empty reply file");
    assert.match(r.stdout, /event EOS .*"error":\{"code":"failed"/);
    assert.match(r.stderr, /^perch: the turn failed: /);
    assert.doesNotMatch(r.stderr, /\n\s+at /, "no stack trace");
  });

  test("a device no agent answers is told so soon after speaking, exit 1", async () => {
    const { file, publicKey } = keyFile();
    await server.domain.peers.add(publicKey);
    await server.domain.peers.setVoiceAgent(publicKey, "off");
    const r = await perch(connect(file, "--say", "Is anybody there?"), {});
    assert.equal(r.code, 1, `${r.stdout}\n${r.stderr}`);
    assert.match(r.stderr, /^perch: the server heard no speech: no voice agent answers this device/);
  });

  test("a refused connection says so, for calls and for connect", async () => {
    const { file } = keyFile();
    // A port nothing listens on: taken, then let go.
    const probe = createServer().listen(0, "127.0.0.1");
    await once(probe, "listening");
    const { port } = probe.address() as AddressInfo;
    await new Promise((r) => probe.close(r));
    for (const args of [["me"], ["connect", "--telemetry-interval", "0"]]) {
      const r = await perch(["device", "--server", `http://127.0.0.1:${port}`, "--key-file", file, ...args], {});
      assertFails(r, /^perch: cannot reach http:\/\/127\.0\.0\.1:\d+: connection refused \(is `perch serve` running there\?\) \(ECONNREFUSED\)\n$/);
    }
  });

  test("without --server the port comes from PERCH_CONFIG", async () => {
    const { file, publicKey } = keyFile();
    const config = join(tempDir(), "perch.json");
    writeFileSync(config, JSON.stringify({ port: server.port }));
    const r = await perch(["device", "--key-file", file, "me"], { PERCH_CONFIG: config, PERCH_PORT: "" });
    assert.equal(r.code, 0, r.stderr);
    assert.equal((JSON.parse(r.stdout) as { public_key: string }).public_key, publicKey);
  });
});
