import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { serve } from "@hono/node-server";
import pino, { type Logger } from "pino";
import { buildInfo } from "./build-info.ts";
import type { Config } from "./config/config.ts";
import { loadOrCreateServerKey } from "./config/server-key.ts";
import { encodeKey, privateKeyObject } from "./crypto/keys.ts";
import { type Clock, systemClock } from "./domain/clock.ts";
import { DomainError } from "./domain/errors.ts";
import { Domain } from "./domain/index.ts";
import { serverInfo } from "./domain/server-info.ts";
import { createApp } from "./http/app.ts";
import { Metrics } from "./http/metrics.ts";
import type { WebRtcPort } from "./http/public/webrtc.ts";
import { Store } from "./store/index.ts";
import { startTransport } from "./transport/start.ts";
import type { WebRtcTransport } from "./transport/transport.ts";

export interface StartOptions {
  config: Config;
  clock?: Clock;
  logger?: Logger;
}

export interface RunningServer {
  /** `http://host:port` of the listener. */
  url: string;
  port: number;
  domain: Domain;
  store: Store;
  /** The WebRTC transport, when this node answers offers. */
  transport: WebRtcTransport | undefined;
  /** Stops accepting, lets in-flight requests finish, then closes the store. */
  close(): Promise<void>;
}

const CLEANUP_INTERVAL_MS = 60_000;

function createLogger(config: Config): Logger {
  return pino({ level: config.logLevel, base: { node: config.nodeName } });
}

/** Opens the store, builds the domain and the HTTP app, and listens. */
export async function startServer(o: StartOptions): Promise<RunningServer> {
  const { config } = o;
  const clock = o.clock ?? systemClock;
  const logger = o.logger ?? createLogger(config);
  const keyPair = loadOrCreateServerKey(config.serverKeyFile ?? join(config.dataDir, "server.key"));
  const serverKey = { ...keyPair, privateKeyObject: privateKeyObject(keyPair.privateKey), publicKeyText: encodeKey(keyPair.publicKey) };
  const store = await Store.open(config.databaseUrl, config.dataDir);
  const domain = new Domain({ store, clock, config, serverKey });
  const metrics = new Metrics(() => store.sessions.countLive(clock.now()));
  const build = buildInfo();
  const webrtcEnabled = config.webrtc.enabled;
  const identity = { version: build.version, buildCommit: build.commit, ice: { udp: webrtcEnabled, tcp: false } };
  let transport: WebRtcTransport | undefined;
  const webrtc: WebRtcPort = {
    answer: (offer, timing) => {
      if (!transport) throw new DomainError("unavailable", "CAPACITY_EXCEEDED", "the transport is not running", undefined, 1);
      return transport.answer(offer, timing);
    },
    playTone: (key, frequency, duration) => transport?.playTone(key, frequency, duration),
  };

  let port = config.port;
  const wildcard = config.host === "0.0.0.0" || config.host === "::";
  const hostPort = (host: string) => (host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`);
  const app = createApp({
    domain,
    logger,
    metrics,
    version: build.version,
    webrtc: webrtcEnabled ? webrtc : undefined,
    // A wildcard listen address is not one a client can dial, so then the request's Host is used.
    serverInfo: (host) => serverInfo(domain.ctx, identity, config.publicEndpoint ?? (wildcard ? (host ?? hostPort("127.0.0.1")) : hostPort(config.host))),
  });

  const server = await new Promise<ReturnType<typeof serve>>((resolve, reject) => {
    const s = serve({ fetch: app.fetch, port: config.port, hostname: config.host }, () => resolve(s));
    s.once("error", reject);
  });
  port = (server.address() as AddressInfo).port;
  if (webrtcEnabled) {
    try {
      transport = await startTransport(config, { domain, logger, registry: metrics.registry, httpPort: port, publicApi: app.fetch });
    } catch (err) {
      server.close();
      await store.close();
      throw err;
    }
  }

  const cleanup = setInterval(() => {
    store.deleteExpired(clock.now()).catch((err) => logger.warn({ err }, "cleanup of expired rows failed"));
  }, CLEANUP_INTERVAL_MS);
  cleanup.unref();

  const url = `http://${hostPort(wildcard ? "127.0.0.1" : config.host)}`;
  // The start-up line is written at any level but "silent": operators and scripts look for it.
  const startup = logger.level === "silent" ? logger : logger.child({}, { level: "info" });
  startup.info({ address: hostPort(config.host), server_public_key: serverKey.publicKeyText, store: store.dialect }, "perch listening");

  let closing: Promise<void> | undefined;
  return {
    url,
    port,
    domain,
    store,
    transport,
    close() {
      closing ??= (async () => {
        clearInterval(cleanup);
        // Stop accepting first; then close the WebRTC connections while requests finish.
        const stopped = new Promise<void>((resolve) => {
          server.close(() => resolve());
          if ("closeIdleConnections" in server) {
            server.closeIdleConnections();
            // A kept-alive connection whose in-flight response finishes later is closed too: close()
            // waits for requests, not for idle clients to hang up (up to the keep-alive timeout).
            const sweep = setInterval(() => server.closeIdleConnections(), 50);
            server.once("close", () => clearInterval(sweep));
          }
        });
        await transport?.close();
        await stopped;
        await store.close();
      })();
      return closing;
    },
  };
}
