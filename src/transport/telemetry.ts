import { fromBinary } from "@bufbuild/protobuf";
import type { TelemetrySample } from "../domain/telemetry.ts";
import type { WriteDropReason } from "../domain/telemetry-writer.ts";
import { type TelemetryFrame, TelemetryFrameSchema } from "../protocol/gen/telemetry_pb.ts";
import { BATTERY, FrameReader, GNSS, NETWORK, NONE, SLOTS, SYSTEM } from "./telemetry-wire.ts";

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

/** What each body's slots (see telemetry-wire.ts) become, in the order their samples are listed, with their bounds. */
const BODY_FIELDS: ReadonlyArray<ReadonlyArray<readonly [slot: number, field: TelemetrySample["field"], min: number, max: number]>> = [
  [
    [0, "battery.percent", 0, 100],
    [1, "battery.charging", -Infinity, Infinity],
    [2, "battery.voltage_mv", 0, Infinity],
  ],
  [
    [0, "gnss.latitude", -90, 90],
    [1, "gnss.longitude", -180, 180],
    [2, "gnss.altitude_m", -Infinity, Infinity],
    [3, "gnss.accuracy_m", 0, Infinity],
  ],
  [
    [0, "network.rssi_dbm", -Infinity, Infinity],
    [1, "network.signal_level", -Infinity, Infinity],
    [2, "network.connected", -Infinity, Infinity],
  ],
  [
    [0, "system.uptime_seconds", -Infinity, Infinity],
    [1, "system.free_memory_bytes", -Infinity, Infinity],
    [2, "system.temperature_c", -Infinity, Infinity],
  ],
];

/**
 * A `TelemetryFrame` as samples, or `InvalidFrame` with the reason it is dropped (transport contract, section 6).
 * The frame is read into reused arrays (`readFrame`), or through `fromBinary` when it is not of the
 * simple form that reads; either way the same checks run on the same values.
 */
export class TelemetryDecoder {
  /** Its own reused arrays: a decoder per ingest (per node). */
  private readonly reader = new FrameReader();

  decode(payload: Uint8Array, now: number): TelemetrySample[] {
    return decodeTelemetry(this.reader, payload, now);
  }
}

function decodeTelemetry(reader: FrameReader, payload: Uint8Array, now: number): TelemetrySample[] {
  if (payload.length === 0) throw new InvalidFrame("empty", "empty frame");
  const { frame } = reader;
  if (!reader.readFrame(payload)) fromSchema(reader, payload);
  const n = frame.observations;
  if (n === 0) throw new InvalidFrame("empty", "no observations");
  const base = frame.observedAtUnixMs;
  const samples: TelemetrySample[] = [];
  for (let i = 0; i < n; i++) {
    const at = base + frame.delta[i]!;
    if (!Number.isSafeInteger(at) || at < 0) throw new InvalidFrame("out_of_range", "observation time out of range");
    if (at > now + FUTURE_LIMIT_MS) throw new InvalidFrame("future", "observation more than 24 h in the future");
    const body = frame.body[i]!;
    if (body === NONE) throw new InvalidFrame("empty", "observation without a body");
    for (const [slot, field, min, max] of BODY_FIELDS[body]!) {
      const k = i * SLOTS + slot;
      if (frame.present[k] === 0) continue;
      const v = frame.values[k]!;
      if (!Number.isFinite(v)) throw new InvalidFrame("non_finite", `${field} is not finite`);
      if (v < min || v > max) throw new InvalidFrame("out_of_range", `${field} out of range`);
      samples.push({ field, observedAt: at, value: v });
    }
  }
  return samples;
}

/** `payload` through the generated schema into `frame`'s arrays: any frame `fromBinary` takes, or `undecodable`. */
function fromSchema(reader: FrameReader, payload: Uint8Array): void {
  let message: TelemetryFrame;
  try {
    message = fromBinary(TelemetryFrameSchema, payload);
  } catch {
    throw new InvalidFrame("undecodable", "not a TelemetryFrame");
  }
  const n = message.observations.length;
  reader.reserve(n);
  const { frame } = reader;
  frame.observedAtUnixMs = Number(message.observedAtUnixMs);
  frame.observations = n;
  for (let i = 0; i < n; i++) {
    const o = message.observations[i]!;
    frame.delta[i] = o.observedAtDeltaMs;
    const set = (slot: number, value: number | boolean | undefined) => {
      frame.present[i * SLOTS + slot] = value === undefined ? 0 : 1;
      frame.values[i * SLOTS + slot] = typeof value === "boolean" ? (value ? 1 : 0) : (value ?? 0);
    };
    for (let k = 0; k < SLOTS; k++) set(k, undefined);
    const b = o.body;
    switch (b.case) {
      case "battery":
        frame.body[i] = BATTERY;
        set(0, b.value.percent);
        set(1, b.value.charging);
        set(2, b.value.voltageMv);
        break;
      case "gnss":
        frame.body[i] = GNSS;
        set(0, b.value.latitude);
        set(1, b.value.longitude);
        set(2, b.value.altitudeM);
        set(3, b.value.accuracyM);
        break;
      case "network":
        frame.body[i] = NETWORK;
        set(0, b.value.rssiDbm);
        set(1, b.value.signalLevel);
        set(2, b.value.connected);
        break;
      case "system":
        frame.body[i] = SYSTEM;
        set(0, b.value.uptimeSeconds);
        set(1, b.value.freeMemoryBytes);
        set(2, b.value.temperatureC);
        break;
      default:
        frame.body[i] = NONE;
    }
  }
}
