/** Turns recorded as a conversation would record them (test/recordings.test.ts, test/webapp-recordings.test.ts). */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { LibOpus } from "../../src/audio/opus.ts";
import { TurnRecorder } from "../../src/voice/recording.ts";
import { engines } from "./engines.ts";
import type { TestServer } from "./server.ts";
import { resample, talkerConfig } from "./voice.ts";

export const API_KEY = "sk-perch-recordings-test";
const sha256 = (text: string) => createHash("sha256").update(text).digest("hex");

export const ASKED = "please water the tomato plants on the balcony";
export const ANSWERED = "I will water the tomato plants now";

/** A configuration where agent `talker` records its turns (the chat model is never called here). */
export function recordingConfig(databaseUrl: string | undefined, retentionDays = 3, upstreamUrl = "http://127.0.0.1:9/v1") {
  const base = talkerConfig(upstreamUrl);
  return {
    ...base,
    ...(databaseUrl ? { database_url: databaseUrl } : {}),
    api_keys: [{ name: "ops", sha256: sha256(API_KEY) }],
    agents: base.agents.map((a) => ({ ...a, record: { audio: true, retention_days: retentionDays } })),
    voice: { ...base.voice, store_transcripts: true },
  };
}

/** The user's words at 16 kHz (flite's nova), and the reply's as 20 ms Opus frames at 48 kHz (the embedded voice), as a conversation would send them. */
export async function sides(): Promise<{ user: Int16Array; reply: Buffer[] }> {
  const speech = engines().speech as unknown as { speak(t: string, v: string): Promise<{ samples: Int16Array; sampleRate: number }> };
  const asked = await speech.speak(ASKED, "nova");
  const user = await resample(asked.samples, asked.sampleRate, 16_000);
  const { samples, sampleRate } = await speech.speak(ANSWERED, "alloy");
  const at48 = await resample(samples, sampleRate, 48_000);
  const encoder = new LibOpus("voip", 48_000);
  encoder.setBitrate(32_000);
  const reply: Buffer[] = [];
  for (let at = 0; at + 960 <= at48.length; at += 960) reply.push(encoder.encode(at48.subarray(at, at + 960)));
  encoder.close();
  return { user, reply };
}

/**
 * One stored turn of the device's conversation with both sides recorded: the domain's conversation
 * and the recorder hear what a conversation would tell them (its audio, its frames and its events).
 */
export async function recordTurn(
  server: TestServer,
  key: string,
  said: { user: Int16Array; reply: Buffer[] },
  o: { metrics?: Record<string, unknown> | false; tool?: { name: string; is_error: boolean } } = {},
): Promise<string> {
  // Every recording's bytes differ from every other's (the erasure test looks for them): the speech starts a few
  // samples later each time (its frames cut elsewhere), with a little noise of its own.
  const user = said.user.subarray(1 + Math.floor(Math.random() * 300));
  const audio = { ...said, user: Int16Array.from(user, (s) => Math.max(-32768, Math.min(32767, s + Math.round((Math.random() - 0.5) * 16)))) };
  const errors: unknown[] = [];
  const conversation = server.domain.conversations.open(key, (err) => errors.push(err));
  const recorder = new TurnRecorder({
    policy: () => ({ retentionDays: 3 }),
    store: (r) => conversation.recording(r.turn, r.side, r.audio, r.durationMs, r.retentionDays),
    metrics: (turn, json) => conversation.metrics(turn, json),
    warn: (err) => errors.push(err),
  });
  recorder.silence(8_000);
  recorder.heard(audio.user.subarray(0, 3_200));
  recorder.event({ type: "bos", streamId: "in-1", kind: "audio", label: "user.audio", mimeType: "" });
  recorder.heard(audio.user.subarray(3_200));
  recorder.silence(6_400);
  recorder.event({ type: "eos", streamId: "in-1", kind: "audio", label: "user.audio" });
  conversation.add({ turn: 1, role: "user", text: ASKED });
  if (o.tool) conversation.add({ turn: 1, role: "tool", text: "", tool: o.tool });
  recorder.event({ type: "bos", streamId: "out-1", kind: "text", label: "assistant.text", mimeType: "" });
  for (const frame of audio.reply) recorder.sent(frame);
  recorder.event({ type: "eos", streamId: "out-1", kind: "audio", label: "assistant.audio" });
  // Heard after the reply: not part of either side.
  recorder.heard(audio.user);
  conversation.add({ turn: 1, role: "assistant", text: ANSWERED });
  if (o.metrics !== false) {
    recorder.event({
      type: "done",
      streamId: "out-1",
      label: "turn.metrics",
      text: JSON.stringify(o.metrics ?? { end_of_speech: 412.5, transcription: 180, interrupted: false }),
    });
  }
  recorder.close();
  await recorder.settled();
  conversation.close();
  await conversation.settled();
  assert.deepEqual(errors, []);
  return conversation.id;
}
