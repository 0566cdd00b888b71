/** The WebRTC crowd seen from the bench: worker processes of node-datachannel devices, commanded over IPC. */
import type { ConnectReport, StatsReport, WorkerCommand } from "./crowd-worker.ts";
import { DeviceProcess } from "./device-process.ts";

/** One worker process (bench/crowd-worker.ts). */
class Worker extends DeviceProcess<WorkerCommand, ConnectReport | StatsReport> {
  /** Devices asked of this worker and connected so far. */
  held = 0;
}

/** Every worker's `stats` summed (descriptors and resident memory of every worker together). */
export type CrowdStats = Omit<StatsReport, "type" | "id">;

/** Several worker processes; devices are spread evenly over them. */
export class Crowd {
  private readonly workers: Worker[];

  constructor(processes: number, o: { url: string; serverKey: string; bindAddress?: string }) {
    const env = { PERCH_URL: o.url, PERCH_SERVER_KEY: o.serverKey, CROWD_BIND: o.bindAddress ?? "" };
    this.workers = Array.from({ length: processes }, () => new Worker("bench/crowd-worker.ts", env));
  }

  get pids(): number[] {
    return this.workers.map((w) => w.child.pid!).filter(Boolean);
  }

  /** Connects `count` more devices, spread over the workers, `concurrency` at a time in each, none started after `deadline`. */
  /** `keys`: the devices' private keys (base58), `count` of them, instead of new ones. */
  async connect(count: number, concurrency: number, deadline?: number, keys?: string[]): Promise<Omit<ConnectReport, "type" | "id">> {
    const total = this.workers.reduce((n, w) => n + w.held, 0) + count;
    const shares = this.workers.map((w, i) => Math.max(0, Math.floor(total / this.workers.length) + (i < total % this.workers.length ? 1 : 0) - w.held));
    const offsets = shares.map((_, i) => shares.slice(0, i).reduce((a, b) => a + b, 0));
    const reports = await Promise.all(
      this.workers.map((w, i) =>
        shares[i]! > 0
          ? w.ask<ConnectReport>({
              type: "connect",
              count: shares[i]!,
              concurrency,
              deadline,
              ...(keys ? { keys: keys.slice(offsets[i], offsets[i]! + shares[i]!) } : {}),
            })
          : Promise.resolve(undefined),
      ),
    );
    const sum: Omit<ConnectReport, "type" | "id"> = { ok: 0, failed: 0, skipped: 0, retried: 0, ready: [], offerServer: [], errors: [] };
    reports.forEach((r, i) => {
      if (r?.type !== "connected") return;
      this.workers[i]!.held += r.ok;
      sum.ok += r.ok;
      sum.failed += r.failed;
      sum.skipped += r.skipped;
      sum.retried += r.retried;
      sum.ready.push(...r.ready);
      sum.offerServer.push(...r.offerServer);
      sum.errors.push(...r.errors.slice(0, 3 - Math.min(3, sum.errors.length)));
    });
    return sum;
  }

  /** Connects `count` devices one after the other in the first worker (latency, not load). */
  async connectSequentially(count: number): Promise<Omit<ConnectReport, "type" | "id">> {
    const w = this.workers[0]!;
    const r = await w.ask<ConnectReport>({ type: "connect", count, concurrency: 1 });
    w.held += r.ok;
    return r;
  }

  setRate(framesPerSecond: number, observations = 1): void {
    for (const w of this.workers) w.tell({ type: "rate", framesPerSecond, observations });
  }

  async stats(): Promise<CrowdStats> {
    const all = await Promise.all(this.workers.map((w) => w.ask<StatsReport>({ type: "stats" })));
    const sum: CrowdStats = { open: 0, lost: 0, sent: 0, unsent: 0, fds: 0, rssMb: 0 };
    for (const s of all) {
      if (s.type !== "stats") continue;
      sum.open += s.open;
      sum.lost += s.lost;
      sum.sent += s.sent;
      sum.unsent += s.unsent;
      sum.fds += s.fds;
      sum.rssMb += s.rssMb;
    }
    return sum;
  }

  /** Closes every device; the workers stay for the next part. */
  async release(): Promise<void> {
    await Promise.all(this.workers.map((w) => w.ask({ type: "release" }).catch(() => {})));
    for (const w of this.workers) w.held = 0;
  }

  /** Ends every worker: asked first, killed when it does not leave within `graceMs`. */
  async stop(graceMs = 3000): Promise<void> {
    await Promise.all(
      this.workers.map(async (w) => {
        if (w.child.exitCode !== null || w.child.signalCode !== null) return;
        const exited = new Promise((r) => w.child.once("exit", r));
        w.tell({ type: "exit" });
        const timer = setTimeout(() => w.child.kill("SIGKILL"), graceMs);
        await exited;
        clearTimeout(timer);
      }),
    );
  }

  /** Last resort (process exit): kills whatever is left, synchronously. */
  kill(): void {
    for (const w of this.workers) if (w.child.exitCode === null && w.child.signalCode === null) w.child.kill("SIGKILL");
  }
}
