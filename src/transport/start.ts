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
    ownershipCheckMs: config.webrtc.ownershipCheckMs,
    runtimeRefreshMs: config.webrtc.runtimeRefreshMs,
    gatherTimeoutMs: config.webrtc.gatherTimeoutMs,
    livenessQuietMs: config.webrtc.livenessQuietMs,
    livenessProbeTimeoutMs: config.webrtc.livenessProbeTimeoutMs,
    rpcRequestTimeoutMs: config.webrtc.rpcRequestTimeoutMs,
  };
  checkTimings(timings);
  const udpPort = config.webrtc.udpPort ?? o.httpPort;
  const wildcard = config.host === "0.0.0.0" || config.host === "::";
  const bindAddress = wildcard ? undefined : config.host;
  let publicAddress: string | undefined;
  if (config.publicEndpoint) {
    const host = endpointHost(config.publicEndpoint);
    try {
      publicAddress = isIP(host) ? host : (await lookup(host)).address;
    } catch (err) {
      // Candidates must be addresses; without one the gathered host candidates are kept.
      o.logger.warn({ err, endpoint: config.publicEndpoint }, "the public endpoint's host does not resolve; host candidates are not rewritten");
    }
  }
  const transport = new WebRtcTransport({
    domain: o.domain,
    logger: o.logger.child({ component: "webrtc" }),
    registry: o.registry,
    httpMetrics: o.httpMetrics,
    requestTimeoutMs: config.http.requestTimeoutMs,
    udpPort,
    bindAddress,
    publicAddress,
    maxConnections: config.webrtc.maxConnections,
    timings,
    liveness: { quietMs: config.webrtc.livenessQuietMs, probeTimeoutMs: config.webrtc.livenessProbeTimeoutMs, checkEveryMs: 1_000 },
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
