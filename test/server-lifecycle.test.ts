/** `Node.build` opens and wires without listening; `listen()` listens once; `close()` closes what the steps reached. */
import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { test } from "node:test";
import { loadConfig } from "../src/config/config.ts";
import { Node } from "../src/server.ts";
import { TEST_ENGINES } from "./support/engines.ts";
import { freeTcpPort, STORES, tempDir } from "./support/server.ts";

for (const entry of STORES) {
  test(`a built node accepts nothing until listen(), listens once, and closes its store either way (${entry.name})`, async () => {
    const dataDir = tempDir();
    try {
      const port = await freeTcpPort();
      const databaseUrl = await entry.url();
      const config = loadConfig(
        {},
        {
          port,
          host: "127.0.0.1",
          data_dir: dataDir,
          log_level: "silent",
          webrtc: { enabled: false },
          engines: TEST_ENGINES,
          ...(databaseUrl ? { database_url: databaseUrl } : {}),
        },
      );

      const built = await Node.build({ config });
      assert.equal(built.httpServer.listening, false);
      await assert.rejects(fetch(`http://127.0.0.1:${port}/healthz`), "nothing accepts on the port before listen()");
      // The store is open and usable before listening.
      assert.equal(typeof (await built.store.read((r) => r.sessions.countLive(Date.now()))), "number");

      const running = await built.listen();
      try {
        assert.equal(running.port, port);
        assert.equal(running.url, `http://127.0.0.1:${port}`);
        assert.equal((await fetch(`${running.url}/healthz`)).status, 200);
        await assert.rejects(built.listen(), /already called/);
      } finally {
        // The node's close and the running server's are one shutdown.
        assert.equal(built.close(), running.close());
        await running.close();
      }
      await assert.rejects(built.listen(), /already called/, "a closed node does not listen again");
      await assert.rejects(fetch(`http://127.0.0.1:${port}/healthz`), "closed: nothing accepts");
      await assert.rejects(
        running.store.read((r) => r.sessions.countLive(Date.now())),
        "the store is closed",
      );

      // A node built and never listened: close() closes its store.
      const idle = await Node.build({ config });
      await idle.close();
      await assert.rejects(
        idle.store.read((r) => r.sessions.countLive(Date.now())),
        "the store is closed",
      );
    } finally {
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
}
