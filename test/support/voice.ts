import type { FliteSpeechEngine } from "../../src/ai/speech/index.ts";
import { loadResampler, Resampler } from "../../src/audio/resampler.ts";
import type { KeyPair } from "../../src/crypto/keys.ts";
import type { PeerEvent } from "../../src/protocol/gen/event_pb.ts";
import { PeerEventType, StreamKind } from "../../src/protocol/gen/event_pb.ts";
import type { PerchConnection } from "../../src/sdk/webrtc.ts";
import { engines } from "./engines.ts";
import { connect, eventually } from "./webrtc.ts";

/** A voice event in a form tests compare. */
export interface Seen {
  type: "BOS" | "EOS" | "TEXT_DELTA" | "TEXT_DONE";
  stream: string;
  label: string;
  kind?: "TEXT" | "AUDIO" | "OTHER";
  text?: string;
  error?: { code: string; message: string };
  sequence: number;
  mime?: string;
}

export function seen(e: PeerEvent): Seen | undefined {
  const p = e.payload;
  const kind = (k: number) => (k === StreamKind.TEXT ? "TEXT" : k === StreamKind.AUDIO ? "AUDIO" : "OTHER");
  if (p.case === "bos" && e.type === PeerEventType.BOS)
    return {
      type: "BOS",
      stream: p.value.streamId,
      label: p.value.label,
      kind: kind(p.value.kind),
      sequence: Number(p.value.sequence),
      mime: p.value.mimeType,
    };
  if (p.case === "eos" && e.type === PeerEventType.EOS) {
    const s: Seen = { type: "EOS", stream: p.value.streamId, label: p.value.label, kind: kind(p.value.kind), sequence: Number(p.value.sequence) };
    if (p.value.error) s.error = { code: p.value.error.code, message: p.value.error.message };
    return s;
  }
  if (p.case === "textDelta")
    return { type: "TEXT_DELTA", stream: p.value.streamId, label: p.value.label, text: p.value.text, sequence: Number(p.value.sequence) };
  if (p.case === "textDone")
    return { type: "TEXT_DONE", stream: p.value.streamId, label: p.value.label, text: p.value.text, sequence: Number(p.value.sequence) };
  return undefined;
}

/** Every voice event the device receives, in order, with a way to wait for one. */
export class EventLog {
  readonly all: Seen[] = [];
  private waiters: Array<{ match: (s: Seen) => boolean; resolve: (s: Seen) => void }> = [];

  constructor(conn: PerchConnection) {
    conn.eventStream.on((e) => {
      const s = seen(e);
      if (!s) return;
      this.all.push(s);
      this.waiters = this.waiters.filter((w) => {
        if (!w.match(s)) return true;
        w.resolve(s);
        return false;
      });
    });
  }

  /** Resolves with the first event (seen already or to come) that matches. */
  wait(match: (s: Seen) => boolean, ms = 30_000, what = "an event"): Promise<Seen> {
    const found = this.all.find(match);
    if (found) return Promise.resolve(found);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`timed out waiting for ${what}; seen: ${JSON.stringify(this.all.map((s) => [s.type, s.stream, s.label]))}`)),
        ms,
      );
      this.waiters.push({
        match,
        resolve: (s) => {
          clearTimeout(timer);
          resolve(s);
        },
      });
    });
  }

  of(stream: string): Seen[] {
    return this.all.filter((s) => s.stream === stream);
  }
}

/** Resamples a whole piece of 16-bit audio. */
export async function resample(pcm: Int16Array, from: number, to: number): Promise<Int16Array> {
  if (from === to) return pcm;
  const r = new Resampler(await loadResampler(), from, to);
  try {
    // The filter's tail comes out with a little silence after the audio.
    const padded = new Int16Array(pcm.length + Math.ceil(from / 50));
    padded.set(pcm);
    return r.process(padded);
  } finally {
    r.close();
  }
}

/** A server configuration where devices converse with agent `talker` over the scripted upstream at `upstreamUrl`. */
export function talkerConfig(upstreamUrl: string) {
  return {
    providers: [{ id: "local", kind: "openai-compatible" as const, base_url: upstreamUrl, max_retries: 0 }],
    models: [{ id: "chat", kind: "chat" as const, provider: "local", upstream_model: "scripted" }],
    agents: [{ id: "talker", model: "chat", instructions: "You speak briefly.", voice: "alloy" }],
    // A turn's reply may start up to a minute late before it is refused `overloaded` (2 s by
    // default): a busy CI machine must not turn a test about something else into one about
    // admission. The admission tests set their own.
    // These tests script the model's replies in the order of its requests: a reply prepared in a
    // pause inside a sentence (voice.md §7) would take one. Preemptive replies are tested in
    // voice-turn-taking*.test.ts.
    voice: { agent: "talker", max_reply_delay_ms: 60_000, turn: { preemptive: false } },
  };
}

/** `text` as a device's microphone gives it: synthesised by flite (by default another voice than the replies'), at 48 kHz. */
export async function spoken(text: string, voice = "nova"): Promise<Int16Array> {
  const { samples, sampleRate } = await (engines().speech as FliteSpeechEngine).speak(text, voice);
  return resample(samples, sampleRate, 48_000);
}

/** A device connected to `server` (a device SDK client on real WebRTC), its voice events logged and its microphone on. */
export async function voiceDevice(server: { url: string }, o: { keyPair?: KeyPair } = {}): Promise<{ conn: PerchConnection; log: EventLog }> {
  const conn = await connect(server, o.keyPair ? { keyPair: o.keyPair } : {});
  const log = new EventLog(conn);
  await conn.microphone();
  return { conn, log };
}

/**
 * Resolves once the device has heard `ms` of audible reply from now (first to last audible block): a barge-in
 * then interrupts words already heard, however late a loaded machine started the audio.
 */
export async function heardFor(conn: PerchConnection, ms: number): Promise<void> {
  const { speaker } = conn;
  speaker.mark(); // Audio of an earlier reply does not count.
  await eventually(
    () => speaker.firstAudibleAt !== undefined && (speaker.lastAudibleAt ?? 0) - speaker.firstAudibleAt >= ms,
    30_000,
    `${ms} ms of the reply heard`,
  );
}
