import { isUtf8 } from "node:buffer";

/**
 * A `TelemetryFrame` read straight from its bytes into reused arrays, without the message objects
 * `fromBinary` builds (a frame, an observation and a body per observation). It reads only frames
 * whose every field is one the schema knows, with its own wire type, each body at most once per
 * observation, every time a varint of up to 7 bytes, every bool one byte, every string valid
 * UTF-8: then what it reads is exactly what `fromBinary` would. Anything else (unknown fields,
 * negative time deltas, merged bodies, truncation...) returns false, and the caller decodes the
 * frame with `fromBinary`, which decides.
 */

/** Bodies, as `Observation.body` numbers them less 10; NONE for an observation without one. */
export const BATTERY = 0;
export const GNSS = 1;
export const NETWORK = 2;
export const SYSTEM = 3;
export const NONE = 4;
/** Values kept per observation: battery (percent, charging, voltage), gnss (lat, lon, alt, acc), network (rssi, level, connected), system (uptime, memory, temperature). */
export const SLOTS = 4;

/** The slot of a double field (wire type 1) of each body, by field number; -1: not a double of it. */
const DOUBLES = [
  [-1, 0, -1, 2], // battery: percent 1, voltage_mv 3
  [-1, 0, 1, 2, 3], // gnss: latitude 1, longitude 2, altitude_m 3, accuracy_m 4
  [-1, 0, 1], // network: rssi_dbm 1, signal_level 2
  [-1, 0, 1, 2], // system: uptime_seconds 1, free_memory_bytes 2, temperature_c 3
];
/** The slot of each body's bool field (wire type 0), by field number. */
const BOOLS = [[-1, -1, 1], [], [-1, -1, -1, -1, -1, 2], []];
/** Whether a field number of each body is a string (wire type 2): read, checked, not kept. */
const STRINGS = [[], [], [false, false, false, true, true], [false, false, false, false, true, true, true]];

/**
 * One reader's scratch state (the bytes read, the position, the frame read into): a reader per
 * ingest, so two nodes in one process share nothing.
 */
export class FrameReader {
  /** What the last successful `readFrame` read; valid until the next call. */
  readonly frame = {
    observedAtUnixMs: 0,
    observations: 0,
    /** Per observation: its body (BATTERY... NONE). */
    body: new Uint8Array(64),
    /** Per observation: its time delta. */
    delta: new Int32Array(64),
    /** Per observation, SLOTS values each (0 where absent). */
    values: new Float64Array(64 * SLOTS),
    /** Per observation, SLOTS flags: 1 when the value was in the frame (or is a non-optional field's default). */
    present: new Uint8Array(64 * SLOTS),
  };
  private buf: Uint8Array = new Uint8Array(0);
  private view = new DataView(this.buf.buffer);
  private pos = 0;

  /** Room for `n` observations in `frame`. */
  reserve(n: number): void {
    if (n <= this.frame.body.length) return;
    const size = Math.max(n, this.frame.body.length * 2);
    const body = new Uint8Array(size);
    body.set(this.frame.body);
    const delta = new Int32Array(size);
    delta.set(this.frame.delta);
    const values = new Float64Array(size * SLOTS);
    values.set(this.frame.values);
    const present = new Uint8Array(size * SLOTS);
    present.set(this.frame.present);
    Object.assign(this.frame, { body, delta, values, present });
  }

  /** A varint of at most 7 bytes (below 2^49), or -1. */
  private varint(end: number): number {
    let result = 0;
    let scale = 1;
    for (let i = 0; i < 7; i++) {
      if (this.pos >= end) return -1;
      const b = this.buf[this.pos++]!;
      result += (b & 0x7f) * scale;
      if (b < 0x80) return result;
      scale *= 128;
    }
    return -1;
  }

  /** A length-delimited field's end, or -1 when it runs past `end`. */
  private delimited(end: number): number {
    const len = this.varint(end);
    if (len < 0 || this.pos + len > end) return -1;
    return this.pos + len;
  }

  /** Reads `payload` (a `TelemetryFrame`) into `frame`; false when the bytes are not of the simple form above. */
  readFrame(payload: Uint8Array): boolean {
    this.buf = payload;
    if (this.view.buffer !== payload.buffer || this.view.byteOffset !== payload.byteOffset || this.view.byteLength !== payload.byteLength) {
      this.view = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
    }
    this.pos = 0;
    const end = payload.length;
    let base = 0;
    let n = 0;
    while (this.pos < end) {
      const tag = this.buf[this.pos++]!;
      if (tag === 0x08) {
        // sequence (uint32): not used; a varint32 fits in 5 bytes.
        const v = this.varint(end);
        if (v < 0 || v > 0xffffffff) return false;
      } else if (tag === 0x10) {
        base = this.varint(end);
        if (base < 0) return false;
      } else if (tag === 0x1a) {
        const stop = this.delimited(end);
        if (stop < 0) return false;
        this.reserve(n + 1);
        if (!this.readObservation(n, stop)) return false;
        n++;
      } else return false;
    }
    this.frame.observedAtUnixMs = base;
    this.frame.observations = n;
    return true;
  }

  private readObservation(i: number, end: number): boolean {
    this.frame.body[i] = NONE;
    this.frame.delta[i] = 0;
    for (let k = 0; k < SLOTS; k++) {
      this.frame.present[i * SLOTS + k] = 0;
      this.frame.values[i * SLOTS + k] = 0;
    }
    while (this.pos < end) {
      const tag = this.buf[this.pos++]!;
      if (tag === 0x08) {
        // int32 delta: a negative one is a 10-byte varint, left to fromBinary.
        const v = this.varint(end);
        if (v < 0 || v > 0x7fffffff) return false;
        this.frame.delta[i] = v;
      } else if (tag === 0x52 || tag === 0x5a || tag === 0x62 || tag === 0x6a) {
        // A second body would be merged into the first (same case) or replace it: left to fromBinary.
        if (this.frame.body[i] !== NONE) return false;
        const stop = this.delimited(end);
        if (stop < 0) return false;
        const body = (tag - 0x52) >> 3;
        this.frame.body[i] = body;
        if (body === GNSS) {
          // latitude and longitude are not optional: absent, they are 0.
          this.frame.present[i * SLOTS] = 1;
          this.frame.present[i * SLOTS + 1] = 1;
        }
        if (!this.readBody(body, i * SLOTS, stop)) return false;
      } else return false;
    }
    return true;
  }

  private readBody(body: number, slot: number, end: number): boolean {
    const doubles = DOUBLES[body]!;
    const bools = BOOLS[body]!;
    const strings = STRINGS[body]!;
    while (this.pos < end) {
      const tag = this.buf[this.pos++]!;
      const field = tag >> 3;
      const wire = tag & 7;
      if (tag >= 0x80) return false;
      if (wire === 1 && (doubles[field] ?? -1) >= 0) {
        if (this.pos + 8 > end) return false;
        const k = slot + doubles[field]!;
        this.frame.values[k] = this.view.getFloat64(this.pos, true);
        this.frame.present[k] = 1;
        this.pos += 8;
      } else if (wire === 0 && (bools[field] ?? -1) >= 0) {
        if (this.pos >= end || this.buf[this.pos]! >= 0x80) return false;
        const k = slot + bools[field]!;
        this.frame.values[k] = this.buf[this.pos++] !== 0 ? 1 : 0;
        this.frame.present[k] = 1;
      } else if (wire === 2 && strings[field]) {
        const stop = this.delimited(end);
        if (stop < 0 || !isUtf8(this.buf.subarray(this.pos, stop))) return false;
        this.pos = stop;
      } else return false;
    }
    return true;
  }
}
