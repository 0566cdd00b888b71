/**
 * The turn recorder in process (src/voice/recording.ts): what goes in each side, from the voice
 * events a conversation sends and the audio it hears and sends; no server, no clock.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { LibOpus } from "../src/audio/opus.ts";
import type { VoiceEvent } from "../src/voice/peer-events.ts";
import { PRE_ROLL_MS, type SideRecording, TurnRecorder } from "../src/voice/recording.ts";

const tone = (samples: number, rate: number) => Int16Array.from({ length: samples }, (_, i) => Math.round(8_000 * Math.sin((2 * Math.PI * 300 * i) / rate)));

function frames(n: number): Buffer[] {
  const encoder = new LibOpus("voip", 48_000);
  const out = Array.from({ length: n }, (_, i) => encoder.encode(tone(960, 48_000).map((s) => s + i)));
  encoder.close();
  return out;
}

const bos = (n: number): VoiceEvent => ({ type: "bos", streamId: `in-${n}`, kind: "audio", label: "user.audio", mimeType: "" });
const eos = (n: number): VoiceEvent => ({ type: "eos", streamId: `in-${n}`, kind: "audio", label: "user.audio" });
const replyEnd = (n: number, interrupted = false): VoiceEvent => ({
  type: "eos",
  streamId: `out-${n}`,
  kind: "audio",
  label: "assistant.audio",
  ...(interrupted ? { error: { code: "interrupted" as const } } : {}),
});
const metrics = (n: number): VoiceEvent => ({ type: "done", streamId: `out-${n}`, label: "turn.metrics", text: `{"speech_to_audio":${n}}` });

function recorder(policy: () => { retentionDays: number } | undefined = () => ({ retentionDays: 2 })) {
  const stored: SideRecording[] = [];
  const told: Array<[number, string]> = [];
  const warned: unknown[] = [];
  const r = new TurnRecorder({ policy, store: (s) => stored.push(s), metrics: (turn, json) => told.push([turn, json]), warn: (e) => warned.push(e) });
  return { r, stored, told, warned };
}

/** The rate an Ogg Opus file says it was encoded from (its identification header). */
const inputRate = (ogg: Uint8Array) => {
  const b = Buffer.from(ogg);
  return b.readUInt32LE(b.indexOf("OpusHead", 0, "latin1") + 12);
};

describe("the turn recorder", () => {
  test("the user's side: the pre-roll before its speech was detected to its end; the reply's: frames sent until its audio ends (a barge-in), not after", async () => {
    const { r, stored, told, warned } = recorder();
    r.silence(16_000);
    r.event(bos(1));
    r.heard(tone(16_000, 16_000));
    r.event(eos(1));
    const sent = frames(40);
    for (const f of sent.slice(0, 25)) r.sent(f);
    r.event(replyEnd(1, true));
    // After the barge-in: not part of the reply's side.
    for (const f of sent.slice(25)) r.sent(f);
    assert.equal(stored.length, 0, "nothing stored before the turn finished");
    r.event(metrics(1));
    await r.settled();
    assert.deepEqual(told, [[1, '{"speech_to_audio":1}']]);
    assert.deepEqual(
      stored.map((s) => [s.turn, s.side, Math.round(s.durationMs), s.retentionDays]),
      [
        [1, "user", 1_000 + PRE_ROLL_MS, 2],
        [1, "assistant", 25 * 20, 2],
      ],
    );
    assert.equal(inputRate(stored[0]!.audio), 16_000);
    assert.deepEqual(warned, []);
  });

  test("an agent that does not record: no side kept, its metrics still told", async () => {
    const { r, stored, told } = recorder(() => undefined);
    r.event(bos(1));
    r.heard(tone(8_000, 16_000));
    r.event(eos(1));
    for (const f of frames(5)) r.sent(f);
    r.event(replyEnd(1));
    r.event(metrics(1));
    await r.settled();
    assert.deepEqual(stored, []);
    assert.equal(told.length, 1);
  });

  test("a turn without metrics (it failed) is kept when the next begins; the close keeps what was heard and sent so far", async () => {
    const { r, stored } = recorder();
    r.event(bos(1));
    r.heard(tone(4_800, 16_000));
    r.event(eos(1));
    r.event(bos(2));
    await r.settled();
    assert.deepEqual(
      stored.map((s) => `${s.turn}:${s.side}`),
      ["1:user"],
    );
    r.heard(tone(3_200, 16_000));
    r.event(eos(2));
    for (const f of frames(3)) r.sent(f);
    r.close();
    await r.settled();
    assert.deepEqual(
      stored.map((s) => `${s.turn}:${s.side}`),
      ["1:user", "2:user", "2:assistant"],
    );
    // Nothing after the close.
    r.event(bos(3));
    r.heard(tone(3_200, 16_000));
    r.event(eos(3));
    r.event(metrics(3));
    await r.settled();
    assert.equal(stored.length, 3);
  });

  test("the agent changes kind mid-turn (16 → 24 kHz): the side heard so far ends there, the next is encoded from 24 kHz", async () => {
    const { r, stored } = recorder();
    r.event(bos(1));
    r.heard(tone(8_000, 16_000), 16_000);
    r.heard(tone(12_000, 24_000), 24_000);
    r.event(eos(1));
    r.event(bos(2));
    r.heard(tone(24_000, 24_000), 24_000);
    r.event(eos(2));
    r.event(metrics(2));
    await r.settled();
    assert.deepEqual(
      stored.map((s) => [`${s.turn}:${s.side}`, inputRate(s.audio), Math.round(s.durationMs)]),
      [
        ["1:user", 16_000, 500],
        // Its pre-roll: the 500 ms heard at 24 kHz since the change (less than PRE_ROLL_MS), then its speech.
        ["2:user", 24_000, 1_500],
      ],
    );
  });
});
