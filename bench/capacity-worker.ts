/**
 * One process of the capacity benchmark's devices (bench/capacity.ts forks several): light
 * node-datachannel devices (crowd-device.ts) whose audio is pre-encoded Opus in raw RTP packets,
 * one every 20 ms, commanded over the IPC channel. Modes:
 *
 * - `idle`: connected, nothing sent;
 * - `mic`: an open microphone, as the SDK's is: an Opus frame of silence every 20 ms (not DTX);
 * - `talk`: a conversation: the question, then silence while the reply is awaited (the first RTP
 *   packet of the server's after the question's last voiced frame is its first audio; 300 ms
 *   without a packet ends it), a 4 s pause (BENCH_CAPACITY_PAUSE_MS), again. A reply not begun
 *   within 20 s counts as unanswered.
 *
 * Environment: PERCH_URL, PERCH_SERVER_KEY, CROWD_BIND, CAPACITY_AUDIO (the JSON file of frames).
 */
import { readFileSync } from "node:fs";
import { generateKeyPair } from "../src/crypto/keys.ts";
import { AUDIO_LEVEL_ID, CrowdDevice } from "./crowd-device.ts";

export type CapacityCommand =
  | { type: "connect"; count: number; concurrency: number; id: number }
  | { type: "mode"; mode: Mode }
  /** Reports and clears what happened since the last `collect`. */
  | { type: "collect"; id: number }
  | { type: "release"; id: number }
  | { type: "exit" };

export type Mode = "idle" | "mic" | "talk";

export interface CapacityConnected {
  type: "connected";
  id: number;
  ok: number;
  failed: number;
  errors: string[];
}

export interface CapacityCollected {
  type: "collected";
  id: number;
  /** End of speech (the question's last voiced frame sent) → first reply packet received, ms, per answered turn. */
  latencies: number[];
  questions: number;
  unanswered: number;
  packetsSent: number;
  packetsReceived: number;
  open: number;
  lost: number;
}

/** The pre-encoded audio: the question's Opus frames (base64), the index of its last voiced frame, and a frame of silence. */
export interface CapacityAudio {
  question: string[];
  /** Each question frame's level in −dBov (0–127), as an RFC 6464 sender computes it. */
  levels: number[];
  lastVoiced: number;
  silence: string;
}

const FRAME_MS = 20;
const SAMPLES_PER_FRAME = 960;
const PAYLOAD_TYPE = 111;
const REPLY_GAP_MS = 300;
const REPLY_TIMEOUT_MS = 20_000;
const PAUSE_MS = Number(process.env.BENCH_CAPACITY_PAUSE_MS ?? 4000);

const audio = JSON.parse(readFileSync(process.env.CAPACITY_AUDIO!, "utf8")) as CapacityAudio;
const question = audio.question.map((f) => Buffer.from(f, "base64"));
const silence = Buffer.from(audio.silence, "base64");
const baseUrl = process.env.PERCH_URL!;
const serverPublicKey = process.env.PERCH_SERVER_KEY!;
const bindAddress = process.env.CROWD_BIND || undefined;
/** Devices offer the RFC 6464 audio level and send it on every packet, as libwebrtc (the SDK's microphone) does. */
const audioLevel = process.env.BENCH_CAPACITY_AUDIO_LEVEL === "1";

interface Talker {
  device: CrowdDevice;
  sequence: number;
  timestamp: number;
  /** pause → question → awaiting → reply → pause. */
  phase: "pause" | "question" | "awaiting" | "reply";
  frame: number;
  /** When the pause ends, the last voiced frame went, the last reply packet came (performance.now()). */
  nextAt: number;
  voicedAt: number;
  lastPacketAt: number;
  marker: boolean;
}

const talkers = new Set<Talker>();
let mode: Mode = "idle";
let lost = 0;
const counts = { latencies: [] as number[], questions: 0, unanswered: 0, packetsSent: 0, packetsReceived: 0 };

function rtp(t: Talker, payload: Buffer, level: number): Buffer {
  const ext = audioLevel ? 8 : 0;
  const packet = Buffer.allocUnsafe(12 + ext + payload.length);
  packet[0] = audioLevel ? 0x90 : 0x80;
  packet[1] = (t.marker ? 0x80 : 0) | PAYLOAD_TYPE;
  packet.writeUInt16BE(t.sequence, 2);
  packet.writeUInt32BE(t.timestamp >>> 0, 4);
  packet.writeUInt32BE(t.device.ssrc, 8);
  if (audioLevel) {
    // One-byte header extension (RFC 8285): the level element (id, one byte), then padding.
    packet.writeUInt32BE(0xbede0001, 12);
    packet.writeUInt32BE(((AUDIO_LEVEL_ID << 4) << 24) | ((level & 0x7f) << 16), 16);
  }
  payload.copy(packet, 12 + ext);
  t.marker = false;
  t.sequence = (t.sequence + 1) & 0xffff;
  t.timestamp = (t.timestamp + SAMPLES_PER_FRAME) >>> 0;
  return packet;
}

function send(t: Talker, payload: Buffer, level = 127): void {
  try {
    if (t.device.audio.isOpen() && t.device.audio.sendMessageBinary(rtp(t, payload, level))) counts.packetsSent++;
  } catch {}
}

