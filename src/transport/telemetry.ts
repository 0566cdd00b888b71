import { fromBinary } from "@bufbuild/protobuf";
import type { TelemetrySample } from "../domain/telemetry.ts";
import { TelemetryFrameSchema } from "../protocol/gen/telemetry_pb.ts";

export const TELEMETRY_PACKET = 0x40;
const FUTURE_LIMIT_MS = 24 * 60 * 60 * 1000;

export type DropReason = "empty" | "undecodable" | "out_of_range" | "non_finite" | "future" | "rate_limited" | "overload" | "unknown_type";

export class InvalidFrame extends Error {
  readonly reason: DropReason;
  constructor(reason: DropReason, message: string) {
    super(message);
    this.reason = reason;
  }
}

/** A `TelemetryFrame` as samples, or `InvalidFrame` with the reason it is dropped (transport contract, section 6). */
export function decodeTelemetry(payload: Uint8Array, now: number): TelemetrySample[] {
  if (payload.length === 0) throw new InvalidFrame("empty", "empty frame");
  let frame: ReturnType<typeof fromBinary<typeof TelemetryFrameSchema>>;
  try {
    frame = fromBinary(TelemetryFrameSchema, payload);
  } catch {
    throw new InvalidFrame("undecodable", "not a TelemetryFrame");
  }
  if (frame.observations.length === 0) throw new InvalidFrame("empty", "no observations");
  const base = Number(frame.observedAtUnixMs);
  const samples: TelemetrySample[] = [];
  for (const o of frame.observations) {
    const at = base + o.observedAtDeltaMs;
    if (!Number.isSafeInteger(at) || at < 0) throw new InvalidFrame("out_of_range", "observation time out of range");
    if (at > now + FUTURE_LIMIT_MS) throw new InvalidFrame("future", "observation more than 24 h in the future");
    const add = (field: TelemetrySample["field"], value: number | boolean | undefined, min = -Infinity, max = Infinity) => {
      if (value === undefined) return;
      const v = typeof value === "boolean" ? (value ? 1 : 0) : value;
      if (!Number.isFinite(v)) throw new InvalidFrame("non_finite", `${field} is not finite`);
      if (v < min || v > max) throw new InvalidFrame("out_of_range", `${field} out of range`);
      samples.push({ field, observedAt: at, value: v });
    };
    const b = o.body;
    switch (b.case) {
      case "battery":
        add("battery.percent", b.value.percent, 0, 100);
        add("battery.charging", b.value.charging);
        add("battery.voltage_mv", b.value.voltageMv, 0);
        break;
      case "gnss":
        add("gnss.latitude", b.value.latitude, -90, 90);
        add("gnss.longitude", b.value.longitude, -180, 180);
        add("gnss.altitude_m", b.value.altitudeM);
        add("gnss.accuracy_m", b.value.accuracyM, 0);
        break;
      case "network":
        add("network.rssi_dbm", b.value.rssiDbm);
        add("network.signal_level", b.value.signalLevel);
        add("network.connected", b.value.connected);
        break;
      case "system":
        add("system.uptime_seconds", b.value.uptimeSeconds);
        add("system.free_memory_bytes", b.value.freeMemoryBytes);
        add("system.temperature_c", b.value.temperatureC);
        break;
      default:
        throw new InvalidFrame("empty", "observation without a body");
    }
  }
  return samples;
}

export interface TelemetrySink {
  recordMany(batch: Array<{ publicKey: string; samples: TelemetrySample[] }>): Promise<void>;
}

/**
 * Batches telemetry writes: one transaction every `intervalMs`, or at once when `maxSamples` are
 * waiting. While a write is under way the next batch gathers; past `maxQueued` samples, frames are
 * dropped (the store is not keeping up) rather than growing memory.
 */
export class TelemetryWriter {
  private queue = new Map<string, TelemetrySample[]>();
  private queued = 0;
  private writing: Promise<void> | undefined;
  private timer: NodeJS.Timeout | undefined;
  private readonly o: { sink: TelemetrySink; intervalMs: number; maxSamples: number; maxQueued: number; onError: (err: unknown) => void };

  constructor(o: { sink: TelemetrySink; intervalMs?: number; maxSamples?: number; maxQueued?: number; onError: (err: unknown) => void }) {
    this.o = { intervalMs: 250, maxSamples: 500, maxQueued: 100_000, ...o };
  }

  /** Queues a frame's samples; false when dropped for overload. */
  add(publicKey: string, samples: TelemetrySample[]): boolean {
    if (this.queued + samples.length > this.o.maxQueued) return false;
    const list = this.queue.get(publicKey);
    if (list) list.push(...samples);
    else this.queue.set(publicKey, samples);
    this.queued += samples.length;
    if (this.queued >= this.o.maxSamples && !this.writing) this.flush();
    else this.timer ??= setTimeout(() => this.flush(), this.o.intervalMs);
    return true;
  }

  /** Writes what is queued; resolves once every queued sample is stored (or failed). */
  flush(): Promise<void> {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    if (this.writing) return this.writing.then(() => this.flush());
    if (this.queued === 0) return Promise.resolve();
    const batch = [...this.queue].map(([publicKey, samples]) => ({ publicKey, samples }));
    this.queue = new Map();
    this.queued = 0;
    this.writing = this.o.sink.recordMany(batch).then(
      () => {
        this.writing = undefined;
        if (this.queued > 0) this.timer ??= setTimeout(() => this.flush(), 0);
      },
      (err) => {
        this.writing = undefined;
        this.o.onError(err);
      },
    );
    return this.writing;
  }

  async close(): Promise<void> {
    await this.flush();
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
  }
}
