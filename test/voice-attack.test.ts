import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { pino } from "pino";
import type { FliteSpeechEngine } from "../src/ai/speech/index.ts";
import { LibOpus } from "../src/audio/opus.ts";
import { engines, warmRecogniser } from "./support/engines.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { RtpDevice, rtpPacket } from "./support/rtp-device.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { EventLog, resample, talkerConfig } from "./support/voice.ts";
import { connect } from "./support/webrtc.ts";

/**
 * Hostile uplinks over a real connection: a node-datachannel device whose audio track carries
 * RTP of the test's choosing, next to a well-behaved device whose conversation must go on.
 */
describe("voice conversations against a hostile uplink", { skip: engines().transcription ? false : "no transcription engine" }, () => {
  let upstream: FakeUpstream;
  let server: TestServer;
  const lines: Array<{ level: number; msg: string; dropped_ms?: number; peer?: string; result?: string; transcript?: string }> = [];

  before(async () => {
    await warmRecogniser();
    upstream = await startFakeUpstream();
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        for (const line of chunk.toString().split("\n")) if (line) lines.push(JSON.parse(line) as (typeof lines)[number]);
        done();
      },
    });
    server = await startTestServer({
      logger: pino({ level: "debug" }, sink),
      config: talkerConfig(upstream.url),
    });
  });

  after(async () => {
    await server?.stop();
    await upstream?.close();
  });

  test("a device claiming far more audio than real time (sequence and timestamp jumps, 120 ms packets) has it dropped undecoded, logged once; another device's conversation goes on", async () => {
    const attacker = await RtpDevice.connect(server);
    const encoder = new LibOpus("voip");
    const tone = new Int16Array(960).map((_, i) => Math.round(Math.sin(i / 5) * 8000));
    const good = encoder.encode(tone);
    encoder.close();
    // A code-3 packet of 12 SILK frames of 10 ms: 120 ms of audio in 14 bytes.
    const long = Buffer.concat([Buffer.from([0x03, 12]), Buffer.alloc(12)]);
    let sequence = 1000;
    let timestamp = 5000;
    attacker.send(rtpPacket({ sequence, timestamp }, good));
    let claimedMs = 0;
    for (let i = 0; i < 150; i++) {
      // 512 packets missing, and a timestamp that makes no sense: 10 s of concealment claimed.
      sequence += 512;
      timestamp -= 1;
      attacker.send(rtpPacket({ sequence, timestamp }, good));
      claimedMs += 512 * 20;
      // A timestamp 2 s ahead: 2 s of silence claimed.
      sequence += 1;
      timestamp += 96_000;
      attacker.send(rtpPacket({ sequence, timestamp }, good));
      claimedMs += 2000;
      for (let k = 0; k < 5; k++) {
        sequence += 1;
        timestamp += 5760;
        attacker.send(rtpPacket({ sequence, timestamp }, long));
        claimedMs += 120;
      }
      if (i % 10 === 9) await sleep(10);
    }
    const dropped = async () => {
      const text = await (await fetch(`${server.url}/metrics`)).text();
      return Number(/^perch_voice_uplink_dropped_seconds_total (\S+)$/m.exec(text)?.[1] ?? 0);
    };
    // Nearly all of the claimed audio (all but the few seconds the uplink may run ahead) was dropped.
    let seconds = 0;
    for (let i = 0; i < 100 && seconds < (claimedMs / 1000) * 0.9; i++) {
      seconds = await dropped();
      await sleep(100);
    }
    assert.ok(seconds >= (claimedMs / 1000) * 0.9, `dropped ${seconds} s of ${claimedMs / 1000} s claimed`);
    const warnings = lines.filter((l) => l.peer === attacker.publicKey && /ahead of real time/.test(l.msg));
    assert.equal(warnings.length, 1, "logged once, not per packet");

    // Meanwhile a well-behaved device converses as usual.
    upstream.reply({ content: "It is sunny." });
    const conn = await connect(server);
    const log = new EventLog(conn);
    const mic = await conn.microphone();
    const { samples, sampleRate } = await (engines().speech as FliteSpeechEngine).speak("What is the weather like today?", "nova");
    await mic.say(await resample(samples, sampleRate, 48_000));
    await log.wait((s) => s.stream === "out-1" && s.label === "turn.metrics", 30_000, "the other device's reply");
    assert.equal(log.of("out-1").find((s) => s.type === "TEXT_DONE" && s.label === "assistant.text")?.text, "It is sunny.");
    assert.ok((await fetch(`${server.url}/healthz`)).ok);
    conn.close();
    attacker.close();
  });

  test("garbage of every kind on the uplink (each table of contents, random bytes, a new SSRC per packet, broken headers) is logged not per packet, and the same device's speech is answered after it", async () => {
    const device = await RtpDevice.connect(server);
    let sequence = 0;
    let timestamp = 0;
    const next = (payload: Buffer, ssrc?: number) => {
      sequence++;
      timestamp += 960;
      return device.send(rtpPacket({ sequence, timestamp, ...(ssrc ? { ssrc } : {}) }, payload));
    };
    let sent = 0;
    const pace = async () => {
      if (++sent % 100 === 0) await sleep(5);
    };
    for (let toc = 0; toc < 256; toc++) {
      for (const bytes of [1, 2, 3, 40, 1275]) {
        for (const second of [0, 1, 48, 63, 0xff]) {
          const payload = Buffer.alloc(bytes, 0x5a);
          payload[0] = toc;
          if (bytes > 1) payload[1] = second;
          next(payload);
          await pace();
        }
      }
    }
    for (let i = 0; i < 1000; i++) {
      const payload = Buffer.alloc(1 + ((i * 7919) % 1400));
      for (let j = 0; j < payload.length; j++) payload[j] = (i * 31 + j * 17) & 0xff;
      next(payload, i % 2 ? i : undefined);
      const header = Buffer.alloc(12 + (i % 90));
      for (let j = 0; j < header.length; j++) header[j] = (i * 13 + j * 29) & 0xff;
      header[0] = 0x80 | (header[0]! & 0x3f);
      header[1] = (header[1]! & 0x80) | 111;
      device.send(header);
      await pace();
    }
    // Then the device speaks properly: Opus frames of a question, 20 ms apart, continuing its stream.
    upstream.reply({ content: "It is sunny." }, { content: "It is sunny." }, { content: "It is sunny." });
    const { samples, sampleRate } = await (engines().speech as FliteSpeechEngine).speak("What is the weather like today?", "nova");
    const question = await resample(samples, sampleRate, 48_000);
    const speech = new Int16Array(question.length + 48_000);
    speech.set(question);
    const encoder = new LibOpus("voip");
    const started = performance.now();
    for (let f = 0; (f + 1) * 960 <= speech.length; f++) {
      next(encoder.encode(speech.subarray(f * 960, (f + 1) * 960)), 0x1234);
      const due = started + (f + 1) * 20;
      await sleep(Math.max(0, due - performance.now()));
    }
    encoder.close();
    const answered = () => lines.some((l) => l.peer === device.publicKey && l.msg === "voice turn" && l.result === "answered");
    for (let i = 0; i < 150 && !answered(); i++) await sleep(100);
    assert.ok(answered(), "the device's question was answered");
    const heard = lines.filter((l) => l.peer === device.publicKey && l.msg === "voice turn transcript").map((l) => l.transcript);
    assert.ok(
      heard.some((t) => /weather/i.test(t ?? "")),
      `transcripts: ${JSON.stringify(heard)}`,
    );
    const mine = lines.filter((l) => l.peer === device.publicKey && l.level >= 40);
    // At most the overrun notice (120 ms packets of garbage claim more than real time) and nothing per packet.
    assert.ok(mine.length <= 3, `warnings: ${JSON.stringify(mine.map((l) => l.msg))}`);
    assert.ok((await fetch(`${server.url}/healthz`)).ok);
    device.close();
  });
});
