import { lookup } from "node:dns/promises";
import { isIP } from "node:net";
import type { Logger } from "pino";
import type { Registry } from "prom-client";
import type { Config } from "../config/config.ts";
import type { Domain } from "../domain/index.ts";
import type { Metrics } from "../http/metrics.ts";
import type { VoiceHost } from "../voice/port.ts";
import { checkTimings, type TransportTimings } from "./timings.ts";
import { type StreamApp, WebRtcTransport } from "./transport.ts";

/** The host part of `host:port` (brackets of an IPv6 literal removed). */
export function endpointHost(endpoint: string): string {
  const m = /^\[([^\]]+)\](?::\d+)?$/.exec(endpoint) ?? /^([^:]+)(?::\d+)?$/.exec(endpoint);
  return m?.[1] ?? endpoint;
}

/** Starts this node's WebRTC transport from the configuration: one UDP port (default the HTTP port's number). */
export async function startTransport(
  config: Config,
  o: {
    domain: Domain;
    logger: Logger;
    registry: Registry;
    httpMetrics: Metrics;
    httpPort: number;
    publicApi: StreamApp;
    compatibleApi: StreamApp;
    voice?: VoiceHost;
  },
): Promise<WebRtcTransport> {
  const timings: TransportTimings = {
    ownershipCheckMs: config.webrtc.ownership_check_ms,
    runtimeRefreshMs: config.webrtc.runtime_refresh_ms,
    gatherTimeoutMs: config.webrtc.gather_timeout_ms,
    livenessQuietMs: config.webrtc.liveness_quiet_ms,
    livenessProbeTimeoutMs: config.webrtc.liveness_probe_timeout_ms,
    rpcRequestTimeoutMs: config.webrtc.rpc_request_timeout_ms,
  };
  checkTimings(timings);
  const udpPort = config.webrtc.udp_port ?? o.httpPort;
  const wildcard = config.host === "0.0.0.0" || config.host === "::";
  const bindAddress = wildcard ? undefined : config.host;
  let publicAddress: string | undefined;
  if (config.public_endpoint) {
    const host = endpointHost(config.public_endpoint);
    try {
      publicAddress = isIP(host) ? host : (await lookup(host)).address;
    } catch (err) {
      // Candidates must be addresses; without one the gathered host candidates are kept.
      o.logger.warn({ err, endpoint: config.public_endpoint }, "the public endpoint's host does not resolve; host candidates are not rewritten");
    }
  }
  const transport = new WebRtcTransport({
    domain: o.domain,
    logger: o.logger.child({ component: "webrtc" }),
    registry: o.registry,
    httpMetrics: o.httpMetrics,
    requestTimeoutMs: config.http.request_timeout_ms,
    udpPort,
    bindAddress,
    publicAddress,
    maxConnections: config.webrtc.max_connections,
    timings,
    liveness: { quietMs: config.webrtc.liveness_quiet_ms, probeTimeoutMs: config.webrtc.liveness_probe_timeout_ms, checkEveryMs: 1_000 },
    publicApi: o.publicApi,
    compatibleApi: o.compatibleApi,
    voice: o.voice,
  });
  // The port is bound now and held for the node's life: one in use fails the start, not each offer.
  try {
    await transport.holdPort();
  } catch (err) {
    await transport.close();
    throw err;
  }
  return transport;
}
