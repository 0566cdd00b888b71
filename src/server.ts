import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import pino, { type Logger } from "pino";
import { Catalog } from "./ai/catalog.ts";
import { ChatService } from "./ai/chat.ts";
import { ChatRouter, type ProviderFactory } from "./ai/router.ts";
import { createSpeechEngine, createTranscriptionEngine, type SpeechEngine, type TranscriptionEngine } from "./ai/speech/index.ts";
import { checkVoiceModels } from "./ai/voice-models.ts";
import { buildInfo } from "./build-info.ts";
import type { Config } from "./config/config.ts";
import { loadOrCreateServerKey } from "./config/server-key.ts";
import { encodeKey, privateKeyObject } from "./crypto/keys.ts";
import { type Clock, systemClock } from "./domain/clock.ts";
import { DAY_MS } from "./domain/context.ts";
import { DomainError } from "./domain/errors.ts";
import { DomainEvents } from "./domain/events.ts";
import { Domain } from "./domain/index.ts";
import { serverInfo } from "./domain/server-info.ts";
import { CommandError, Commands, type EventBus, openEventBus } from "./events/index.ts";
import { createApp, createSurfacesApp } from "./http/app.ts";
import { compatSurface } from "./http/compat/surface.ts";
import { createHttpServer } from "./http/listener.ts";
import { Metrics } from "./http/metrics.ts";
import type { WebRtcPort } from "./http/public/webrtc.ts";
import type { Surface } from "./http/surface.ts";
import { Store } from "./store/index.ts";
import { startTransport } from "./transport/start.ts";
import type { WebRtcTransport } from "./transport/transport.ts";
import { voiceEngines } from "./voice/engines.ts";
import { loadResampler } from "./voice/resampler.ts";
import { VoiceService } from "./voice/service.ts";

export interface StartOptions {
  config: Config;
  clock?: Clock;
  logger?: Logger;
  /** Surfaces mounted beside the Compatible API, the Public API and operations, each at its own base path. */
  surfaces?: () => Surface[];
  /** Where provider keys (`api_key_env`) are read; default the process environment. */
  env?: NodeJS.ProcessEnv;
  providerFactory?: ProviderFactory;
  /** The embedded speech engines; default the process's own (see `embeddedEngines`). */
  engines?: { speech?: SpeechEngine; transcription?: TranscriptionEngine };
  /** Warm the speech engine up in the background once listening (the command line does). */
  warmUp?: boolean;
  /** How often expired rows and old telemetry are deleted (default a minute). */
  cleanupIntervalMs?: number;
  /** After how long without an event a Side Control event stream gets a keep-alive comment (default 15 s). */
  liveKeepAliveMs?: number;
}

export interface RunningServer {
  /** `http://host:port` of the listener. */
  url: string;
  port: number;
  domain: Domain;
  store: Store;
  /** The HTTP server: a transport hands it further connections (`emit("connection", stream)`). */
  httpServer: Server;
  /** The WebRTC transport, when this node answers offers. */
  transport: WebRtcTransport | undefined;
  /** The event bus (PostgreSQL `LISTEN`/`NOTIFY` when the store is PostgreSQL, else in process). */
  events: EventBus;
  /** Commands to the node that holds a connection (over `events`). */
  commands: Commands;
  /** Stops accepting, lets in-flight requests finish, then closes the store. */
  close(): Promise<void>;
}

let engines: { speech: ReturnType<typeof createSpeechEngine>; transcription: TranscriptionEngine } | undefined;

/**
 * The embedded engines, one pair per process (each has its own queue and workers), however many
 * servers it starts: the first caller's settings apply.
 */
export function embeddedEngines(settings: { recogniserProcesses?: number } = {}): {
  speech: SpeechEngine & { warmUp(): Promise<void> };
  transcription: TranscriptionEngine;
} {
  engines ??= { speech: createSpeechEngine(), transcription: createTranscriptionEngine({ processes: settings.recogniserProcesses ?? 1 }) };
  return engines;
}

const CLEANUP_INTERVAL_MS = 60_000;
const LOG_FLUSH_INTERVAL_MS = 250;

