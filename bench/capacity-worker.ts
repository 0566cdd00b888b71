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
import { generateKeyPair } from "../src/crypto/keys.ts";
import { AUDIO_LEVEL_ID, CrowdDevice } from "./crowd-device.ts";
import { capacityAudio, FrameTicker, PAYLOAD_TYPE, RtpOut, reply, serveCommands, serverOfWorker } from "./device-worker.ts";

export type { CapacityAudio } from "./device-worker.ts";

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

const REPLY_GAP_MS = 300;
const REPLY_TIMEOUT_MS = 20_000;
const PAUSE_MS = Number(process.env.BENCH_CAPACITY_PAUSE_MS ?? 4000);

const { audio, question, silence } = capacityAudio();
const { baseUrl, serverPublicKey, bindAddress } = serverOfWorker();
/** Devices offer the RFC 6464 audio level and send it on every packet, as libwebrtc (the SDK's microphone) does. */
const audioLevel = process.env.BENCH_CAPACITY_AUDIO_LEVEL === "1";

interface Talker {
  device: CrowdDevice;
  rtp: RtpOut;
  /** pause → question → awaiting → reply → pause. */
  phase: "pause" | "question" | "awaiting" | "reply";
  frame: number;
  /** When the pause ends, the last voiced frame went, the last reply packet came (performance.now()). */
  nextAt: number;
  voicedAt: number;
  lastPacketAt: number;
}

const talkers = new Set<Talker>();
let mode: Mode = "idle";
let lost = 0;
const counts = { latencies: [] as number[], questions: 0, unanswered: 0, packetsSent: 0, packetsReceived: 0 };

function send(t: Talker, payload: Buffer, level = 127): void {
  try {
    const packet = t.rtp.packet(t.device.ssrc, payload, audioLevel ? { id: AUDIO_LEVEL_ID, dbov: level } : undefined);
    if (t.device.audio.isOpen() && t.device.audio.sendMessageBinary(packet)) counts.packetsSent++;
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
    t.rtp.marker = true;
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

const ticker = new FrameTicker((now) => {
  for (const t of talkers) step(t, now);
});

function setMode(next: Mode): void {
  mode = next;
  const now = performance.now();
  // Conversations start spread over one cycle, so that their questions do not all end at once.
  for (const t of talkers) {
    t.phase = "pause";
    t.nextAt = now + Math.random() * (PAUSE_MS + 3000);
  }
  if (next !== "idle") ticker.start();
}

async function connectOne(report: CapacityConnected): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      const device = await CrowdDevice.connect({ baseUrl, serverPublicKey, keyPair: generateKeyPair(), bindAddress, timeoutMs: 15_000, audioLevel });
      const t: Talker = {
        device,
        rtp: new RtpOut(),
        phase: "pause",
        frame: 0,
        nextAt: Number.POSITIVE_INFINITY,
        voicedAt: 0,
        lastPacketAt: 0,
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
  reply(report);
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

serveCommands<CapacityCommand>((command) => {
  switch (command.type) {
    case "connect":
      void connect(command);
      break;
    case "mode":
      setMode(command.mode);
      break;
    case "collect":
      reply(collect(command.id));
      break;
  }
}, release);
