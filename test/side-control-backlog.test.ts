/**
 * The fast layer: a Side Control event stream whose client stops reading is dropped once more than
 * its backlog (1 MiB) waits for it, through the one stream writer (`PushSource` in front of
 * `writeStream`); in process (`Node.request`), a real node and store.
 */
import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { after, before, test } from "node:test";
import { loadConfig } from "../src/config/config.ts";
import { generateKeyPair } from "../src/crypto/keys.ts";
import { PerchClient } from "../src/sdk/client.ts";
import { Node } from "../src/server.ts";
import { tempDir } from "./support/server.ts";

let node: Node;
let dataDir: string;
before(async () => {
  dataDir = tempDir();
  node = await Node.build({ config: loadConfig({}, { port: 0, host: "127.0.0.1", data_dir: dataDir, log_level: "silent" }) });
});
after(async () => {
  await node.close();
  rmSync(dataDir, { recursive: true, force: true });
});

test("a client that stops reading its events is dropped once a MiB of them waits; one that reads keeps its stream", async () => {
  const fetchInProcess = ((url: string | URL | Request, init?: RequestInit) => node.request(String(url), init)) as typeof fetch;
  const device = new PerchClient({ baseUrl: "http://in-process", keyPair: generateKeyPair(), fetch: fetchInProcess });
  await device.login();
  const phone = new PerchClient({ baseUrl: "http://in-process", keyPair: generateKeyPair(), fetch: fetchInProcess });
  await phone.login({ deviceToken: (await device.createDeviceToken()).token });
  const open = () => node.request("/side-control/events", { headers: { authorization: `Bearer ${phone.accessToken}` } });
  const stalled = await open();
  assert.equal(stalled.status, 200);
  const reading = await open();
  const reader = reading.body!.getReader();
  let readBytes = 0;
  const drained = (async () => {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      readBytes += value.length;
    }
  })();

  // About 16 KiB an event: 160 changes are over twice the backlog, even if the hub reads some together.
  const filler = "x".repeat(16 * 1024 - 64);
  for (let i = 0; i < 160; i++) await device.putStatus({ volume: i % 100, details: { filler, i } });

  // The stalled stream was cut: reading it now fails before its end, instead of waiting for more.
  const cut = await Promise.race([
    stalled.arrayBuffer().then(
      () => "ended",
      () => "cut",
    ),
    new Promise<string>((resolve) => setTimeout(resolve, 20_000, "still open")),
  ]);
  assert.equal(cut, "cut");
  assert.ok(readBytes > 1024 * 1024, `the reading client got every change (${readBytes} bytes)`);
  await reader.cancel();
  await drained.catch(() => {});
});
