import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { encodeKey, generateKeyPair } from "../src/crypto/keys.ts";
import { perch } from "./support/cli.ts";
import { offerListed, volumeTool } from "./support/device-tools.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { startTestServer, type TestServer, tempDir } from "./support/server.ts";
import { EventLog, spoken, talkerConfig } from "./support/voice.ts";
import { connect, eventually } from "./support/webrtc.ts";

const QUESTION = "Turn the volume down to three.";

/** Voice turns with device tools: the calls show as events, the turn waits for them, a barge-in cancels them. */
describe("tools in voice conversations", () => {
  let upstream: FakeUpstream;
  let server: TestServer;

  before(async () => {
    upstream = await startFakeUpstream();
    const config = talkerConfig(upstream.url);
    // A tool call waits a minute before it times out: only the barge-in can cancel it within the tests' bounds (30 s).
    config.agents[0] = { ...config.agents[0]!, tools: ["device.*"], tool_timeout_ms: 60_000 } as (typeof config.agents)[0];
    server = await startTestServer({ config });
    // A first conversation, without tools, until a turn is heard: on a busy machine the engines'
    // cold start (the detector's first inferences) can drop a whole first question.
    const conn = await connect(server);
    try {
      const log = new EventLog(conn);
      const mic = await conn.microphone();
      const hello = await spoken("Hello there.");
      for (let attempt = 1; !log.all.some((s) => s.label === "user.audio"); attempt++) {
        if (attempt > 5) throw new Error("no turn was heard in five tries");
        await mic.say(hello);
        await log.wait((s) => s.label === "user.audio", 10_000, "speech").catch(() => {});
      }
      await log.wait((s) => s.label === "turn.metrics", 60_000, "the warm-up turn");
    } finally {
      conn.close();
    }
  });

  after(async () => {
    await server?.stop();
    await upstream?.close();
  });

  test("the model calls device.set_volume {level: 3}: tool.call and tool.result events, the handler ran, then the reply", async () => {
    const conn = await connect(server);
    try {
      const log = new EventLog(conn);
      const mic = await conn.microphone();
      // The turn waits for the tool.
      const { tool, got } = volumeTool({ delayMs: 300 });
      await offerListed(server, conn, [tool]);
      upstream.reply({ tool_calls: [{ id: "v", name: "device.set_volume", arguments: '{"level":3}' }] }, { content: "The volume is three now." });
      const before = upstream.received.length;
      await mic.say(await spoken(QUESTION));
      await log.wait((s) => s.stream === "out-1" && s.label === "turn.metrics", 60_000, "the turn's end");
      assert.deepEqual(got, [{ level: 3 }]);
      const call = log.all.find((s) => s.label === "tool.call")!;
      const result = log.all.find((s) => s.label === "tool.result")!;
      assert.equal(call.type, "TEXT_DONE");
      assert.equal(call.stream, "out-1");
      assert.deepEqual(JSON.parse(call.text!), { name: "device.set_volume", arguments: { level: 3 } });
      assert.deepEqual(JSON.parse(result.text!), { name: "device.set_volume", is_error: false, text: "The volume is now 3." });
      const audio = log.all.find((s) => s.stream === "out-1" && s.type === "BOS" && s.label === "assistant.audio")!;
      assert.ok(call.sequence < result.sequence && result.sequence < audio.sequence, "the reply is spoken after the tool's result");
      assert.equal(log.all.find((s) => s.stream === "out-1" && s.label === "assistant.text" && s.type === "TEXT_DONE")!.text, "The volume is three now.");
      const [first, second] = upstream.received.slice(before);
      assert.deepEqual(
        first!.body.tools.map((t: any) => t.function.name),
        ["device.set_volume"],
      );
      assert.equal(second!.body.messages.at(-1).content, "The volume is now 3.");
    } finally {
      conn.close();
    }
  });

  test("a barge-in while a tool runs cancels the call on the device", async () => {
    const conn = await connect(server);
    try {
      const log = new EventLog(conn);
      const mic = await conn.microphone();
      let cancelled = false;
      await conn.offerTools([
        {
          name: "play_lullaby",
          description: "Plays the lullaby to its end.",
          inputSchema: { type: "object", properties: {} },
          handler: (_args, signal) =>
            new Promise((resolve) =>
              signal.addEventListener("abort", () => {
                cancelled = true;
                resolve("stopped");
              }),
            ),
        },
      ]);
      await eventually(() => server.transport!.deviceTools(conn.publicKey)?.tools.length === 1, 5000, "listed");
      upstream.reply({ tool_calls: [{ id: "l", name: "device.play_lullaby", arguments: "{}" }] }, { content: "Fine." });
      await mic.say(await spoken("Play the lullaby."));
      await log.wait((s) => s.label === "tool.call", 60_000, "the call");
      await mic.say(await spoken("Stop that please."));
      // Within 30 s, half the tool's timeout: the barge-in's cancel, not the timeout, reaches the handler.
      await eventually(() => cancelled, 30_000, "the device's handler cancelled");
      await log.wait((s) => s.stream === "out-2" && s.label === "turn.metrics", 30_000, "turn 2");
    } finally {
      conn.close();
    }
  });

  test("perch device connect --tool volume --say: prints the tool call and result events, and the device's new volume", async () => {
    upstream.reply({ tool_calls: [{ id: "c", name: "device.set_volume", arguments: '{"level":3}' }] }, { content: "Done, the volume is three." });
    const pair = generateKeyPair();
    const keyFile = join(tempDir(), "device.json");
    writeFileSync(keyFile, JSON.stringify({ public_key: encodeKey(pair.publicKey), private_key: encodeKey(pair.privateKey) }));
    const r = await perch(
      ["device", "--server", server.url, "--key-file", keyFile, "connect", "--telemetry-interval", "0", "--tool", "volume", "--say", QUESTION],
      {},
    );
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /tools offered over service 3 \{"tools":\["device.set_volume","device.get_volume"\]\}/);
    assert.match(r.stdout, /event TEXT_DONE \{"stream":"out-1","label":"tool.call","text":\{"name":"device.set_volume","arguments":\{"level":3\}\}\}/);
    assert.match(r.stdout, /volume set \{"level":3\}/);
    assert.match(
      r.stdout,
      /event TEXT_DONE \{"stream":"out-1","label":"tool.result","text":\{"name":"device.set_volume","is_error":false,"text":"The volume is now 3."\}\}/,
    );
    assert.match(r.stdout, /"label":"assistant.text","text":"Done, the volume is three."/);
  });
});