/** The server's packets: RTP of payload type 111 (RTCP shares the track). */
function received(t: Talker, packet: Buffer): void {
  if (packet.length < 12 || packet[0]! >> 6 !== 2 || (packet[1]! >= 200 && packet[1]! <= 204) || (packet[1]! & 0x7f) !== PAYLOAD_TYPE) return;
  counts.packetsReceived++;
  const now = performance.now();
  if (t.phase === "awaiting") {
    counts.latencies.push(now - t.voicedAt);
    t.phase = "reply";
  }
  if (t.phase === "reply") t.lastPacketAt = now;
}

/** What device `t` sends at this frame (nothing, silence or the question's next frame), and its turn's progress. */
function step(t: Talker, now: number): void {
  if (mode === "idle") return;
  if (mode === "talk" && t.phase === "pause" && now >= t.nextAt) {
    t.phase = "question";
    t.frame = 0;
    t.marker = true;
    counts.questions++;
  }
  if (mode === "talk" && t.phase === "question") {
    send(t, question[t.frame]!, audio.levels[t.frame]);
    if (t.frame === audio.lastVoiced) t.voicedAt = performance.now();
    if (++t.frame >= question.length) t.phase = "awaiting";
    return;
  }
  if (mode === "talk" && t.phase === "awaiting" && now - t.voicedAt > REPLY_TIMEOUT_MS) {
    counts.unanswered++;
    pause(t, now);
  } else if (mode === "talk" && t.phase === "reply" && now - t.lastPacketAt > REPLY_GAP_MS) pause(t, now);
  send(t, silence);
}

function pause(t: Talker, now: number): void {
  t.phase = "pause";
  t.nextAt = now + PAUSE_MS;
}

// One ticker for every device: frame k of the process at anchor + 20·k ms; behind by more than 100 ms, the clock starts again.
let anchor = performance.now();
let ticks = 0;
let ticker: NodeJS.Timeout | undefined;
function tick(): void {
  const now = performance.now();
  if (now - (anchor + ticks * FRAME_MS) > 100) {
    anchor = now;
    ticks = 0;
  }
  while (anchor + ticks * FRAME_MS <= now) {
    for (const t of talkers) step(t, now);
    ticks++;
  }
  ticker = setTimeout(tick, Math.max(1, anchor + ticks * FRAME_MS - performance.now()));
}

function setMode(next: Mode): void {
  mode = next;
  const now = performance.now();
  // Conversations start spread over one cycle, so that their questions do not all end at once.
  for (const t of talkers) {
    t.phase = "pause";
    t.nextAt = now + Math.random() * (PAUSE_MS + 3000);
  }
  if (!ticker && next !== "idle") {
    anchor = now;
    ticks = 0;
    tick();
  }
}

async function connectOne(report: CapacityConnected): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      const device = await CrowdDevice.connect({ baseUrl, serverPublicKey, keyPair: generateKeyPair(), bindAddress, timeoutMs: 15_000, audioLevel });
      const t: Talker = {
        device,
        sequence: (Math.random() * 0xffff) | 0,
        timestamp: (Math.random() * 0xffffffff) >>> 0,
        phase: "pause",
        frame: 0,
        nextAt: Number.POSITIVE_INFINITY,
        voicedAt: 0,
        lastPacketAt: 0,
        marker: true,
      };
      device.audio.onMessage((packet) => received(t, packet));
      device.onClosed(() => {
        if (talkers.delete(t)) lost++;
      });
      talkers.add(t);
      report.ok++;
      return;
    } catch (err) {
      if (report.errors.length < 3) report.errors.push((err as Error).message.slice(0, 300));
      if (attempt >= 3) {
        report.failed++;
        return;
      }
    }
  }
}

async function connect(command: Extract<CapacityCommand, { type: "connect" }>): Promise<void> {
  const report: CapacityConnected = { type: "connected", id: command.id, ok: 0, failed: 0, errors: [] };
  let next = 0;
  const lane = async () => {
    while (next < command.count) {
      next++;
      await connectOne(report);
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, command.concurrency) }, lane));
  process.send?.(report);
}

function collect(id: number): CapacityCollected {
  let open = 0;
  for (const t of talkers) if (t.device.open) open++;
  const out: CapacityCollected = { type: "collected", id, ...counts, open, lost };
  counts.latencies = [];
  counts.questions = 0;
  counts.unanswered = 0;
  counts.packetsSent = 0;
  counts.packetsReceived = 0;
  return out;
}

function release(): void {
  mode = "idle";
  for (const t of talkers) t.device.close();
  talkers.clear();
  lost = 0;
}

process.on("message", (command: CapacityCommand) => {
  switch (command.type) {
    case "connect":
      void connect(command);
      break;
    case "mode":
      setMode(command.mode);
      break;
    case "collect":
      process.send?.(collect(command.id));
      break;
    case "release":
      release();
      process.send?.({ type: "released", id: command.id });
      break;
    case "exit":
      release();
      setTimeout(() => process.exit(0), 300);
      break;
  }
});
process.on("disconnect", () => {
  release();
  process.exit(0);
});
