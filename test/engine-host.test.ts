/**
 * One engine host per node: two nodes in one process, built with different engine settings, each
 * run on their own engines, queues, JSON thread and metrics (in process, no port taken).
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { rmSync } from "node:fs";
import { test } from "node:test";
import { type ConfigInput, loadConfig } from "../src/config/config.ts";
import { Node } from "../src/server.ts";
import { tempDir } from "./support/server.ts";

const KEY = "sk-engine-host";

async function buildNode(engines: ConfigInput["engines"]) {
  const dataDir = tempDir();
  const node = await Node.build({
    config: loadConfig({}, {
      port: 0,
      host: "127.0.0.1",
      data_dir: dataDir,
      log_level: "silent",
      api_keys: [{ name: "app", sha256: createHash("sha256").update(KEY).digest("hex"), models: ["*"] }],
      engines,
    } as ConfigInput),
  });
  return {
    node,
    speak: () =>
      node.request("/openai/v1/audio/speech", {
        method: "POST",
        headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "tts-1", input: "Hello.", voice: "alloy", response_format: "pcm" }),
      }),
    speechJobs: async () => {
      const text = await (await node.request("/metrics")).text();
      const line = text.split("\n").find((l) => l.startsWith('perch_engine_jobs_total{engine="speech",class="api"}'));
      return Number(line?.split(" ").at(-1) ?? 0);
    },
    close: async () => {
      await node.close();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

test("two nodes in one process, different engine settings: each has its own engines, queues, JSON thread and figures", async () => {
  const a = await buildNode({ recogniser_processes: 1, fast_recognition_after_ms: false });
  const b = await buildNode({ recogniser_processes: 2, fast_recognition_after_ms: 900 });
  let bClosed = false;
  try {
    assert.notEqual(a.node.engines, b.node.engines);
    assert.notEqual(a.node.engines.speech, b.node.engines.speech);
    assert.notEqual(a.node.engines.transcription, b.node.engines.transcription);
    assert.notEqual(a.node.engines.json, b.node.engines.json);
    // Each node's settings applied to its own recogniser (one slot a recogniser process), not the first node's.
    const recognition = (n: typeof a) => n.node.engines.schedulers().find((s) => s.name === "recognition");
    assert.equal(recognition(a)?.slots, 1);
    assert.equal(recognition(b)?.slots, 2);
    assert.equal(a.node.engines.settings?.recogniser_processes, 1);
    assert.equal(b.node.engines.settings?.recogniser_processes, 2);

    // Work on one node's engine is counted by that node alone.
    const res = await a.speak();
    assert.equal(res.status, 200);
    assert.ok((await res.arrayBuffer()).byteLength > 0);
    assert.equal(await a.speechJobs(), 1);
    assert.equal(await b.speechJobs(), 0);

    // Closing a node stops its engines only: the other still speaks.
    await a.close();
    const after = await b.speak();
    assert.equal(after.status, 200);
    assert.ok((await after.arrayBuffer()).byteLength > 0);
    assert.equal(await b.speechJobs(), 1);
    await b.close();
    bClosed = true;
  } finally {
    await a.close().catch(() => {});
    if (!bClosed) await b.close();
  }
});
