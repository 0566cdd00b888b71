/**
 * One process of the WebRTC crowd (`bench/webrtc.ts` forks several): holds hundreds of
 * node-datachannel devices and feeds them telemetry, on commands over the IPC channel. It exits
 * when told to, or as soon as the parent goes away.
 *
 * Environment: PERCH_URL, PERCH_SERVER_KEY, CROWD_BIND (the local address to gather on).
 */
import { readdirSync, readFileSync } from "node:fs";
import { decodePrivateKey, generateKeyPair, keyPairFromPrivate } from "../src/crypto/keys.ts";
import { CrowdDevice } from "./crowd-device.ts";
import { reply, serveCommands, serverOfWorker } from "./device-worker.ts";
import { telemetryPacket } from "./telemetry-packet.ts";

export type WorkerCommand =
  /**
   * Connects `count` more devices, `concurrency` at a time (1: one after the other, for latency);
   * no connect starts after `deadline` (Unix ms), so an overloaded server ends the step.
   */
  | { type: "connect"; count: number; concurrency: number; deadline?: number; id: number; keys?: string[] }
  /** Every device sends `framesPerSecond` telemetry frames of `observations` observations each (0 stops). */
  | { type: "rate"; framesPerSecond: number; observations: number }
  | { type: "stats"; id: number }
  /** Closes every device (the process stays). */
  | { type: "release"; id: number }
  | { type: "exit" };

export interface ConnectReport {
  type: "connected";
  id: number;
  ok: number;
  failed: number;
  /** Connects not started: the deadline passed. */
  skipped: number;
  /** Attempts that failed and were tried again (a fresh peer connection each time). */
  retried: number;
  ready: number[];
  /** The server's `total` of `Server-Timing`, per connect. */
  offerServer: number[];
  errors: string[];
}

export interface StatsReport {
  type: "stats";
  id: number;
  open: number;
  /** Devices whose connection ended without being asked to. */
  lost: number;
  sent: number;
  unsent: number;
  fds: number;
  rssMb: number;
}

const { baseUrl, serverPublicKey, bindAddress } = serverOfWorker();
const ATTEMPTS = 5;

const devices = new Set<CrowdDevice>();
let lost = 0;
let sent = 0;
let unsent = 0;

async function connectOne(report: ConnectReport, deadline: number, privateKey?: string): Promise<void> {
  const keyPair = privateKey ? keyPairFromPrivate(decodePrivateKey(privateKey)) : generateKeyPair();
  for (let attempt = 1; ; attempt++) {
    try {
      const device = await CrowdDevice.connect({ baseUrl, serverPublicKey, keyPair, bindAddress, timeoutMs: 15_000 });
      devices.add(device);
      device.onClosed(() => {
        if (devices.delete(device)) lost++;
      });
      report.ok++;
      report.ready.push(device.timings.ready);
      report.offerServer.push(Number(/total;dur=([\d.]+)/.exec(device.timings.serverTiming)?.[1] ?? Number.NaN));
      return;
    } catch (err) {
      if (report.errors.length < 5) report.errors.push((err as Error).message.slice(0, 300));
      if (attempt >= ATTEMPTS || Date.now() > deadline) {
        report.failed++;
        return;
      }
      report.retried++;
    }
  }
}

async function connect(command: Extract<WorkerCommand, { type: "connect" }>): Promise<void> {
  const report: ConnectReport = { type: "connected", id: command.id, ok: 0, failed: 0, skipped: 0, retried: 0, ready: [], offerServer: [], errors: [] };
  const deadline = command.deadline ?? Number.POSITIVE_INFINITY;
  let next = 0;
  const lane = async () => {
    while (next < command.count && Date.now() < deadline) {
      const key = command.keys?.[next];
      next++;
      await connectOne(report, deadline, key);
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, command.concurrency) }, lane));
  report.skipped = command.count - next;
  reply(report);
}

// Telemetry: each device has its own schedule (spread over the interval), checked on one ticker.
let ticker: NodeJS.Timeout | undefined;
const schedule = new WeakMap<CrowdDevice, number>();
let sequence = 0;

function setRate(framesPerSecond: number, observations: number): void {
  if (ticker) clearInterval(ticker);
  ticker = undefined;
  if (framesPerSecond <= 0) return;
  const interval = 1000 / framesPerSecond;
  const start = performance.now();
  for (const d of devices) schedule.set(d, start + Math.random() * interval);
  // Packets are shared by the devices of a tick; a late device's catch-up frame gets a time 1 ms
  // earlier, as the store keeps one sample per field and millisecond.
  const packets = new Map<number, Buffer>();
  const packet = (at: number) => {
    let p = packets.get(at);
    if (!p) {
      p = telemetryPacket(sequence++, at, observations);
      packets.set(at, p);
    }
    return p;
  };
  ticker = setInterval(
    () => {
      const now = performance.now();
      const wall = Date.now();
      packets.clear();
      for (const d of devices) {
        let due = schedule.get(d);
        if (due === undefined) {
          due = now + Math.random() * interval;
          schedule.set(d, due);
        }
        // At most two frames per device and tick: a stalled process does not burst past the server's limit.
        for (let k = 0; k < 2 && due <= now; k++) {
          if (d.send(packet(wall - k))) sent++;
          else unsent++;
          due += interval;
        }
        if (due <= now) due = now + interval;
        schedule.set(d, due);
      }
    },
    Math.max(5, Math.min(50, interval)),
  );
}

function stats(id: number): StatsReport {
  let open = 0;
  for (const d of devices) if (d.open) open++;
  const rss = /VmRSS:\s+(\d+)/.exec(readFileSync("/proc/self/status", "utf8"))?.[1];
  return { type: "stats", id, open, lost, sent, unsent, fds: readdirSync("/proc/self/fd").length, rssMb: Math.round(Number(rss) / 1024) };
}

function release(): void {
  setRate(0, 0);
  for (const d of devices) d.close();
  devices.clear();
}

serveCommands<WorkerCommand>((command) => {
  switch (command.type) {
    case "connect":
      void connect(command);
      break;
    case "rate":
      setRate(command.framesPerSecond, command.observations);
      break;
    case "stats":
      reply(stats(command.id));
      break;
  }
}, release);
