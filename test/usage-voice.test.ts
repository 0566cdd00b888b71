import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import { type ConfigInput, loadConfig } from "../src/config/config.ts";
import { systemClock } from "../src/domain/clock.ts";
import { UsageMeter } from "../src/domain/usage-meter.ts";
import { Store } from "../src/store/index.ts";
import { deviceTurnUsage, LimitedReplies } from "../src/voice/usage.ts";
import { type Rig, rig } from "./support/fake-voice.ts";
import { tempDir } from "./support/server.ts";

const KEY = "fake-device";
const REST = "Time for a nap, talk tomorrow!";

/** The fast layer: a conversation on fake engines and a fake clock, counted by a real meter over a real SQLite store. */
async function meterOf(store: Store, usage: ConfigInput["usage"]): Promise<UsageMeter> {
  const config = loadConfig({}, { data_dir: "unused", usage } as ConfigInput);
  return new UsageMeter({ store, clock: systemClock, config });
}

async function ask(r: Rig): Promise<void> {
  await r.talk(600);
  await r.talk(600, false);
}

/** Waits (real time: the store answers in it) for turn `n`'s metrics, moving the conversation's clock. */
async function untilTurn(r: Rig, n: number): Promise<Record<string, unknown>> {
  for (let i = 0; i < 400 && !r.turnMetrics(n); i++) {
    await r.wait(20);
    await new Promise((resolve) => setTimeout(resolve, 2));
  }
  const m = r.turnMetrics(n);
  assert.ok(m, `turn ${n} finished`);
  return m;
}

describe("usage of voice turns (fast layer)", () => {
  let dir: string;
  let store: Store;

  before(async () => {
    dir = tempDir();
    store = await Store.open(undefined, dir, { readWorkers: 0 });
  });

  after(async () => {
    await store?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test("a turn is counted (request, audio heard, characters spoken); at the limit the limited reply is spoken without a model call, kept", async () => {
    const meter = await meterOf(store, { limits: [{ scope: "device", per: "day", requests: 1 }] });
    const replies = new LimitedReplies([{ id: "talker", limited_reply: REST }]);
    const r = await rig(
      {},
      { usage: deviceTurnUsage(meter, KEY, replies), limited: () => meter.limitedCached({ id: `device:${KEY}`, device: KEY }, "talker") },
    );
    await ask(r);
    const first = await untilTurn(r, 1);
    assert.equal(first.limited, undefined);
    assert.equal(r.model.calls.length, 1);
    const spokenChars = r.tts.requests.reduce((n, q) => n + q.text.length, 0);
    await meter.flush("all");
    const [row] = await store.read((x) => x.usage.rows([`device:${KEY}`], "2000-01-01"));
    assert.equal(row?.requests, 1);
    assert.equal(row?.speech_chars, spokenChars);
    assert.ok((row?.audio_ms ?? 0) >= 600, `audio ${row?.audio_ms}`);

    // The second turn: the limit of one request a day is reached.
    await ask(r);
    const second = await untilTurn(r, 2);
    assert.equal(second.limited, "requests");
    assert.equal(r.model.calls.length, 1, "no model call");
    assert.equal(r.of("out-2").find((e) => e.type === "TEXT_DONE" && e.label === "assistant.text")?.text, REST);
    assert.ok(
      r.of("out-2").some((e) => e.label === "assistant.audio" && e.type === "EOS" && !e.error),
      "spoken",
    );
    assert.deepEqual(
      r.observed.filter((e) => e.role === "assistant").map((e) => e.text),
      [r.observed.find((e) => e.role === "assistant")!.text, REST],
      "the conversation's entries record it",
    );
    const synthesised = r.tts.requests.length;
    assert.equal(r.tts.requests.at(-1)?.text, REST);
    assert.match(await r.metrics.getSingleMetricAsString("perch_voice_turns_total"), /result="limited"\} 1/);

    // Once more: spoken from the kept copy, no synthesis, and no request counted.
    await ask(r);
    assert.equal((await untilTurn(r, 3)).limited, "requests");
    assert.equal(r.tts.requests.length, synthesised, "the limited reply is synthesised once");
    assert.equal(r.model.calls.length, 1);
    await meter.flush("all");
    const [after] = await store.read((x) => x.usage.rows([`device:${KEY}`], "2000-01-01"));
    assert.equal(after?.requests, 1);
    assert.equal(after?.speech_chars, spokenChars, "the kept reply is no synthesis");
    r.close();
    await meter.close();
  });

  test("a conversation closed mid-reply leaves no work in flight: the device's next work near a limit is judged, not held for ever", async () => {
    const key = "fake-device-leaving";
    const who = { id: `device:${key}`, device: key };
    const meter = await meterOf(store, { limits: [{ scope: "device", per: "day", speech_chars: 2_000_000 }] });
    const r = await rig({}, { usage: deviceTurnUsage(meter, key, new LimitedReplies([{ id: "talker", limited_reply: REST }])) });
    // A reply that is still going when the device leaves.
    r.model.script = () =>
      (async function* () {
        yield "Hello there. ";
        await new Promise(() => {});
      })();
    await ask(r);
    for (let i = 0; i < 400 && r.model.calls.length === 0; i++) {
      await r.wait(20);
      await new Promise((resolve) => setTimeout(resolve, 2));
    }
    assert.equal(r.model.calls.length, 1, "the reply began");
    r.close();
    await new Promise((resolve) => setTimeout(resolve, 20));
    // Near the limit the meter lets one piece start at a time: a turn it still thinks in flight would hold this for ever.
    meter.record(who, "talker", { speech_chars: 1_000_000 });
    const next = Promise.resolve(meter.admit(who, "talker")).then(
      () => "admitted",
      (err: unknown) => `refused: ${String(err)}`,
    );
    const held = new Promise<string>((resolve) => setTimeout(() => resolve("held"), 3_000).unref());
    assert.equal(await Promise.race([next, held]), "admitted");
    await meter.close();
  });
});
