import { fromBinary } from "@bufbuild/protobuf";
import type { TelemetrySample } from "../domain/telemetry.ts";
import type { WriteDropReason } from "../domain/telemetry-writer.ts";
import { TelemetryFrameSchema } from "../protocol/gen/telemetry_pb.ts";

export const TELEMETRY_PACKET = 0x40;
const FUTURE_LIMIT_MS = 24 * 60 * 60 * 1000;

/** Why a packet was dropped: what the transport refuses, or what the telemetry writer could not store. */
export type DropReason = "empty" | "undecodable" | "out_of_range" | "non_finite" | "future" | "rate_limited" | "unknown_type" | WriteDropReason;

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
