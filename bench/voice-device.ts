/**
 * One process of the voice benchmark (`bench/voice.ts` forks several): DEVICES devices on
 * `@roamhq/wrtc`, each speaking the question (PCM from QUESTION_FILE) TURNS times, or, in mode
 * `barge`, interrupting each reply. Reports every measurement over IPC, then exits.
 *
 * Environment: PERCH_URL, QUESTION_FILE, DEVICES, TURNS, MODE (turns | barge | filler), START_DELAY_MS (between
 * this process's devices), START_OFFSET_MS (before the first), PRIVATE_KEYS (the devices' keys, hex, comma-separated; default new ones).
 * Mode `filler` (voice.md §7): the device asks for a story (STORY_FILE) and says a backchannel
 * (FILLER_FILE) a second into its audio.
 */
import { readFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { generateKeyPair, keyPairFromPrivate } from "../src/crypto/keys.ts";
import { PeerEventType } from "../src/protocol/gen/event_pb.ts";
import { PerchConnection } from "../src/sdk/webrtc.ts";

export interface TurnReport {
  type: "turn";
  /** From turn.metrics (measured at the server). */
  server: Record<string, number | boolean | string>;
  /** Last voiced sample handed to the device's stack → first audible sample heard, ms. */
  device_ms: number | undefined;
  /** A stamping fake realtime model's speech_stopped (the reply text's `t=`) → first audible sample heard, ms. */
  stopped_to_heard_ms?: number | undefined;
}
export interface BargeReport {
  type: "barge";
  /** Onset of the interrupting speech handed to the stack → last audible sample of the reply heard, ms. */
  onset_to_silence_ms: number | undefined;
  /** Onset → the interrupted reply's EOS, stamped by the server as its last audio packet went out (one machine, one wall clock). */
  onset_to_last_packet_ms: number | undefined;
  /**
   * Onset (the interrupting speech's first voiced block handed to the stack) → the reply's audio paused at the
   * device: its last audible block before a gap of more than PAUSE_GAP_MS (voice.md §7 "Interruptions", §2's 250 ms).
   */
  onset_to_reply_paused_ms?: number | undefined;
  /** That gap's length (up to the report; long: the pause, not a breath in the reply). */
  reply_pause_gap_ms?: number | undefined;
  interrupted: boolean;
}
export interface FillerReport {
  type: "filler";
  /** The reply was cut by the filler (a barge-in) rather than resumed. */
  interrupted: boolean;
  /** turn.metrics `false_interruptions` of the reply (absent before voice.md §7: 0). */
  false_interruptions: number;
}
export type DeviceMessage = TurnReport | BargeReport | FillerReport | { type: "ready" } | { type: "done" } | { type: "error"; message: string };

const send = (m: DeviceMessage) => process.send?.(m);
process.on("disconnect", () => process.exit(0));

const url = process.env.PERCH_URL!;
const raw = readFileSync(process.env.QUESTION_FILE!);
const question = new Int16Array(raw.buffer, raw.byteOffset, raw.byteLength / 2);
const devices = Number(process.env.DEVICES ?? 1);
const turns = Number(process.env.TURNS ?? 5);
const mode = process.env.MODE ?? "turns";
const pcmFile = (name: string | undefined) => {
  if (!name) return new Int16Array(0);
  const b = readFileSync(name);
  return new Int16Array(b.buffer, b.byteOffset, b.byteLength / 2);
};
const story = pcmFile(process.env.STORY_FILE);
const filler = pcmFile(process.env.FILLER_FILE);
/** A gap in the reply's audible blocks longer than this is the device no longer hearing it. */
const PAUSE_GAP_MS = 100;

/** The last audible block (times: performance.now(), ascending) before the first gap > PAUSE_GAP_MS that begins at or after `onset`. */
function pausedAt(times: number[], onset: number, end: number): { at: number; gap: number } {
  const after = times.filter((t) => t >= onset);
  if (after.length === 0) return { at: onset, gap: end - onset };
  for (let i = 0; i < after.length; i++) {
    const next = after[i + 1] ?? end;
    if (next - after[i]! > PAUSE_GAP_MS) return { at: after[i]!, gap: next - after[i]! };
  }
  return { at: after.at(-1)!, gap: 0 };
}

/** Resolves with the next event matching `match` (label and type). */
function next(
  conn: PerchConnection,
  match: (e: { type: number; stream: string; label: string; text?: string }) => boolean,
  ms = 60_000,
): Promise<{ text?: string; timestampUnixMs?: bigint | number }> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      off();
      reject(new Error("no event in time"));
    }, ms);
    const off = conn.eventStream.on((e) => {
      const v = e.payload.value as { streamId: string; label: string; text?: string } | undefined;
      if (!v || !match({ type: e.type, stream: v.streamId, label: v.label, ...(v.text !== undefined ? { text: v.text } : {}) })) return;
      clearTimeout(timer);
      off();
      resolve(v);
    });
  });
}

