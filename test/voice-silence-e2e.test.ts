/**
 * Silence that costs nothing, end to end (issue 41): a device on the SDK (libwebrtc, which sends
 * the RTP audio level once the answer accepts it) and a device that sends DTX in its pauses both
 * converse, and the first word after a long silence is in the transcript. The fast layer is
 * voice-silence.test.ts.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import wrtc from "@roamhq/wrtc";
import { LibOpus } from "../src/audio/opus.ts";
import { Answerer } from "../src/transport/answerer.ts";
import { warmRecogniser } from "./support/engines.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { RtpDevice, rtpPacket } from "./support/rtp-device.ts";
import { freeUdpPort, startTestServer, type TestServer } from "./support/server.ts";
import { spoken, talkerConfig, voiceDevice } from "./support/voice.ts";
import { answeredBy, eventually } from "./support/webrtc.ts";

const QUESTION = "What is the weather like today?";
const FRAME = 960;

describe("silence that costs nothing, end to end", () => {
  let upstream: FakeUpstream;
  let server: TestServer;

  /** Uplink packets the node counted, by decoding (`decoded` or `silent`). */
  async function packets(): Promise<{ decoded: number; silent: number }> {
    const text = await (await fetch(`${server.url}/metrics`)).text();
    const count = (label: string) => Number(new RegExp(`^perch_voice_uplink_packets_total\\{decoding="${label}"\\} (\\S+)$`, "m").exec(text)?.[1] ?? 0);
    return { decoded: count("decoded"), silent: count("silent") };
  }

  /** The user's words the model was asked about, once it was. */
  async function asked(what: RegExp): Promise<string> {
    return eventually(
      () =>
        upstream.received
          .flatMap((r) => (r.body.messages as Array<{ role: string; content: string }> | undefined) ?? [])
          .find((m) => m.role === "user" && what.test(m.content))?.content,
      60_000,
      `the model asked about ${what}`,
    );
  }

  before(async () => {
    await warmRecogniser();
    upstream = await startFakeUpstream();
    server = await startTestServer({ config: talkerConfig(upstream.url) });
  });

  after(async () => {
    await server?.stop();
    await upstream?.close();
  });

  test("a device that sends its audio level: its silence is not decoded, and after 4 s of it the first word is in the transcript", async () => {
    upstream.reply({ content: "It is sunny." });
    const question = await spoken(QUESTION);
    const { conn, log } = await voiceDevice(server);
    try {
      const mic = await conn.microphone();
      const before = await packets();
      // The microphone is open and sends silence meanwhile, as a device's does.
      await sleep(4_000);
      const silent = await eventually(
        async () => {
          const now = await packets();
          return now.silent - before.silent >= 100 ? now : undefined;
        },
        10_000,
        "the silence counted as silent packets",
      );
      assert.ok(silent.decoded - before.decoded < 20, `${silent.decoded - before.decoded} packets of silence decoded`);
      await mic.say(question);
      const transcript = await log.wait((s) => s.stream === "in-1" && s.type === "TEXT_DONE" && s.label === "user.transcript", 60_000, "the transcript");
      assert.match(transcript.text ?? "", /^what\b/i, `the first word heard: ${transcript.text}`);
      await log.wait((s) => s.stream === "out-1" && s.type === "BOS" && s.label === "assistant.audio", 30_000, "the reply's audio");
    } finally {
      conn.close();
    }
  });

  test("a device that sends DTX in its pauses converses: the pauses are not decoded, its question is heard from its first word", async () => {
    upstream.reply({ content: "It is sunny." });
    const question = await spoken(QUESTION);
    const encoder = new LibOpus("voip");
    const frames: Buffer[] = [];
    try {
      encoder.setBitrate(32_000);
      for (let at = 0; at + FRAME <= question.length; at += FRAME) frames.push(encoder.encode(question.subarray(at, at + FRAME)));
    } finally {
      encoder.close();
    }
    const device = await RtpDevice.connect(server);
    try {
      // Its conversation hears packets once the connection is active (the event stream's activation,
      // a store write, can take seconds at load): packets sent before are not the uplink's to count.
      await eventually(() => server.transport!.connection(device.publicKey)?.active, 30_000, "the device's connection active");
      let sequence = 1;
      let timestamp = 0;
      let due = performance.now();
      /** One packet at its time (real time: the node drops audio ahead of it). */
      const send = async (payload: Buffer, samples: number) => {
        const wait = due - performance.now();
        if (wait > 0) await sleep(wait);
        device.send(rtpPacket({ sequence: sequence++, timestamp }, payload));
        timestamp += samples;
        due += (samples / 48_000) * 1000;
      };
      // DTX as libopus and libwebrtc do it: a packet of the table of contents alone every 400 ms.
      const dtx = Buffer.from([frames[0]![0]! & 0xfc]);
      // Its conversation's uplink opens a moment after the connection is active (seconds at load: CI
      // once counted fewer than the 13 silent packets below): DTX until one is counted, then measure.
      const start = await packets();
      await eventually(
        async () => {
          await send(dtx, 400 * 48);
          return (await packets()).silent > start.silent;
        },
        30_000,
        "a first DTX packet counted as silent",
      );
      const before = await packets();
      for (let i = 0; i < 8; i++) await send(dtx, 400 * 48);
      for (const f of frames) await send(f, FRAME);
      for (let i = 0; i < 5; i++) await send(dtx, 400 * 48);
      const words = await asked(/weather/i);
      assert.match(words, /^what\b/i, `the first word heard: ${words}`);
      const after = await eventually(
        async () => {
          const now = await packets();
          return now.silent - before.silent >= 13 ? now : undefined;
        },
        10_000,
        "the DTX packets counted as silent",
      );
      assert.ok(after.decoded - before.decoded <= frames.length, "no more decoded than the speech's packets");
    } finally {
      device.close();
    }
  });

  test("the answer accepts the audio level only when the device offered it, under the device's id", async () => {
    const answerer = new Answerer({ udpPort: await freeUdpPort(), bindAddress: "127.0.0.1", publicAddress: undefined, gatherTimeoutMs: 5_000 });
    await answerer.hold();
    try {
      const cases = [
        { edit: (sdp: string) => sdp.replace(/a=extmap:1 (urn:ietf:params:rtp-hdrext:ssrc-audio-level)/, "a=extmap:5 $1"), id: 5 },
        { edit: (sdp: string) => sdp.replace(/a=extmap:\d+ urn:ietf:params:rtp-hdrext:ssrc-audio-level\r\n/, ""), id: undefined },
      ];
      for (const c of cases) {
        const pc = new wrtc.RTCPeerConnection({ iceServers: [] });
        pc.addTransceiver("audio", { direction: "sendrecv" });
        pc.createDataChannel("giznet/v1/packet");
        try {
          const link = await answeredBy(answerer, pc, () => {}, { from: "127.0.0.1", edit: c.edit });
          assert.equal(link.audio.audioLevelId, c.id);
          const lines = link.answer.split("\r\n").filter((l) => l.includes("ssrc-audio-level"));
          assert.deepEqual(lines, c.id === undefined ? [] : [`a=extmap:${c.id} urn:ietf:params:rtp-hdrext:ssrc-audio-level`]);
          link.close();
        } finally {
          pc.close();
        }
      }
    } finally {
      answerer.release();
    }
  });
});
