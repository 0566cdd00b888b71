/**
 * One process of the fleet benchmark's devices (bench/fleet.ts forks several): the capacity
 * benchmark's light devices (crowd-device.ts: node-datachannel, pre-encoded Opus in RTP), each kept
 * connected through the balancer by the SDK's `StayConnected` layer, conversing: the question, the
 * reply awaited, a pause, again. What each sees is counted from the server's voice events:
 *
 * - a reply cut: the reply's audio (`BOS assistant.audio`) began and the connection ended before
 *   its `EOS`, or the `EOS` came with an error;
 * - a turn lost: a question spoken whose turn (`turn.metrics`) never came (the connection ended,
 *   or 20 s passed);
 * - the time from `node.reconnect` to connected again, from a lost connection to connected again,
 *   and the longest time a device was without a node.
 *
 * Environment: FLEET_URL (the balancer), PERCH_SERVER_KEY, CROWD_BIND, CAPACITY_AUDIO.
 */
import { generateKeyPair } from "../src/crypto/keys.ts";
import { StayConnected } from "../src/sdk/reconnect.ts";
import { CrowdDevice } from "./crowd-device.ts";
import { capacityAudio, FrameTicker, RtpOut, reply, serveCommands, serverOfWorker } from "./device-worker.ts";

export type FleetCommand =
  | { type: "connect"; count: number; id: number }
  | { type: "talk" }
  | { type: "collect"; id: number }
  /** How many devices are connected now (nothing reset). */
  | { type: "status"; id: number }
  | { type: "exit" };

export interface FleetCollected {
  type: "collected";
  id: number;
  questions: number;
  /** Questions whose connection ended while they were being spoken. */
  questionsCut: number;
  answered: number;
  /** Replies heard whole (`EOS assistant.audio` without an error): what the device was given. */
  replies: number;
  cut: number;
  /** Of `cut`: the connection ended during the reply (the others were interrupted by speech over them). */
  cutByClose: number;
  /** Replies that ended failed (the node overloaded or its provider failing): not the fleet's doing. */
  failed: number;
  lost: number;
  /** ms: node.reconnect → connected again. */
  handOver: number[];
  /** Unix ms of each connection made again after one was lost. */
  backAt: number[];
  /** ms: a connection lost (not handed over) → connected again. */
  back: number[];
  /** ms: the longest a device was without a connection. */
  longestWithout: number;
  open: number;
  refused: number;
}

const TURN_TIMEOUT_MS = 20_000;
const PAUSE_MS = Number(process.env.BENCH_FLEET_PAUSE_MS ?? 3000);

const { question, silence } = capacityAudio();
const { baseUrl, serverPublicKey, bindAddress } = serverOfWorker("FLEET_URL");

interface Talker {
  stay: StayConnected<CrowdDevice>;
  device: CrowdDevice | undefined;
  rtp: RtpOut;
  phase: "pause" | "question" | "awaiting";
  frame: number;
  nextAt: number;
  askedAt: number;
  inReply: boolean;
  handedOverAt: number | undefined;
  lostAt: number | undefined;
}

const talkers: Talker[] = [];
let talking = false;
const counts = {
  cutByClose: 0,
  questions: 0,
  questionsCut: 0,
  answered: 0,
  replies: 0,
  cut: 0,
  failed: 0,
  lost: 0,
  handOver: [] as number[],
  backAt: [] as number[],
  back: [] as number[],
  longestWithout: 0,
  refused: 0,
};

function send(t: Talker, payload: Buffer): void {
  const d = t.device;
  if (!d) return;
  try {
    if (d.audio.isOpen()) d.audio.sendMessageBinary(t.rtp.packet(d.ssrc, payload));
  } catch {}
}

function pause(t: Talker, now: number): void {
  t.phase = "pause";
  t.nextAt = now + PAUSE_MS * (0.5 + Math.random());
}

function step(t: Talker, now: number): void {
  if (!talking || !t.device) return;
  if (t.phase === "pause" && now >= t.nextAt) {
    t.phase = "question";
    t.frame = 0;
  }
  if (t.phase === "question") {
    send(t, question[t.frame]!);
    if (++t.frame >= question.length) {
      t.phase = "awaiting";
      t.askedAt = now;
      counts.questions++;
    }
    return;
  }
  if (t.phase === "awaiting" && now - t.askedAt > TURN_TIMEOUT_MS) {
    counts.lost++;
    pause(t, now);
  }
  send(t, silence);
}

