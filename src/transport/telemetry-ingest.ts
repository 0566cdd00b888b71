import type { Clock } from "../domain/clock.ts";
import { RateLimiter } from "../domain/rate-limiter.ts";
import type { TelemetryWriter } from "../domain/telemetry-writer.ts";
import type { TransportMetrics } from "./metrics.ts";
import { InvalidFrame, TELEMETRY_PACKET, TelemetryDecoder } from "./telemetry.ts";

const MAX_PACKET_BYTES = 64 * 1024;
/** Telemetry frames a connection may send per second on average; more are dropped (a flood must not starve the node). */
export const TELEMETRY_FRAMES_PER_SECOND = 100;
/**
 * Frames a connection may send at once above the rate: a device sending 100 a second has its
 * frames arrive in bunches (its own timers, the network, this node's busy moments), and a fixed
 * one-second window dropped half of them under load.
 */
export const TELEMETRY_BURST_FRAMES = 200;

/**
 * The packet channel's telemetry, from every connection of the node: each packet checked (size,
 * type), limited per peer (the domain's rate limiter on the injected clock), decoded and handed to
 * the domain's writer, which counts a frame accepted once stored. Drops are counted by reason.
 */
export class TelemetryIngest {
  private readonly writer: TelemetryWriter;
  private readonly metrics: TransportMetrics;
  private readonly clock: Clock;
  private readonly limiter: RateLimiter;
  private readonly decoder = new TelemetryDecoder();

  constructor(o: { writer: TelemetryWriter; metrics: TransportMetrics; clock: Clock; maxPeers: number }) {
    this.writer = o.writer;
    this.metrics = o.metrics;
    this.clock = o.clock;
    this.limiter = new RateLimiter(TELEMETRY_FRAMES_PER_SECOND * 60, o.clock, Math.max(1, o.maxPeers), TELEMETRY_BURST_FRAMES);
  }

  /** One packet from `publicKey`'s packet channel. Throws only for an unexpected failure (the caller logs it). */
  packet(publicKey: string, data: Uint8Array): void {
    const refused =
      data.length === 0
        ? "empty"
        : data.length > MAX_PACKET_BYTES
          ? "out_of_range"
          : data[0] !== TELEMETRY_PACKET
            ? "unknown_type"
            : this.limiter.hit(publicKey) > 0
              ? "rate_limited"
              : undefined;
    if (refused) {
      this.metrics.dropped(refused);
      return;
    }
    try {
      const samples = this.decoder.decode(data.subarray(1), this.clock.now());
      // The writer counts the frame: accepted once stored, or dropped by reason.
      this.writer.add(publicKey, samples);
    } catch (err) {
      if (err instanceof InvalidFrame) this.metrics.dropped(err.reason);
      else throw err;
    }
  }
}