/**
 * JSON lines on standard output, buffered and written in batches (at 4 KiB, every 250 ms, at
 * start-up, shutdown and exit): a write per request line cost about a fifth of a `GET /me/status`.
 */
function createLogger(config: Config): Logger {
  return pino({ level: config.logLevel, base: { node: config.nodeName } }, pino.destination({ dest: 1, sync: false, minLength: 4096 }));
}

/** A node built but not yet listening: its store and event bus are open, nothing accepts connections. */
export interface BuiltServer {
  domain: Domain;
  store: Store;
  events: EventBus;
  commands: Commands;
  /** The HTTP server, not yet listening. */
  httpServer: Server;
  /** Listens on `config.port` (0: any free one), starts the WebRTC transport when enabled, and the node's timers. Once only. */
  listen(): Promise<RunningServer>;
  /** Closes what `buildServer` opened, for a node that never listened (a failed `listen()` does this itself). */
  close(): Promise<void>;
}

/** Validates the configuration, opens the store and the event bus, and builds the domain and the HTTP app; listens on nothing. */
export async function buildServer(o: StartOptions): Promise<BuiltServer> {
  const { config } = o;
  const clock = o.clock ?? systemClock;
  const logger = o.logger ?? createLogger(config);
  const { speech, transcription } = o.engines ?? embeddedEngines(config.engines);
  checkVoiceModels(config, { ...(speech ? { voices: speech.voices } : {}), ...(transcription ? { languages: transcription.languages } : {}) });
  const keyPair = loadOrCreateServerKey(config.serverKeyFile ?? join(config.dataDir, "server.key"));
  const serverKey = { ...keyPair, privateKeyObject: privateKeyObject(keyPair.privateKey), publicKeyText: encodeKey(keyPair.publicKey) };
  const store = await Store.open(config.databaseUrl, config.dataDir, {
    onError: (err) => logger.warn({ err: err.message }, "a database connection failed; it is replaced on next use"),
  });
  let events: EventBus;
  try {
    events = await openEventBus(config.databaseUrl, { log: logger });
  } catch (err) {
    await store.close();
    throw err;
  }
  const commands = new Commands(events, config.nodeName);
  const domain = new Domain(
    { store, clock, config, serverKey, events: new DomainEvents(events) },
    { live: o.liveKeepAliveMs ? { keepAliveMs: o.liveKeepAliveMs } : {} },
  );
  const metrics = new Metrics(() => store.read((r) => r.sessions.countLive(clock.now())));
  const build = buildInfo();
  const webrtcEnabled = config.webrtc.enabled;
  const identity = { version: build.version, buildCommit: build.commit, ice: { udp: webrtcEnabled, tcp: false } };
  // Set by listen() once the transport runs; the WebRTC port and the command handler read it when called.
  let transport: WebRtcTransport | undefined;
  const webrtc: WebRtcPort = {
    answer: (offer, timing) => {
      if (!transport)
        throw new DomainError("unavailable", "UNAVAILABLE", "this node does not answer offers (its WebRTC transport is not running)", undefined, 1);
      return transport.answer(offer, timing);
    },
    // The device's connection may be on another node: the command goes there over the bus.
    playTone: async (key, frequency, duration) => {
      const here = transport?.playTone(key, frequency, duration);
      if (here) return here;
      const { online, node } = await domain.peers.runtime(key);
      if (!online || node === undefined || node === config.nodeName) return undefined;
      try {
        return (await commands.call(node, "audio.tone", { key, frequency, duration })) as { frames: number } | undefined;
      } catch (err) {
        if (err instanceof CommandError) return undefined;
        throw err;
      }
    },
  };
  commands.handle("audio.tone", ({ key, frequency, duration }) =>
    typeof key === "string" && typeof frequency === "number" && typeof duration === "number" ? transport?.playTone(key, frequency, duration) : undefined,
  );

  /** Voice conversations, when an agent may answer devices and the engines can hear and speak. */
  const startVoice = async (): Promise<VoiceService | undefined> => {
    if (config.agents.length === 0) return undefined;
    const found = voiceEngines(speech, transcription);
    if (typeof found === "string") {
      if (config.voice.agent) logger.warn({ reason: found }, "voice conversations are off");
      return undefined;
    }
    return new VoiceService({
      config,
      domain,
      chat,
      ...found,
      resampler: await loadResampler(),
      registry: metrics.registry,
      logger: logger.child({ component: "voice" }),
    });
  };

  const wildcard = config.host === "0.0.0.0" || config.host === "::";
  // The port the listener is bound to (config.port may be 0: any free one), read where it is used,
  // never captured before the listener has it.
  const boundPort = () => (server.address() as AddressInfo | null)?.port ?? config.port;
  const hostPort = (host: string) => (host.includes(":") ? `[${host}]:${boundPort()}` : `${host}:${boundPort()}`);
  const catalog = new Catalog(config, {
    ...(speech ? { speech: { voices: speech.voices } } : {}),
    ...(transcription ? { transcription: { languages: transcription.languages } } : {}),
  });
  const router = new ChatRouter(config, o.env, o.providerFactory);
  const chat = new ChatService({ router, catalog, domain });
  const compat = (base?: string) => (callers: Parameters<typeof compatSurface>[0]["callers"]) =>
    compatSurface({ callers, catalog, chat, router, metrics, speech, transcription, limits: config.compat, ...(base ? { base } : {}) });
  const app = createApp({
    domain,
    logger,
    metrics,
    version: build.version,
    webrtc: webrtcEnabled ? webrtc : undefined,
    // Test surfaces first: of surfaces sharing a base, the first mounted answers its unrouted paths.
    surfaces: (callers) => [...(o.surfaces?.() ?? []), compat()(callers)],
    // A wildcard listen address is not one a client can dial, so then the request's Host is used.
    serverInfo: (host) => serverInfo(domain.ctx, identity, config.publicEndpoint ?? (wildcard ? (host ?? hostPort("127.0.0.1")) : hostPort(config.host))),
  });

  /**
   * While the node joins the store (right after it took its port), requests wait for it: what they
   * write (an event stream's slot) must come after what the join clears.
   */
  let joining: Promise<void> | undefined;
  const server = createHttpServer({
    fetch: (request, env) => {
      if (!joining) return app.fetch(request, env);
      const go = () => app.fetch(request, env);
      return joining.then(go, go);
    },
    requestTimeoutMs: config.http.requestTimeoutMs,
    maxConnections: config.http.maxConnections,
    logger,
    metrics,
  });

  let closed: Promise<void> | undefined;
  /** What was opened before listening, closed in reverse order. */
  const closeOpened = () => {
    closed ??= (async () => {
      commands.close();
      await events.close();
      await store.close();
    })();
    return closed;
  };
  let listening = false;

  const listen = async (): Promise<RunningServer> => {
    if (listening) throw new Error("listen() was already called on this server");
    listening = true;
    let heartbeat: { stop(): Promise<void> } | undefined;
    /** Undoes what listening began when a later step fails: nothing that opened stays open. */
    const abandon = async () => {
      await heartbeat?.stop();
      if (heartbeat) await domain.presence.leave().catch((err) => logger.warn({ err }, "could not clear this node's records"));
      await closeOpened();
    };
    try {
      // The port first: a node that cannot take it (the same node already runs there) must not
      // touch the store, where joining clears what the running one holds.
      await new Promise<void>((resolve, reject) => {
        server.once("error", reject);
        server.listen(config.port, config.host, () => {
          server.off("error", reject);
          resolve();
        });
      });
    } catch (err) {
      // The port is taken (or not ours).
      await abandon();
      throw err;
    }
    try {
      // The node joins before it serves anything (requests wait for it): what a crashed run of it
      // left is cleared, and its heartbeat (which makes its peers' records and its event streams
      // count) starts.
      joining = domain.presence.join();
      await joining;
      heartbeat = domain.presence.startHeartbeat({
        onError: (err) => logger.warn({ err: err instanceof Error ? err.message : String(err) }, "node heartbeat failed; retrying"),
        onRecovered: () => logger.info("node heartbeat written again"),
      });
    } catch (err) {
      // The store failed.
      server.close();
      await abandon();
      throw err;
    } finally {
      joining = undefined;
    }
    if (webrtcEnabled) {
      try {
        // Stream 1 serves this same application; stream 2 the Compatible API at `/v1`.
        const compatibleApi = createSurfacesApp({ domain, logger, metrics }, (callers) => [compat("/v1")(callers)]);
        const voice = await startVoice();
        transport = await startTransport(config, {
          voice,
          domain,
          logger,
          registry: metrics.registry,
          httpMetrics: metrics,
          httpPort: boundPort(),
          publicApi: app.fetch,
          compatibleApi: compatibleApi.fetch,
        });
      } catch (err) {
        server.close();
        await abandon();
        throw err;
      }
    }

    let cleaning = false;
    const cleanup = setInterval(() => {
      if (cleaning) return;
      cleaning = true;
      const now = clock.now();
      store
        .deleteExpired(now, now - config.telemetry.retentionDays * DAY_MS)
        .then(() => domain.live.sweep())
        .catch((err) => logger.warn({ err }, "cleanup of expired rows failed"))
        .finally(() => (cleaning = false));
    }, o.cleanupIntervalMs ?? CLEANUP_INTERVAL_MS);
    cleanup.unref();

    // The start-up line is written at any level but "silent": operators and scripts look for it.
    const startup = logger.level === "silent" ? logger : logger.child({}, { level: "info" });
    startup.info({ address: hostPort(config.host), server_public_key: serverKey.publicKeyText, store: store.dialect }, "perch listening");
    // The recogniser's models load in their worker threads while the server already answers.
    transcription?.start?.().catch((err: unknown) => logger.error({ err }, "the transcription engine could not load its models"));
    if (o.warmUp && speech && "warmUp" in speech && typeof speech.warmUp === "function") {
      (speech.warmUp as () => Promise<void>)().catch((err: unknown) => logger.warn({ err }, "speech engine warm-up failed"));
    }
    logger.flush();
    const logFlush = setInterval(() => logger.flush(), LOG_FLUSH_INTERVAL_MS);
    logFlush.unref();

    let closing: Promise<void> | undefined;
    return {
      url: `http://${hostPort(wildcard ? "127.0.0.1" : config.host)}`,
      port: boundPort(),
      domain,
      store,
      httpServer: server,
      transport,
      events,
      commands,
      close() {
        closing ??= shutdown({ server, domain, transport, heartbeat, closeOpened, logger, cleanup, logFlush });
        return closing;
      },
    };
  };

  return {
    domain,
    store,
    events,
    commands,
    httpServer: server,
    listen,
    close: () => {
      if (listening) return Promise.reject(new Error("the server listens: close the RunningServer that listen() returned"));
      return closeOpened();
    },
  };
}