/** The connection ended: a reply under way was cut, a question awaiting its turn is lost. */
function ended(t: Talker): void {
  const now = performance.now();
  if (t.inReply) {
    counts.cut++;
    counts.cutByClose++;
  }
  if (t.phase === "awaiting") counts.lost++;
  // A question cut while being spoken (before the server heard it as speech) is asked again by its user: counted apart.
  if (t.phase === "question" && t.frame > 0) counts.questionsCut++;
  t.inReply = false;
  t.device = undefined;
  t.lostAt = now;
  pause(t, now);
}

function add(): void {
  const t: Talker = {
    device: undefined,
    rtp: new RtpOut(),
    phase: "pause",
    frame: 0,
    nextAt: Number.POSITIVE_INFINITY,
    askedAt: 0,
    inReply: false,
    handedOverAt: undefined,
    lostAt: undefined,
    stay: undefined as unknown as StayConnected<CrowdDevice>,
  };
  t.stay = new StayConnected<CrowdDevice>({
    baseUrl,
    livenessMs: Number(process.env.BENCH_FLEET_LIVENESS_MS ?? 10_000),
    keyPair: generateKeyPair(),
    connect: (o) => CrowdDevice.connect({ baseUrl: o.baseUrl, serverPublicKey, keyPair: o.keyPair, bindAddress, timeoutMs: 15_000 }),
    onConnected: (device) => {
      const now = performance.now();
      if (t.handedOverAt !== undefined) counts.handOver.push(now - t.handedOverAt);
      else if (t.lostAt !== undefined) {
        counts.back.push(now - t.lostAt);
        counts.backAt.push(Date.now());
      }
      if (t.lostAt !== undefined) counts.longestWithout = Math.max(counts.longestWithout, now - t.lostAt);
      t.handedOverAt = undefined;
      t.lostAt = undefined;
      t.device = device;
      device.eventStream.on((e) => {
        const p = e.payload;
        if (p.case === "bos" && p.value.label === "assistant.audio") t.inReply = true;
        else if (p.case === "eos" && p.value.label === "assistant.audio") {
          t.inReply = false;
          // Interrupted: the reply stopped mid-word; failed or overloaded: the node could not answer in time (load), counted apart.
          if (p.value.error?.code === "interrupted") counts.cut++;
          else if (p.value.error) counts.failed++;
          else counts.replies++;
        } else if (p.case === "textDone" && p.value.label === "turn.metrics" && t.phase === "awaiting") {
          counts.answered++;
          pause(t, performance.now());
        } else if (p.case === "textDone" && p.value.label === "node.reconnect") t.handedOverAt = performance.now();
      });
      void device.closed().then(() => ended(t));
    },
    log: (e) => {
      if (e.event === "refused") counts.refused++;
    },
  });
  talkers.push(t);
}

new FrameTicker((now) => {
  for (const t of talkers) step(t, now);
}).start();

serveCommands<FleetCommand>(async (command) => {
  switch (command.type) {
    case "connect": {
      for (let i = 0; i < command.count; i++) add();
      await Promise.all(talkers.map((t) => t.stay.connected()));
      reply({ type: "connected", id: command.id });
      break;
    }
    case "talk": {
      talking = true;
      const now = performance.now();
      for (const t of talkers) t.nextAt = now + Math.random() * (PAUSE_MS + 2000);
      break;
    }
    case "collect": {
      const out: FleetCollected = { type: "collected", id: command.id, ...counts, open: talkers.filter((t) => t.device !== undefined).length };
      counts.cutByClose =
        counts.questions =
        counts.questionsCut =
        counts.failed =
        counts.answered =
        counts.replies =
        counts.cut =
        counts.lost =
        counts.refused =
          0;
      counts.handOver = [];
      counts.back = [];
      counts.backAt = [];
      counts.longestWithout = 0;
      reply(out);
      break;
    }
    case "status":
      reply({ type: "status", id: command.id, open: talkers.filter((t) => t.device !== undefined).length, back: counts.back.length });
      break;
  }
}, release);

async function release(): Promise<void> {
  talking = false;
  await Promise.all(talkers.map((t) => t.stay.close()));
}
