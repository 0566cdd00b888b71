import { availableParallelism } from "node:os";
import type { Config } from "../config/config.ts";
import { DomainError } from "../domain/errors.ts";
import type { NodeLoad, NodeState } from "../store/nodes.ts";

/** The window the process's CPU is judged over (fleet.md §2). */
export const CPU_WINDOW_MS = 5_000;
const CPU_SAMPLE_MS = 1_000;
/** A full node asks devices to come back after this long (seconds; a balancer sends them elsewhere meanwhile). */
export const FULL_RETRY_AFTER_S = 2;
/** Below a bound by this share of it (at least one for counts) a full node serves again: no flapping at the bound. */
const MARGIN = 0.1;

/**
 * The process's CPU over the last `CPU_WINDOW_MS`, as a share of one core (1.5: one core and a
 * half), from `process.cpuUsage()` sampled every second (its worker threads included).
 */
export class CpuWindow {
  private readonly samples: Array<{ at: number; cpu: number }> = [];
  private readonly timer: NodeJS.Timeout;
  private readonly usage: () => number;

  constructor(
    usage: () => number = () => {
      const u = process.cpuUsage();
      return (u.user + u.system) / 1000;
    },
  ) {
    this.usage = usage;
    this.sample();
    this.timer = setInterval(() => this.sample(), CPU_SAMPLE_MS);
    this.timer.unref();
  }

  private sample(): void {
    const now = performance.now();
    this.samples.push({ at: now, cpu: this.usage() });
    while (this.samples.length > 2 && now - this.samples[1]!.at >= CPU_WINDOW_MS) this.samples.shift();
  }

  /** CPU time over wall time since the oldest sample of the window (now included). */
  share(): number {
    const first = this.samples[0];
    if (!first) return 0;
    const now = performance.now();
    const wall = now - first.at;
    if (wall < 200) return 0;
    return Math.max(0, (this.usage() - first.cpu) / wall);
  }

  stop(): void {
    clearInterval(this.timer);
  }
}

export interface FleetSources {
  /** WebRTC connections held (pending and active) and voice conversations open. */
  counts(): { connections: number; conversations: number };
  /** The process's CPU over the last 5 s, as a share of one core. */
  cpu(): number;
  /** Cores the process may use (default `os.availableParallelism()`). */
  cores?: number;
}

/**
 * This node's place in the fleet (fleet.md §2, §3): `serving`, `full` (at or over a bound of
 * `fleet.*`, judged again at every offer, readiness check and heartbeat, serving again only below
 * each bound by a margin) or `draining` (from the drain on, for good).
 */
export class Fleet {
  private readonly bounds: Config["fleet"];
  private readonly sources: FleetSources;
  private readonly cores: number;
  private full = false;
  private drainingSince: number | undefined;

  constructor(bounds: Config["fleet"], sources: FleetSources) {
    this.bounds = bounds;
    this.sources = sources;
    this.cores = sources.cores ?? availableParallelism();
  }

  get draining(): boolean {
    return this.drainingSince !== undefined;
  }

  /** The drain began: from now on offers are refused and `/readyz` says so. */
  startDraining(): void {
    this.drainingSince ??= performance.now();
  }

  load(): NodeLoad {
    const { connections, conversations } = this.sources.counts();
    return { connections, conversations, cpu: this.sources.cpu() };
  }

  /** The state now (judging the bounds again). */
  state(): Exclude<NodeState, "gone"> {
    if (this.draining) return "draining";
    this.judge(this.load());
    return this.full ? "full" : "serving";
  }

  /** The state and load for the node's row. */
  report(): { state: NodeState; load: NodeLoad } {
    const load = this.load();
    if (!this.draining) this.judge(load);
    return { state: this.draining ? "draining" : this.full ? "full" : "serving", load };
  }

  /** Refuses a new device connection on a node that cannot take it: 503 `NODE_DRAINING` or `NODE_FULL` with `Retry-After`. */
  admit(): void {
    const state = this.state();
    if (state === "draining") throw new DomainError("unavailable", "NODE_DRAINING", "this node is draining: connect again through the balancer", undefined, 1);
    if (state === "full")
      throw new DomainError("unavailable", "NODE_FULL", "this node is at its limit: connect again through the balancer", undefined, FULL_RETRY_AFTER_S);
  }

  private judge(load: NodeLoad): void {
    const { max_connections, max_conversations, max_cpu } = this.bounds;
    const share = load.cpu / this.cores;
    const over =
      (max_connections > 0 && load.connections >= max_connections) ||
      (max_conversations > 0 && load.conversations >= max_conversations) ||
      (max_cpu > 0 && share >= max_cpu);
    if (over) {
      this.full = true;
      return;
    }
    if (!this.full) return;
    const below = (value: number, bound: number) => bound === 0 || value <= bound - Math.max(1, Math.floor(bound * MARGIN));
    const cpuBelow = max_cpu === 0 || share < max_cpu * (1 - MARGIN);
    if (below(load.connections, max_connections) && below(load.conversations, max_conversations) && cpuBelow) this.full = false;
  }
}