async function conversation(index: number): Promise<void> {
  await sleep(Number(process.env.START_OFFSET_MS ?? 0) + index * Number(process.env.START_DELAY_MS ?? 150));
  // PRIVATE_KEYS (hex, comma-separated): the devices' own keys, for devices registered beforehand.
  const own = process.env.PRIVATE_KEYS?.split(",")[index];
  const keyPair = own ? keyPairFromPrivate(Buffer.from(own, "hex")) : generateKeyPair();
  const conn = await PerchConnection.connect({ baseUrl: url, keyPair, timeoutMs: 30_000 });
  const mic = await conn.microphone();
  await sleep(500);
  try {
    let turn = 1;
    for (let n = 1; n <= turns; n++) {
      // Conversations take turns at their own pace.
      await sleep(300 + Math.random() * 700);
      if (mode === "filler") {
        const t = turn;
        const audio = next(conn, (e) => e.type === PeerEventType.BOS && e.stream === `out-${t}` && e.label === "assistant.audio");
        const metrics = next(conn, (e) => e.type === PeerEventType.TEXT_DONE && e.stream === `out-${t}` && e.label === "turn.metrics");
        // The filler's own turn, if it becomes one (a barge-in).
        const after = next(conn, (e) => e.type === PeerEventType.TEXT_DONE && e.stream === `out-${t + 1}` && e.label === "turn.metrics");
        after.catch(() => {});
        await mic.say(story);
        await audio;
        await sleep(1000);
        await mic.say(filler);
        const m = JSON.parse((await metrics).text ?? "{}") as { interrupted?: boolean; false_interruptions?: number };
        if (m.interrupted) {
          await after.catch(() => undefined);
          turn += 2;
        } else turn += 1;
        send({ type: "filler", interrupted: m.interrupted === true, false_interruptions: m.false_interruptions ?? 0 });
        await sleep(1500);
        continue;
      }
      if (mode === "barge") {
        const n1 = 2 * n - 1;
        const audio = next(conn, (e) => e.type === PeerEventType.BOS && e.stream === `out-${n1}` && e.label === "assistant.audio");
        const end = next(conn, (e) => e.type === PeerEventType.EOS && e.stream === `out-${n1}` && e.label === "assistant.audio");
        await mic.say(question);
        await audio;
        await sleep(700);
        // Every audible block from here on, to find when the reply stopped being heard.
        const audible: number[] = [];
        const speaker = conn.speaker;
        const block = speaker.block.bind(speaker);
        speaker.block = (samples, rate) => {
          const before = speaker.lastAudibleAt;
          block(samples, rate);
          if (speaker.lastAudibleAt !== before && speaker.lastAudibleAt !== undefined) audible.push(speaker.lastAudibleAt);
        };
        const onsetUnixMs = Date.now();
        const onset = performance.now();
        mic.firstVoicedAt = undefined;
        const said = mic.say(question);
        const eos = await end.then(
          (e) => e,
          () => undefined,
        );
        await sleep(300);
        speaker.block = block;
        const last = conn.speaker.lastAudibleAt;
        const voiced = mic.firstVoicedAt;
        const paused = voiced !== undefined ? pausedAt(audible, voiced, performance.now()) : undefined;
        send({
          type: "barge",
          onset_to_silence_ms: last !== undefined && last > onset ? last - onset : 0,
          onset_to_last_packet_ms: eos?.timestampUnixMs !== undefined ? Number(eos.timestampUnixMs) - onsetUnixMs : undefined,
          onset_to_reply_paused_ms: paused && voiced !== undefined ? paused.at - voiced : undefined,
          reply_pause_gap_ms: paused?.gap,
          interrupted: eos !== undefined,
        });
        await said;
        await next(conn, (e) => e.type === PeerEventType.TEXT_DONE && e.stream === `out-${n1 + 1}` && e.label === "turn.metrics");
        await sleep(3000);
        continue;
      }
      const metrics = next(conn, (e) => e.type === PeerEventType.TEXT_DONE && e.stream === `out-${n}` && e.label === "turn.metrics");
      const firstText = next(conn, (e) => e.type === PeerEventType.TEXT_DELTA && e.stream === `out-${n}` && e.label === "assistant.text").catch(
        () => ({}) as { text?: string },
      );
      conn.speaker.mark();
      await mic.say(question);
      const lastVoiced = mic.lastVoicedAt;
      const m = await metrics;
      // The reply's last packets are still playing: wait for silence before the next question.
      for (let i = 0; i < 100 && conn.speaker.lastAudibleAt !== undefined && performance.now() - conn.speaker.lastAudibleAt < 400; i++) await sleep(50);
      const heard = conn.speaker.firstAudibleAt;
      const stamp = /^t=(\d+)/.exec((await firstText).text ?? "");
      // performance.now() of the first audible sample as wall-clock time (the fake is another process on this machine).
      const heardUnix = heard !== undefined ? Date.now() - (performance.now() - heard) : undefined;
      send({
        type: "turn",
        server: JSON.parse(m.text ?? "{}") as Record<string, number | boolean | string>,
        device_ms: heard !== undefined && lastVoiced !== undefined && heard > lastVoiced ? heard - lastVoiced : undefined,
        ...(stamp && heardUnix !== undefined ? { stopped_to_heard_ms: heardUnix - Number(stamp[1]) } : {}),
      });
    }
  } finally {
    conn.close();
  }
}

send({ type: "ready" });
const results = await Promise.allSettled(Array.from({ length: devices }, (_, i) => conversation(i)));
for (const r of results) if (r.status === "rejected") send({ type: "error", message: String((r.reason as Error)?.message ?? r.reason) });
send({ type: "done" });
await sleep(100);
process.exit(0);
