/**
 * The uplink on audio threads (issue 41), fast: conversations on fake engines and fake clocks
 * (test/support/fake-voice.ts), their uplinks decoded by real worker threads of one AudioThreads
 * pool; each packet's audio is awaited before the conversation's clock moves on.
 */
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { AudioThreads } from "../src/voice/audio-threads.ts";
import { encoded, pieces, type Rig, RtpSender, rig, withLevel } from "./support/fake-voice.ts";
import { rtpPacket } from "./support/rtp-device.ts";

const word = encoded(20, true);
/** A packet carrying this sends test/support/stuck-audio-worker.ts into its endless loop (not imported: it is a thread's module). */
const STUCK_MAGIC = "PERCH-TEST-STUCK";
const silence = encoded(1, false)[0]!;

async function speak(tx: RtpSender): Promise<void> {
  for (const p of word) await tx.send(p, { level: 10 });
}

async function quiet(tx: RtpSender, ms: number): Promise<void> {
  for (let t = 0; t < ms; t += 20) await tx.send(silence, { level: 127 });
}

async function until(what: string, fn: () => boolean, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!fn()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(2);
  }
}

/**
 * Moves the clock until turn `n`'s metrics are out. The reply's frames are encoded on a thread, in
 * real time (a message at most every 10 ms): each step of the clock leaves it a real millisecond,
 * or the clock would run 30 s past a reply still waiting for its frames.
 */
async function finished(r: Rig, n: number): Promise<Record<string, unknown>> {
  for (let t = 0; t < 30_000 && !r.turnMetrics(n); t += 20) {
    await r.wait(20);
    await sleep(1);
  }
  const m = r.turnMetrics(n);
  assert.ok(m, `turn ${n} finished; events: ${JSON.stringify(r.events.map((e) => [e.type, e.stream, e.label]))}`);
  return m;
}

