/**
 * One voice pipeline per conversation (issue 49), fast: a conversation in process on a fake clock,
 * its device a fake port, the realtime model a fake realtime server (a real WebSocket server).
 * The agent's kind chooses the part that answers, followed every tick: the one uplink is reopened
 * at that part's rate, a realtime session lives only while its agent is chosen, and the device's
 * packets reach the conversation through one subscription that its close ends.
 */
import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import pino from "pino";
import { Registry } from "prom-client";
import { loadResampler } from "../src/audio/resampler.ts";
import { loadConfig } from "../src/config/config.ts";
import type { AgentChoice } from "../src/voice/activity.ts";
import { AudioThreads } from "../src/voice/audio-threads.ts";
import { Conversation } from "../src/voice/conversation.ts";
import { VoiceMetrics } from "../src/voice/metrics.ts";
import type { AudioPort } from "../src/voice/port.ts";
import { type FakeRealtime, fakeRealtimePart, startFakeRealtime } from "./support/fake-realtime.ts";
import { encoded, FakeClock, loudnessVad } from "./support/fake-voice.ts";
import { rtpPacket } from "./support/rtp-device.ts";

const writer: AgentChoice = { id: "writer", voice: "alloy", engines: {} as never };

async function pipeline(fake: FakeRealtime, threads?: AudioThreads, seen?: { opened: string[]; closed: string[] }) {
  const clock = new FakeClock();
  const config = loadConfig({}, {});
  const listeners = new Set<(packet: Buffer) => void>();
  const port: AudioPort = {
    publicKey: "device",
    payloadType: 111,
    onPacket: (cb) => {
      listeners.add(cb);
      return () => listeners.delete(cb);
    },
    sendFrame: () => true,
    sendEvent: () => true,
  };
  const metrics = new VoiceMetrics(new Registry(), () => 1);
  const resampler = await loadResampler();
  /** The device's agent: the realtime `talker`, the text `writer`, or none (voice off). */
  const device: { agent: "talker" | "writer" | undefined } = { agent: "talker" };
  const { opened, closed } = seen ?? { opened: [], closed: [] };
  const conversation = new Conversation({
    port,
    config: config.voice,
    activity: loudnessVad,
    resampler,
    metrics,
    logger: pino({ level: "silent" }),
    agent: () => (device.agent === "writer" ? writer : undefined),
    run: () => Promise.reject(new Error("no turn is asked in this test")),
    clock,
    threads,
    realtime: {
      chosen: () => (device.agent === "talker" ? "talker" : undefined),
      open: (id, out) => {
        opened.push(id);
        const part = fakeRealtimePart(fake.url, id, { config: config.voice, port, resampler, metrics, clock }, out);
        // Seen closed: a session closed before it connected never reaches the fake.
        const close = part.close.bind(part);
        part.close = () => {
          closed.push(id);
          close();
        };
        return part;
      },
    },
  });
  const quiet = encoded(1, false)[0]!;
  let seq = 0;
  /** `n` packets of 20 ms, one a tick; the samples the conversation heard of them. */
  const send = async (n: number): Promise<number> => {
    const before = conversation.heardSamples;
    for (let i = 0; i < n; i++) {
      const packet = rtpPacket({ sequence: seq, timestamp: seq * 960 }, quiet);
      seq++;
      for (const l of listeners) l(packet);
      await clock.advance(20);
    }
    // What the jitter buffer and the look-back still hold comes out on the following ticks.
    await clock.advance(400);
    return conversation.heardSamples - before;
  };
  return { conversation, listeners, device, opened, closed, send, clock };
}

describe("one pipeline per conversation", () => {
  let fake: FakeRealtime;
  after(async () => {
    await fake?.close();
  });

  test("the agent's kind chooses the part: the uplink follows its rate, a realtime session lives while its agent is chosen", async () => {
    fake ??= await startFakeRealtime();
    const before = fake.sessions.length;
    const p = await pipeline(fake);
    try {
      assert.equal(p.conversation.active, true);
      await fake.until(() => fake.sessions.slice(before).some((s) => s.session !== undefined), 10_000, "the session");
      // 24 kHz for the realtime model: 480 samples a packet.
      const realtime = await p.send(50);
      assert.ok(realtime >= 49 * 480 && realtime <= 51 * 480 + 480 * 20, `heard ${realtime} samples at 24 kHz`);
      // The device's agent becomes the text agent: the session closes, the uplink decodes at 16 kHz for the recogniser.
      p.device.agent = "writer";
      await p.clock.advance(20);
      await fake.until(() => fake.sessions.slice(before).every((s) => s.closed), 10_000, "the realtime session's close");
      assert.equal(p.conversation.active, true);
      const text = await p.send(50);
      assert.ok(text >= 49 * 320 && text <= 51 * 320 + 320 * 20, `heard ${text} samples at 16 kHz`);
      // Voice off: nothing answers, and the device's packets are not decoded.
      p.device.agent = undefined;
      await p.clock.advance(20);
      assert.equal(p.conversation.active, false);
      assert.equal(await p.send(10), 0);
      // The realtime agent again: a new session.
      p.device.agent = "talker";
      await p.clock.advance(20);
      assert.deepEqual(p.opened, ["talker", "talker"]);
      assert.equal(p.conversation.active, true);
    } finally {
      p.conversation.close();
    }
  });

  test("the device's packets reach the conversation through one subscription, which its close ends", async () => {
    fake ??= await startFakeRealtime();
    const p = await pipeline(fake);
    assert.equal(p.listeners.size, 1);
    p.conversation.close();
    assert.equal(p.listeners.size, 0);
    assert.equal(p.conversation.active, false);
  });

  test("a conversation that cannot start leaves nothing open: its realtime session is closed", async () => {
    fake ??= await startFakeRealtime();
    const threads = new AudioThreads(1, () => {});
    await threads.close();
    const seen = { opened: [] as string[], closed: [] as string[] };
    await assert.rejects(pipeline(fake, threads, seen), /the audio threads are closed/);
    assert.deepEqual(seen, { opened: ["talker"], closed: ["talker"] });
  });
});
