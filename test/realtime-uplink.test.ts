/**
 * A realtime agent's uplink (voice.md §6), through the conversation's one pipeline, fast: the
 * conversation on a fake clock with a realtime agent chosen, a fake realtime server (a real
 * WebSocket server), RTP packets of real Opus. The silence after the user's speech reaches the
 * model at once (its own detector ends the turn on it, RFC 6464 audio level or not), and with
 * audio threads the realtime conversation's uplink is decoded on one of them, not on this thread.
 */
import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import pino from "pino";
import { Registry } from "prom-client";
import { loadResampler } from "../src/audio/resampler.ts";
import { loadConfig } from "../src/config/config.ts";
import { AudioThreads } from "../src/voice/audio-threads.ts";
import { Conversation } from "../src/voice/conversation.ts";
import { VoiceMetrics } from "../src/voice/metrics.ts";
import type { VoiceEvent } from "../src/voice/peer-events.ts";
import type { AudioPort } from "../src/voice/port.ts";
import { type FakeRealtime, fakeRealtimePart, startFakeRealtime } from "./support/fake-realtime.ts";
import { encoded, FakeClock, loudnessVad, withLevel } from "./support/fake-voice.ts";
import { rtpPacket } from "./support/rtp-device.ts";

/** A conversation whose device's agent is the realtime agent `talker`, its model the fake. */
async function realtimeConversation(fake: FakeRealtime, threads: AudioThreads | undefined) {
  const clock = new FakeClock();
  const config = loadConfig({}, {});
  const listeners = new Set<(packet: Buffer) => void>();
  const told: VoiceEvent[] = [];
  const sent = { frames: 0 };
  const port: AudioPort = {
    publicKey: "device",
    payloadType: 111,
    audioLevelId: 1,
    onPacket: (cb) => {
      listeners.add(cb);
      return () => listeners.delete(cb);
    },
    sendFrame: () => {
      sent.frames++;
      return true;
    },
    sendEvent: (e) => told.push(e) > 0,
  };
  const metrics = new VoiceMetrics(new Registry(), () => 1);
  const resampler = await loadResampler();
  const conversation = new Conversation({
    port,
    config: config.voice,
    activity: loudnessVad,
    resampler,
    metrics,
    logger: pino({ level: "silent" }),
    // No text agent: the realtime agent answers.
    agent: () => undefined,
    run: () => Promise.reject(new Error("a text agent was asked")),
    clock,
    threads,
    realtime: {
      chosen: () => "talker",
      open: (id, out) => fakeRealtimePart(fake.url, id, { config: config.voice, port, resampler, metrics, clock }, out),
    },
  });
  let seq = 0;
  const send = async (payload: Buffer, level: number) => {
    const packet = withLevel(rtpPacket({ sequence: seq, timestamp: seq * 960 }, payload), level);
    for (const l of listeners) l(packet);
    seq++;
    await clock.advance(20);
    // A thread decodes in real time: it is given a moment per packet.
    if (threads) await sleep(2);
  };
  /** Moves the clock on `ms` without packets, a real millisecond a tick (a thread encodes the reply's frames in real time). */
  const wait = async (ms: number) => {
    for (let t = 0; t < ms; t += 20) {
      await clock.advance(20);
      await sleep(1);
    }
  };
  return { conversation, send, wait, told, frames: () => sent.frames, sent: () => seq * 480 };
}

describe("a realtime agent's uplink, through the conversation's pipeline", () => {
  let fake: FakeRealtime;
  let threads: AudioThreads | undefined;
  after(async () => {
    await threads?.close();
    await fake?.close();
  });

  for (const onThread of [false, true]) {
    test(`the silence after speech reaches the model at once, not held back by the uplink's look-back (${onThread ? "on an audio thread" : "here"})`, async () => {
      fake ??= await startFakeRealtime();
      if (onThread) threads ??= new AudioThreads(1, () => {});
      const before = fake.sessions.length;
      const { conversation, send, sent } = await realtimeConversation(fake, onThread ? threads : undefined);
      try {
        assert.equal(conversation.active, true);
        // The realtime conversation's uplink is where the node's audio threads are (issue 49: it was always here).
        assert.equal(conversation.uplinkThread, onThread ? 0 : -1);
        await fake.until(() => fake.sessions.slice(before).some((s) => s.session !== undefined), 10_000, "the session");
        const s = fake.sessions.slice(before).find((x) => x.session !== undefined)!;
        const quiet = encoded(1, false)[0]!;
        for (let i = 0; i < 25; i++) await send(quiet, 127);
        for (const p of encoded(30, true)) await send(p, 10);
        // 800 ms of silence after the speech: the model's detector needs it as it comes (server_vad ends on 500 ms of it).
        for (let i = 0; i < 40; i++) await send(quiet, 127);
        // Everything sent is appended (24 kHz), less what the session batches (under 40 ms).
        await fake.until(() => s.appended > sent() - 960, 5_000, `all ${sent()} samples appended (${s.appended} so far)`);
      } finally {
        conversation.close();
      }
    });
  }

  test("the audio thread dies while it encodes a realtime reply: that reply fails (its audio stops, failed events); the next turn is answered on a fresh thread", async () => {
    fake ??= await startFakeRealtime();
    threads ??= new AudioThreads(1, () => {});
    const r = await realtimeConversation(fake, threads);
    const loud = encoded(30, true);
    const quiet = encoded(1, false)[0]!;
    const ask = async () => {
      for (const p of loud) await r.send(p, 10);
      for (let i = 0; i < 25; i++) await r.send(quiet, 127);
    };
    const audioEnd = (n: number) =>
      r.told.find((e): e is Extract<VoiceEvent, { type: "eos" }> => e.type === "eos" && e.streamId === `out-${n}` && e.label === "assistant.audio");
    try {
      await fake.until(() => fake.sessions.some((s) => s.session !== undefined && !s.closed), 10_000, "the session");
      // A long reply, sent faster than it plays: it is still playing when the thread dies.
      fake.script({ kind: "reply", text: "Once upon a time there was a very long story.", ms: 10_000, speed: 4 });
      await ask();
      for (let i = 0; i < 500 && r.frames() < 10; i++) await r.wait(20);
      assert.ok(r.frames() >= 10, `${r.frames()} frames of the reply sent`);
      await threads.workers[r.conversation.uplinkThread]!.terminate();
      for (let i = 0; i < 500 && !audioEnd(1); i++) await r.wait(20);
      assert.equal(audioEnd(1)?.error?.code, "failed", JSON.stringify(audioEnd(1)));
      const atDeath = r.frames();
      await r.wait(200);
      assert.equal(r.frames(), atDeath, "the reply's audio stopped");
      // The next turn is heard and answered, its reply encoded on the fresh thread.
      fake.script({ kind: "reply", text: "It is ten o'clock.", ms: 600 });
      await ask();
      for (let i = 0; i < 500 && !audioEnd(2); i++) await r.wait(20);
      assert.ok(audioEnd(2) && audioEnd(2)?.error === undefined, JSON.stringify(audioEnd(2)));
      assert.ok(r.frames() > atDeath, "the next reply was spoken");
    } finally {
      r.conversation.close();
    }
  });
});
