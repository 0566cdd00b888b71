import { Counter, Gauge, type Registry } from "prom-client";
import type { DropReason } from "./telemetry.ts";

/** What the transport holds now, for the gauges (read at each scrape). */
export interface TransportCensus {
  /** Connections by state: pending (no event stream yet), activating, active. */
  connections: Record<"pending" | "activating" | "active", number>;
  /** Service streams by service and state: open (served), waiting (for the connection to become active). */
  streams: Array<{ service: "rpc" | "public" | "compatible" | "tools"; state: "open" | "waiting"; count: number }>;
}

/** The transport's Prometheus metrics, in the node's registry. */
export class TransportMetrics {
  private readonly offers: Counter<"result">;
  private readonly frames: Counter;
  private readonly drops: Counter<"reason">;
  private readonly rtpPackets: Counter;
  private readonly rtpBytes: Counter;
  private readonly refusedStreams: Counter;

  constructor(registry: Registry, census: () => TransportCensus) {
    const registers = [registry];
    this.offers = new Counter({ name: "perch_webrtc_offers_total", help: "Offers by result (answered, or the error code)", labelNames: ["result"], registers });
    this.frames = new Counter({
      name: "perch_telemetry_frames_total",
      help: "Telemetry frames accepted from packet channels (counted once stored)",
      registers,
    });
    this.drops = new Counter({ name: "perch_telemetry_frames_dropped_total", help: "Packets dropped, by reason", labelNames: ["reason"], registers });
    this.rtpPackets = new Counter({ name: "perch_webrtc_rtp_received_packets_total", help: "RTP packets received on audio tracks", registers });
    this.rtpBytes = new Counter({ name: "perch_webrtc_rtp_received_bytes_total", help: "RTP bytes received on audio tracks", registers });
    this.refusedStreams = new Counter({ name: "perch_webrtc_streams_refused_total", help: "Service streams closed at once (over 256 open)", registers });
    new Gauge({
      name: "perch_webrtc_connections",
      help: "WebRTC connections this node holds",
      registers,
      collect() {
        const c = census().connections;
        this.set(c.pending + c.activating + c.active);
      },
    });
    new Gauge({
      name: "perch_webrtc_connections_by_state",
      help: "WebRTC connections this node holds, by state (pending: no event stream yet)",
      labelNames: ["state"],
      registers,
      collect() {
        for (const [state, n] of Object.entries(census().connections)) this.set({ state }, n);
      },
    });
    new Gauge({
      name: "perch_webrtc_streams",
      help: "Service streams held, by service and state (waiting: for the connection to become active)",
      labelNames: ["service", "state"],
      registers,
      collect() {
        this.reset();
        for (const s of census().streams) this.set({ service: s.service, state: s.state }, s.count);
      },
    });
  }

  offer(result: string): void {
    this.offers.inc({ result });
  }
  /** Frames stored (a frame counts as accepted once stored). */
  frame(n = 1): void {
    this.frames.inc(n);
  }
  dropped(reason: DropReason, n = 1): void {
    this.drops.inc({ reason }, n);
  }
  rtp(bytes: number): void {
    this.rtpPackets.inc();
    this.rtpBytes.inc(bytes);
  }
  streamRefused(): void {
    this.refusedStreams.inc();
  }
}
