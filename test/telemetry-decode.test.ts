import assert from "node:assert/strict";
import { test } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { TelemetrySample } from "../src/domain/telemetry.ts";
import { TelemetryFrameSchema } from "../src/protocol/gen/telemetry_pb.ts";
import { InvalidFrame, TelemetryDecoder } from "../src/transport/telemetry.ts";
import { FrameReader } from "../src/transport/telemetry-wire.ts";

/**
 * The telemetry decoder reads most frames from their bytes into reused arrays and leaves the rest
 * to `fromBinary`. Whatever the bytes, it must answer as decoding every frame through `fromBinary`
 * did: the same samples in the same order, or the same drop reason.
 */

const FUTURE_LIMIT_MS = 24 * 60 * 60 * 1000;
const decoder = new TelemetryDecoder();
const decodeTelemetry = (payload: Uint8Array, now: number) => decoder.decode(payload, now);
const reader = new FrameReader();
const readFrame = (payload: Uint8Array) => reader.readFrame(payload);

/** The decoder as it was (every frame through the generated schema), kept here as the reference. */
function reference(payload: Uint8Array, now: number): TelemetrySample[] {
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

const outcome = (decode: (p: Uint8Array, now: number) => TelemetrySample[], payload: Uint8Array, now: number) => {
  try {
    return { samples: decode(payload, now) };
  } catch (err) {
    if (err instanceof InvalidFrame) return { reason: err.reason };
    throw err;
  }
};

/** A seeded generator, so that a failure can be run again. */
function random(seed: number) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = Math.imul(s ^ (s >>> 15), 1 | s);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const NOW = 1_700_000_000_000;

function randomFrame(r: () => number): Uint8Array {
  const pick = <T>(xs: T[]) => xs[Math.floor(r() * xs.length)]!;
  const num = () => pick([0, 1, -1, 42.5, 100, 101, -91, 95, 1e300, Number.NaN, Number.POSITIVE_INFINITY, r() * 200 - 50]);
  const maybe = <T>(v: () => T) => (r() < 0.5 ? v() : undefined);
  const text = () => pick(["LTE", "", "Operator Ω", "fw-1.2.3"]);
  const observations = Array.from({ length: Math.floor(r() * 4) }, () => {
    const kind = pick(["battery", "gnss", "network", "system", "none"]);
    const body =
      kind === "battery"
        ? { case: "battery" as const, value: { percent: maybe(num), charging: maybe(() => r() < 0.5), voltageMv: maybe(num) } }
        : kind === "gnss"
          ? { case: "gnss" as const, value: { latitude: num(), longitude: num(), altitudeM: maybe(num), accuracyM: maybe(num) } }
          : kind === "network"
            ? {
                case: "network" as const,
                value: { rssiDbm: maybe(num), signalLevel: maybe(num), rat: maybe(text), operator: maybe(text), connected: maybe(() => r() < 0.5) },
              }
            : kind === "system"
              ? {
                  case: "system" as const,
                  value: {
                    uptimeSeconds: maybe(num),
                    freeMemoryBytes: maybe(num),
                    temperatureC: maybe(num),
                    firmwareVersion: maybe(text),
                    softwareVersion: maybe(text),
                    hardwareVersion: maybe(text),
                  },
                }
              : { case: undefined };
    return { observedAtDeltaMs: pick([0, 10, -10, 2_000_000_000, -2_000_000_000, Math.floor(r() * 1000)]), body };
  });
  const base = pick([NOW, NOW + 2 * FUTURE_LIMIT_MS, 0, 5, -5, 2 ** 53, 2 ** 60]);
  return toBinary(TelemetryFrameSchema, create(TelemetryFrameSchema, { sequence: Math.floor(r() * 2 ** 32), observedAtUnixMs: BigInt(base), observations }));
}

/** The frame with a few bytes changed, cut short or grown: mostly not of the simple form, often not a frame at all. */
function mutated(bytes: Uint8Array, r: () => number): Uint8Array {
  const out = Uint8Array.from(bytes);
  const kind = r();
  if (kind < 0.4 && out.length > 0) for (let k = 0; k < 1 + r() * 3; k++) out[Math.floor(r() * out.length)] = Math.floor(r() * 256);
  else if (kind < 0.7) return out.subarray(0, Math.floor(r() * out.length));
  else return Uint8Array.from([...out, ...Array.from({ length: 1 + Math.floor(r() * 6) }, () => Math.floor(r() * 256))]);
  return out;
}

test("random frames and their mutations decode as through fromBinary: the same samples, or the same reason", () => {
  const r = random(28);
  let read = 0;
  for (let i = 0; i < 10_000; i++) {
    const good = randomFrame(r);
    for (const payload of [good, mutated(good, r), mutated(good, r)]) {
      // A frame inside a larger buffer, as packets arrive (the type byte before it).
      const packet = new Uint8Array(payload.length + 1);
      packet.set(payload, 1);
      const at = packet.subarray(1);
      if (readFrame(at)) read++;
      assert.deepEqual(outcome(decodeTelemetry, at, NOW), outcome(reference, at, NOW), `frame ${Buffer.from(payload).toString("hex")}`);
    }
  }
  assert.ok(read > 3_000, `most frames are read without fromBinary (${read})`);
});

test("frames of every body, with strings and defaults, are read from their bytes; a negative time delta is left to fromBinary", () => {
  const frameOf = (observations: object[]) =>
    toBinary(TelemetryFrameSchema, create(TelemetryFrameSchema, { sequence: 7, observedAtUnixMs: BigInt(NOW), observations }));
  const simple = frameOf([
    { observedAtDeltaMs: 0, body: { case: "battery", value: { percent: 50, charging: true } } },
    { observedAtDeltaMs: 5, body: { case: "gnss", value: { latitude: 0, longitude: 0 } } },
    { observedAtDeltaMs: 5, body: { case: "network", value: { rssiDbm: -70, rat: "LTE", operator: "Ω", connected: false } } },
    { observedAtDeltaMs: 5, body: { case: "system", value: { uptimeSeconds: 3, firmwareVersion: "1", softwareVersion: "2", hardwareVersion: "3" } } },
  ]);
  assert.equal(readFrame(simple), true);
  assert.deepEqual(decodeTelemetry(simple, NOW), reference(simple, NOW));
  assert.deepEqual(
    decodeTelemetry(simple, NOW).map((s) => s.field),
    ["battery.percent", "battery.charging", "gnss.latitude", "gnss.longitude", "network.rssi_dbm", "network.connected", "system.uptime_seconds"],
  );
  const negative = frameOf([{ observedAtDeltaMs: -10, body: { case: "battery", value: { percent: 50 } } }]);
  assert.equal(readFrame(negative), false);
  assert.deepEqual(decodeTelemetry(negative, NOW), [{ field: "battery.percent", observedAt: NOW - 10, value: 50 }]);
});

/** Protobuf bytes by hand, for forms `toBinary` never writes. */
const varint = (n: number): number[] => {
  const out: number[] = [];
  while (n >= 0x80) {
    out.push((n % 0x80) | 0x80);
    n = Math.floor(n / 0x80);
  }
  out.push(n);
  return out;
};
const field = (no: number, wire: number, bytes: number[]) => [...varint(no * 8 + wire), ...(wire === 2 ? varint(bytes.length) : []), ...bytes];
const double = (v: number) => [...new Uint8Array(new Float64Array([v]).buffer)];

test("forms the byte reader leaves to fromBinary: a body twice (merged or replaced), invalid UTF-8, a delta beyond int32, unknown fields", () => {
  const battery = (...fields: number[][]) => field(10, 2, fields.flat());
  const cases: Array<[string, number[][]]> = [
    ["the same body twice, merged", [field(1, 0, [0]), battery(field(1, 1, double(50))), battery(field(2, 0, [1]))]],
    ["two bodies, the second replacing", [battery(field(1, 1, double(50))), field(11, 2, field(1, 1, double(10)))]],
    ["a string that is not UTF-8", [field(12, 2, [...field(1, 1, double(-70)), ...field(3, 2, [0xff, 0xfe])])]],
    ["a delta written beyond 32 bits", [field(1, 0, varint(2 ** 32 + 5)), battery(field(1, 1, double(50)))]],
    ["an unknown field in a body", [battery(field(1, 1, double(50)), field(9, 0, [3]))]],
    ["a bool of two bytes", [battery(field(2, 0, [0x81, 0x00]))]],
    ["a double cut short by its body's end", [battery([0x09, 0, 0, 0, 0]), field(1, 0, [5, 0x08, 0x07])]],
  ];
  for (const [what, observation] of cases) {
    const payload = Uint8Array.from([...field(2, 0, varint(NOW)), ...field(3, 2, observation.flat())]);
    assert.equal(readFrame(payload), false, what);
    assert.deepEqual(outcome(decodeTelemetry, payload, NOW), outcome(reference, payload, NOW), what);
  }
});