describe("the uplink on audio threads (fake engines, fake clock, real threads)", () => {
  const threads = new AudioThreads(2, () => {});
  after(() => threads.close());

  test("conversations are spread over the threads, and one decoded there converses as on the main thread", async () => {
    const a = await rig({}, { threads });
    const b = await rig({}, { threads });
    try {
      assert.deepEqual(
        threads.workers.map((w) => w.conversations),
        [1, 1],
      );
      const tx = new RtpSender(a, { echo: true });
      await quiet(tx, 200);
      await speak(tx);
      await quiet(tx, 600);
      const m = await finished(a, 1);
      assert.equal(a.of("in-1").find((e) => e.type === "TEXT_DONE")?.text, "What time is it?");
      assert.ok(typeof m.speech_to_audio === "number");
      assert.ok(a.frames > 0, "the reply was spoken");
      assert.equal(threads.framesEncoded, a.frames, "every frame of it encoded on the thread");
    } finally {
      a.close();
      b.close();
    }
    await until("the conversations closed on the threads", () => threads.workers.every((w) => w.conversations === 0));
  });

  test("a conversation's last packets are counted when it ends (perch_voice_uplink_packets_total), not only those of its last full second", async () => {
    let heard = 0;
    const counted = { decoded: 0, silent: 0 };
    const uplink = threads.uplink({
      payloadType: 111,
      audioLevelId: 1,
      rate: 16_000,
      pcm: (pcm) => (heard += pcm.length),
      silence: (samples) => (heard += samples),
      overrun: () => {},
      counted: (decoded, silent) => {
        counted.decoded += decoded;
        counted.silent += silent;
      },
      failed: () => {},
    });
    for (const [i, p] of word.entries()) uplink.packet(withLevel(rtpPacket({ sequence: i, timestamp: i * 960 }, p), 10));
    await until("the word decoded", () => heard >= word.length * 320);
    uplink.close();
    await until("its packets counted", () => counted.decoded === word.length);
    assert.deepEqual(counted, { decoded: word.length, silent: 0 });
  });

  test("a thread that cannot start is replaced with back-off (at once, then 100 ms, 200 ms…), not in a loop; a reply's frames meanwhile are answered, not awaited", async () => {
    const waits: Array<{ ms: number; fn: () => void }> = [];
    const ended: string[] = [];
    const dying = new AudioThreads(1, (_details, message) => ended.push(message), {
      script: new URL("./support/dying-audio-worker.ts", import.meta.url),
      after: (ms, fn) => waits.push({ ms, fn }),
    });
    try {
      // The first start fails: replaced at once; its replacement fails too: the next one waits.
      await until("two threads ended and a wait", () => ended.length >= 2 && waits.length >= 1);
      assert.deepEqual(
        waits.map((w) => w.ms),
        [100],
      );
      assert.equal(ended.length, 2, "no thread is started while it waits");
      // A conversation's reply frames while no thread can take them: each answered (empty), none left waiting.
      const uplink = dying.uplink({
        payloadType: 111,
        audioLevelId: undefined,
        rate: 16_000,
        pcm: () => {},
        silence: () => {},
        overrun: () => {},
        counted: () => {},
        failed: () => {},
      });
      const answered: number[] = [];
      uplink.frame(new Int16Array(960), (opus) => answered.push(opus.length));
      assert.deepEqual(answered, [0]);
      waits[0]!.fn();
      await until("the third thread ended and a longer wait", () => ended.length >= 3 && waits.length >= 2);
      assert.deepEqual(
        waits.map((w) => w.ms),
        [100, 200],
      );
      uplink.close();
    } finally {
      await dying.close();
    }
  });

  test("a thread that dies takes only its conversations' turns: failed events; the other thread's turn is answered; the next turn works on a fresh thread", async () => {
    const a = await rig({}, { threads });
    const b = await rig({}, { threads });
    try {
      const ta = new RtpSender(a, { echo: true });
      const tb = new RtpSender(b, { echo: true });
      // Both are speaking, one on each thread.
      await speak(ta);
      await speak(tb);
      assert.ok(a.of("in-1").some((e) => e.type === "BOS") && b.of("in-1").some((e) => e.type === "BOS"), "both turns begun");
      const dead = a.conversation.uplinkThread;
      assert.notEqual(dead, b.conversation.uplinkThread, "one on each thread");
      const deadId = threads.workers[dead]!.threadId;
      await threads.workers[dead]!.terminate();
      await until("a's turn failed", () => a.of("out-1").some((e) => e.type === "EOS" && e.error?.code === "failed"));
      assert.deepEqual(
        a.events.filter((e) => e.stream === "in-1" || e.stream === "out-1").map((e) => `${e.type} ${e.stream} ${e.label}${e.error ? ` ${e.error.code}` : ""}`),
        ["BOS in-1 user.audio", "EOS in-1 user.audio", "EOS out-1 assistant.text failed", "TEXT_DONE out-1 turn.metrics"],
      );
      assert.equal(a.model.calls.length, 0, "no reply was asked for the lost turn");
      // The other thread's conversation goes on as if nothing happened.
      await quiet(tb, 600);
      await finished(b, 1);
      assert.equal(
        b.of("out-1").find((e) => e.type === "EOS" && e.error),
        undefined,
      );
      assert.equal(b.of("in-1").find((e) => e.type === "TEXT_DONE")?.text, "What time is it?");
      // The next turn of the conversation that lost its thread works, on a fresh one.
      assert.notEqual(threads.workers[dead]!.threadId, deadId, "a fresh thread took its place");
      await quiet(ta, 600);
      await speak(ta);
      await quiet(ta, 600);
      const m = await finished(a, 2);
      assert.equal(a.of("in-2").find((e) => e.type === "TEXT_DONE")?.text, "What time is it?");
      assert.ok(typeof m.speech_to_audio === "number", JSON.stringify(m));
    } finally {
      a.close();
      b.close();
    }
  });

  test("a thread that is stuck (alive, not answering) is found by the heartbeat: its turn fails with failed events, a fresh thread takes its place, the next turn is answered", async () => {
    const marker = join(mkdtempSync(join(tmpdir(), "perch-stuck-")), "marker");
    process.env.PERCH_TEST_STUCK_MARKER = marker;
    const warned: string[] = [];
    const stuck = new AudioThreads(1, (_details, message) => warned.push(message), {
      script: new URL("./support/stuck-audio-worker.ts", import.meta.url),
      heartbeatMs: 50,
      stuckMs: 400,
    });
    const a = await rig({}, { threads: stuck });
    try {
      const ta = new RtpSender(a, { echo: true });
      const before = stuck.workers[0]!.threadId;
      // The turn begins; then the thread stops answering in the middle of the words.
      await speak(ta);
      assert.ok(
        a.of("in-1").some((e) => e.type === "BOS"),
        "the turn begun",
      );
      // The conversation's clock stands still meanwhile: only the heartbeat (real time) can end the turn.
      await ta.send(Buffer.from(STUCK_MAGIC), { level: 10, wait: false });
      await until("the stuck thread found and replaced", () => stuck.workers[0]!.threadId !== before, 10_000);
      assert.ok(existsSync(marker), "the thread got stuck");
      assert.ok(
        warned.some((m) => m.includes("an audio thread ended")),
        JSON.stringify(warned),
      );
      await until("the turn failed", () => a.of("out-1").some((e) => e.type === "EOS" && e.error?.code === "failed"));
      assert.deepEqual(
        a.events.filter((e) => e.stream === "in-1" || e.stream === "out-1").map((e) => `${e.type} ${e.stream} ${e.label}${e.error ? ` ${e.error.code}` : ""}`),
        ["BOS in-1 user.audio", "EOS in-1 user.audio", "EOS out-1 assistant.text failed", "TEXT_DONE out-1 turn.metrics"],
      );
      // The next turn, on the fresh thread.
      await quiet(ta, 600);
      await speak(ta);
      await quiet(ta, 600);
      await finished(a, 2);
      assert.equal(a.of("in-2").find((e) => e.type === "TEXT_DONE")?.text, "What time is it?");
    } finally {
      a.close();
      await stuck.close();
      delete process.env.PERCH_TEST_STUCK_MARKER;
      rmSync(dirname(marker), { recursive: true, force: true });
    }
  });

  test("a thread that dies while its conversation speaks a reply: that reply fails (its audio stops, failed events); the other thread's reply goes on; the next turn is answered", async () => {
    const a = await rig({}, { threads });
    const b = await rig({}, { threads });
    // Long replies: both are still speaking when the thread dies.
    for (const r of [a, b]) r.model.script = () => pieces(["One two three four five six seven eight nine ten. ", "Eleven twelve thirteen fourteen fifteen."]);
    try {
      const ta = new RtpSender(a, { echo: true });
      const tb = new RtpSender(b, { echo: true });
      for (const tx of [ta, tb]) {
        await speak(tx);
        await quiet(tx, 600);
      }
      const speaking = async (r: Rig) => {
        for (let i = 0; i < 500 && r.frames < 10; i++) {
          await r.wait(20);
          await sleep(1);
        }
        assert.ok(r.frames >= 10, `${r.frames} frames of the reply sent`);
      };
      await speaking(a);
      await speaking(b);
      const dead = a.conversation.uplinkThread;
      assert.notEqual(dead, b.conversation.uplinkThread, "one on each thread");
      await threads.workers[dead]!.terminate();
      await until("a's reply failed", () => a.of("out-1").some((e) => e.type === "EOS" && e.label === "assistant.audio"));
      const eos = a.of("out-1").find((e) => e.type === "EOS" && e.label === "assistant.audio")!;
      assert.equal(eos.error?.code, "failed", JSON.stringify(eos));
      const m = await finished(a, 1);
      assert.equal(m.interrupted, false);
      const framesAtDeath = a.frames;
      // b's reply is unaffected: it goes on to its end.
      const bBefore = b.frames;
      const mb = await finished(b, 1);
      assert.ok(b.frames > bBefore, "b's reply went on");
      assert.equal(b.of("out-1").find((e) => e.type === "EOS" && e.label === "assistant.audio")?.error, undefined, JSON.stringify(mb));
      assert.equal(a.frames, framesAtDeath, "a's audio stopped");
      // a's next turn is heard and answered, its reply encoded on the fresh thread.
      a.model.script = () => pieces(["It is ten o'clock."]);
      await speak(ta);
      await quiet(ta, 600);
      for (let i = 0; i < 500 && !a.turnMetrics(2); i++) {
        await a.wait(20);
        await sleep(1);
      }
      const m2 = a.turnMetrics(2);
      assert.ok(m2 && typeof m2.speech_to_audio === "number", JSON.stringify(m2));
      assert.ok(a.frames > framesAtDeath, "the next reply was spoken");
    } finally {
      a.close();
      b.close();
    }
  });
});