/**
 * Stops accepting first; closes the event streams and the WebRTC connections while in-flight
 * requests finish; then the node leaves the store (`presence.leave`), closes the bus and the
 * store, and flushes the log.
 */
async function shutdown(n: {
  server: Server;
  domain: Domain;
  transport: WebRtcTransport | undefined;
  heartbeat: { stop(): Promise<void> } | undefined;
  closeOpened: () => Promise<void>;
  logger: Logger;
  cleanup: NodeJS.Timeout;
  logFlush: NodeJS.Timeout;
}): Promise<void> {
  const { server } = n;
  clearInterval(n.cleanup);
  const stopped = new Promise<void>((resolve) => {
    server.close(() => resolve());
    server.closeIdleConnections();
    // A kept-alive connection whose in-flight response finishes later is closed too: close()
    // waits for requests, not for idle clients to hang up (up to the keep-alive timeout).
    const sweep = setInterval(() => server.closeIdleConnections(), 50);
    server.once("close", () => clearInterval(sweep));
  });
  // Event streams never finish by themselves: they end here, and their clients reconnect elsewhere.
  n.domain.live.close();
  await n.transport?.close();
  await stopped;
  // The node leaves: its peers offline, its event stream rows and its heartbeat gone.
  await n.heartbeat?.stop();
  await n.domain.presence.leave().catch((err) => n.logger.error({ err }, "could not clear this node's records"));
  await n.closeOpened();
  clearInterval(n.logFlush);
  n.logger.flush();
}

/** Builds the node and listens: `buildServer(o)` then `listen()`. */
export async function startServer(o: StartOptions): Promise<RunningServer> {
  return (await buildServer(o)).listen();
}
