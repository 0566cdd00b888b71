/**
 * A realtime agent's uplink (voice.md §6) with the RFC 6464 audio level: the silence after the
 * user's speech reaches the model at once (its own detector ends the turn on it), fast: the
 * bridge on a fake clock, a fake realtime server (a real WebSocket server), RTP packets of real Opus.
 */
import { test } from "node:test";
import { Registry } from "prom-client";
import type { ToolKit } from "../src/ai/agents/toolbox.ts";
import { loadResampler } from "../src/audio/resampler.ts";
import { loadConfig } from "../src/config/config.ts";
import { VoiceMetrics } from "../src/voice/metrics.ts";
import { VoiceEvents } from "../src/voice/peer-events.ts";
import { RealtimeBridge } from "../src/voice/realtime/bridge.ts";
import { realtimeAgent, startFakeRealtime } from "./support/fake-realtime.ts";
import { encoded, FakeClock, withLevel } from "./support/fake-voice.ts";
import { rtpPacket } from "./support/rtp-device.ts";

test("a realtime agent hears the silence after speech at once, not held back by the uplink's look-back", async () => {
  const fake = await startFakeRealtime();
  const clock = new FakeClock();
  const config = loadConfig({}, {});
  const bridge = new RealtimeBridge({
    agent: realtimeAgent(`${fake.url.replace(/^http/, "ws")}/realtime?model=m`, { transcription: false }),
    config: config.voice,
    events: new VoiceEvents({ publicKey: "device", payloadType: 111, onPacket: () => {}, sendFrame: () => true, sendEvent: () => true } as never),
    // No tools: the path under test is the audio.
    tools: { definitions: () => [], displayName: (n: string) => n } as unknown as ToolKit,
    toolEvents: () => ({}) as never,
    activity: undefined,
    resampler: await loadResampler(),
    payloadType: 111,
    audioLevelId: 1,
    metrics: new VoiceMetrics(new Registry(), () => 1),
    clock,
    send: () => true,
    log: () => {},
  });
  try {
    await fake.until(() => fake.sessions.some((s) => s.session !== undefined), 10_000, "the session");
    const s = fake.sessions.find((x) => x.session !== undefined)!;
    const quiet = encoded(1, false)[0]!;
    let seq = 0;
    const send = async (payload: Buffer, level: number) => {
      bridge.packet(withLevel(rtpPacket({ sequence: seq, timestamp: seq * 960 }, payload), level));
      seq++;
      await clock.advance(20);
    };
    for (let i = 0; i < 25; i++) await send(quiet, 127);
    for (const p of encoded(30, true)) await send(p, 10);
    // 800 ms of silence after the speech: the model's detector needs it as it comes (server_vad ends on 500 ms of it).
    for (let i = 0; i < 40; i++) await send(quiet, 127);
    // Everything sent is appended (24 kHz), less what the bridge batches (under 40 ms).
    const sent = seq * 480;
    await fake.until(() => s.appended > sent - 960, 5_000, `all ${sent} samples appended (${s.appended} so far)`);
  } finally {
    bridge.close();
    await fake.close();
  }
});
