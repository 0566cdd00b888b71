/**
 * A device's agent on a live connection (src/voice/agent-choice.ts), on a fake clock: no turn
 * before the choice is known, a failed read tried again (an `off` device is never answered by the
 * default agent meanwhile), a `voice` message on the bus taken at once, a read older than a
 * message never undoing it.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { InProcessBus, topics } from "../src/bus/index.ts";
import { AGENT_READ_RETRY_MS, DeviceAgentChoice } from "../src/voice/agent-choice.ts";
import type { VoiceEngines } from "../src/voice/engine-ports.ts";
import { FakeClock } from "./support/fake-voice.ts";

const KEY = "device-key";
const engines = new Map([
  ["talker", {} as VoiceEngines],
  ["other", {} as VoiceEngines],
]);

function choice(reads: Array<() => Promise<string | null | undefined>>) {
  const bus = new InProcessBus();
  const clock = new FakeClock();
  const errors: unknown[] = [];
  let calls = 0;
  const lookup = new DeviceAgentChoice({
    key: KEY,
    read: () => reads[Math.min(calls++, reads.length - 1)]!(),
    bus,
    defaultAgent: "talker",
    agents: [{ id: "talker" }, { id: "other", voice: "nova" }],
    engines,
    onReadError: (err) => errors.push(err),
    clock,
  });
  return { lookup, bus, clock, errors, calls: () => calls };
}

describe("a device's agent on a live connection", () => {
  test("a failed read is tried again; meanwhile no agent answers, so an off device is never answered by the default", async () => {
    const { lookup, clock, errors, calls } = choice([() => Promise.reject(new Error("store away")), async () => "off"]);
    await clock.advance(0);
    assert.equal(lookup.current(), undefined, "unknown: no turn");
    assert.equal(errors.length, 1);
    await clock.advance(AGENT_READ_RETRY_MS);
    assert.equal(calls(), 2, "read again");
    assert.equal(lookup.current(), undefined, "off");
    lookup.close();
  });

  test("the default agent when the device has no choice; a voice message for it is taken at once, another device's is not", async () => {
    const { lookup, bus, clock } = choice([async () => null]);
    await clock.advance(0);
    assert.equal(lookup.current()?.id, "talker");
    bus.publish(topics.peers, { kind: "voice", key: "someone-else", agent: "off" });
    assert.equal(lookup.current()?.id, "talker");
    bus.publish(topics.peers, { kind: "voice", key: KEY, agent: "other" });
    assert.deepEqual([lookup.current()?.id, lookup.current()?.voice], ["other", "nova"]);
    lookup.close();
    bus.publish(topics.peers, { kind: "voice", key: KEY, agent: "off" });
    assert.equal(lookup.current()?.id, "other", "closed: no longer listening");
  });

  test("a read that started before a message does not undo it", async () => {
    let answer: (v: string | null) => void = () => {};
    const { lookup, bus, clock } = choice([() => new Promise((resolve) => (answer = resolve))]);
    bus.publish(topics.peers, { kind: "voice", key: KEY, agent: "off" });
    answer("other");
    await clock.advance(0);
    assert.equal(lookup.current(), undefined, "still off");
    lookup.close();
  });

  test("closed while a retry waits: nothing is read again", async () => {
    const { lookup, clock, calls } = choice([() => Promise.reject(new Error("store away"))]);
    await clock.advance(0);
    lookup.close();
    await clock.advance(AGENT_READ_RETRY_MS * 3);
    assert.equal(calls(), 1);
  });
});
