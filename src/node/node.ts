import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import pino, { type Logger } from "pino";
import { startToolbox, type Toolbox } from "../ai/agents/toolbox.ts";
import { Catalog } from "../ai/catalog.ts";
import { ChatService } from "../ai/chat.ts";
import { InFlight } from "../ai/in-flight.ts";
import { ChatRouter, type ProviderFactory, unsetKeyVariables } from "../ai/router.ts";
import { checkVoiceModels } from "../ai/voice-models.ts";
import { buildInfo } from "../build-info.ts";
import { Commands, type EventBus, openEventBus } from "../bus/index.ts";
import { type Config, configWarnings } from "../config/config.ts";
import { loadOrCreateServerKey } from "../config/server-key.ts";
import { encodeKey, privateKeyObject } from "../crypto/keys.ts";
import { DomainEvents } from "../domain/changes.ts";
import { type Clock, systemClock } from "../domain/clock.ts";
import { DAY_MS, type DomainContext } from "../domain/context.ts";
import { Domain } from "../domain/index.ts";
import { serverInfo } from "../domain/server-info.ts";
import { createApp, createSurfacesApp, type HttpApp, listenerOf } from "../http/app.ts";
import { JsonBodies } from "../http/compat/json.ts";
import { compatSurface } from "../http/compat/surface.ts";
import { inProcess } from "../http/in-process.ts";
import { createHttpServer } from "../http/listener.ts";
import { Metrics } from "../http/metrics.ts";
import type { Callers } from "../http/principal.ts";
import type { RouteEntry, Surface } from "../http/surface.ts";
import { readTlsFiles, type TlsFiles } from "../http/tls.ts";
import { toolSummary } from "../mcp/device.ts";
import { Tracing } from "../observability/tracing.ts";
import { Store } from "../store/index.ts";
import { startTransport } from "../transport/start.ts";
import type { WebRtcTransport } from "../transport/transport.ts";
import { embeddedPorts } from "../voice/embedded-engines.ts";
import { type EngineFor, engineChooser } from "../voice/engine-choice.ts";
import type { VoiceActivityPort } from "../voice/engine-ports.ts";
import { completeText, MemoryRewriter } from "../voice/memory-rewriter.ts";
import { VoiceService } from "../voice/service.ts";
import { EngineHost, type EngineParts, enginesAtStart } from "./engines.ts";
import { CpuWindow, Fleet } from "./fleet.ts";
import { Closers, Jobs } from "./jobs.ts";
import { BatchedLines } from "./log-lines.ts";
import { usageHooks } from "./usage-hooks.ts";
import { nodeWebRtcPort } from "./webrtc-port.ts";

export interface StartOptions {
  config: Config;
  clock?: Clock;
  logger?: Logger;
  /** Surfaces mounted beside the Compatible API, the Public API and operations, each at its own base path. */
  surfaces?: () => Surface[];
  /** Where provider keys (`api_key_env`) are read; default the process environment. */
  env?: NodeJS.ProcessEnv;
  providerFactory?: ProviderFactory;
  /**
   * The node's engine host; default one of its own, made from `config.engines` and closed with it.
   * A host given here is the caller's to close (tests share one between the nodes of a process);
   * engines given alone are put in a host of the node's own (its JSON thread, its resampler).
   */
  engines?: EngineHost | EngineParts;
  /** Warm the speech engine up in the background once listening, when an agent speaks on it (the command line does). */
  warmUp?: boolean;
  /** How often expired rows and old telemetry are deleted (default a minute). */
  cleanupIntervalMs?: number;
  /** After how long without an event a Side Control event stream gets a keep-alive comment (default 15 s). */
  liveKeepAliveMs?: number;
  /** The process's CPU over the last 5 s as a share of one core (default measured: `CpuWindow`); tests give their own. */
  cpuShare?: () => number;
}

export interface RunningServer {
  /** `http://host:port` of the listener. */
  url: string;
  port: number;
  domain: Domain;
  store: Store;
  /** The HTTP server: a transport hands it further connections (`emit("connection", stream)`). */
  httpServer: Server;
  /** Serves one request in process, through the exchange, as the listener would (`src/http/in-process.ts`). */
  request(path: string, init?: RequestInit): Promise<Response>;
  /** The WebRTC transport, when this node answers offers. */
  transport: WebRtcTransport | undefined;
  /** The event bus (PostgreSQL `LISTEN`/`NOTIFY` when the store is PostgreSQL, else in process). */
  events: EventBus;
  /** Commands to the node that holds a connection (over `events`). */
  commands: Commands;
  /** Rewrites devices' memories after their conversations. */
  memory: MemoryRewriter;
  /** The node's engine host. */
  engines: EngineHost;
  /** Chat and agents (the Compatible API's and the voice turns'). */
  chat: ChatService;
  /** The node's tracing; undefined when off (no `tracing.otlp`). */
  tracing: Tracing | undefined;
  /** Stops accepting, lets in-flight requests finish, then the node leaves and closes the store. */
  close(): Promise<void>;
  /**
   * Drains (fleet.md §3): refuses new devices at once, hands each connected device to another
   * node once it is not talking (`node.reconnect`), then closes as `close()` does. Resolves once closed.
   */
  drain(): Promise<void>;
  /** Resolves once the node closed, however (a drain asked through the store ends the node too). */
  readonly finished: Promise<void>;
  /** The node's state in its fleet now. */
  fleetState(): "serving" | "full" | "draining";
}

const CLEANUP_INTERVAL_MS = 60_000;
const LOG_FLUSH_INTERVAL_MS = 250;
const USAGE_FLUSH_INTERVAL_MS = 1_000;

/**
 * JSON lines on standard output, buffered and written in batches (at 4 KiB, every 250 ms, at
 * start-up, shutdown and exit): a write per request line cost about a fifth of a `GET /me/status`.
 * The batches are gathered in front of pino's destination, which writes each at once (see `BatchedLines`).
 */
function createLogger(config: Config): { logger: Logger; lines: BatchedLines } {
  const lines = new BatchedLines(pino.destination({ dest: 1, sync: false, minLength: 0 }));
  return { logger: pino({ level: config.log_level, base: { node: config.node_name } }, lines), lines };
}

/** What `Node.build` opened before the node's parts are wired: the store and the event bus. */
interface Opened {
  logger: Logger;
  serverKey: DomainContext["serverKey"];
  store: Store;
  events: EventBus;
  closers: Closers;
  tls: TlsFiles | undefined;
  /** The log's batcher, when the node made its logger. */
  lines: BatchedLines | undefined;
}

/**
 * One Perch node, in three steps: `build` (configuration checked, store and event bus open, domain
 * and HTTP application wired; nothing accepts connections), `listen` (the port, the node's presence
 * in the store, the WebRTC transport, the periodic jobs) and `close` (the reverse, from any step).
 */
export class Node {
  readonly config: Config;
  readonly clock: Clock;
  readonly logger: Logger;
  readonly store: Store;
  readonly events: EventBus;
  readonly commands: Commands;
  readonly domain: Domain;
  readonly metrics: Metrics;
  /** The node's tracing (voice.md §8); undefined when `tracing.otlp` is not configured. */
  readonly tracing: Tracing | undefined;
  readonly chat: ChatService;
  private readonly tools: Toolbox;
  /** Rewrites devices' memories after their conversations. */
  readonly memory: MemoryRewriter;
  /** The HTTP server; it listens once `listen()` took the port. */
  readonly httpServer: Server;
  /** The periodic jobs, started by `listen()` and stopped first at shutdown. */
  readonly jobs: Jobs;
  /** Set by `listen()` when the configuration enables WebRTC. */
  transport: WebRtcTransport | undefined;
  private readonly o: StartOptions;
  /** The node's engine host (`src/node/engines.ts`). */
  readonly engines: EngineHost;
  private readonly serverKey: DomainContext["serverKey"];
  /** The HTTP application: the surfaces' routes, served by the exchange (`src/http/exchange.ts`). */
  private readonly app: HttpApp;
  private readonly lines: BatchedLines | undefined;
  /** Serves one request in process, through the exchange, as the listener would (no port taken; the fast tests' layer). */
  readonly request: (path: string, init?: RequestInit) => Promise<Response>;

  /** Every route the node's HTTP listener serves (native and Hono), by surface: what tracing names spans by, what tests walk. */
  get routes(): readonly RouteEntry[] {
    return this.app.table;
  }
  /** `https` when `tls` is configured. */
  private readonly scheme: "http" | "https";
  private readonly compat: (base?: string) => (callers: Callers) => Surface;
  /** The node's voice activity detector, and each agent's voice engines (from the catalog). */
  private readonly voiceEngines: { activity: VoiceActivityPort | undefined; engineFor: EngineFor };
  /** What `build` opened (store, bus, command handlers), closed last. */
  private readonly closers: Closers;
  private heartbeat: { stop(): Promise<void> } | undefined;
  /** While the node joins the store, requests wait for it (see `listen`). */
  private joining: Promise<void> | undefined;
  private listening = false;
  private closing: Promise<void> | undefined;
  private draining: Promise<void> | undefined;
  /** This node's state in its fleet (fleet.md): admission and drain. */
  readonly fleet: Fleet;
  private voice: VoiceService | undefined;
  private finish: () => void = () => {};
  /** Resolves once the node closed. */
  readonly finished: Promise<void> = new Promise((resolve) => (this.finish = resolve));

  /** Checks the configuration, opens the store and the event bus, and wires the node; listens on nothing. */
  static async build(o: StartOptions): Promise<Node> {
    const { config } = o;
    const made = o.logger ? undefined : createLogger(config);
    const logger = o.logger ?? made!.logger;
    for (const warning of configWarnings(config)) logger.warn(warning);
    for (const { provider, variable } of unsetKeyVariables(config.providers, o.env ?? process.env))
      logger.warn({ provider, variable }, `provider ${provider}: its key variable ${variable} (api_key_env) is not set; its calls will fail until it is`);
    // With no agent no device converses: no turn can need Moonshine tiny, so it is not loaded.
    const given = o.engines;
    const engines =
      given instanceof EngineHost
        ? given
        : given
          ? EngineHost.of(given)
          : // Said once per pool, to this node's log, when a speech worker cannot be given its lower priority.
            EngineHost.embedded(config.agents.length > 0 ? config.engines : { ...config.engines, fast_recognition_after_ms: false }, (message) =>
              logger.warn(message),
            );
    const { speech, transcription } = engines;
    // Said once per failed attempt, naming the engine: a request or turn that finds it failed gets a 503 naming it.
    engines.watchLoads(({ engine, model, err, retryInMs }) =>
      logger.error({ engine, model, err, retry_in_ms: retryInMs }, "an embedded engine could not load its model; it is tried again on a use after the wait"),
    );
    checkVoiceModels(config, { ...(speech ? { voices: speech.voices } : {}), ...(transcription ? { languages: transcription.languages } : {}) });
    // The certificate before anything is opened: a file that cannot serve stops the start here.
    const tls = config.tls ? readTlsFiles(config.tls) : undefined;
    const keyPair = loadOrCreateServerKey(config.server_key_file ?? join(config.data_dir, "server.key"));
    const serverKey = { ...keyPair, privateKeyObject: privateKeyObject(keyPair.privateKey), publicKeyText: encodeKey(keyPair.publicKey) };
    const closers = new Closers();
    if (engines !== given) closers.defer(() => engines.close());
    const store = await Store.open(config.database_url, config.data_dir, {
      onError: (err) => logger.warn({ err: err.message }, "a database connection failed; it is replaced on next use"),
    });
    closers.defer(() => store.close());
    // Deleted recordings out of PostgreSQL's files (voice.md §8): a rewrite that failed is tried again later and with the next deletion.
    store.onCompactError = (err) =>
      logger.warn({ err: err instanceof Error ? err.message : String(err) }, "the recordings table could not be rewritten after deletions; tried again later");
    store.onCompactWait = (older) =>
      logger.debug({ transactions: older }, "the recordings table's rewrite waits for transactions older than the deletion (they may still read it)");
    try {
      const events = await openEventBus(config.database_url, {
        log: logger,
        sqlite: {
          file: store.sqliteFile,
          pollMs: config.webrtc.peer_poll_ms,
          persist: (origin, topic, message) => store.transaction((tx) => tx.busMessages.add(origin, topic, message, Date.now())),
        },
      });
      closers.defer(() => events.close());
      return new Node(o, engines, { logger, serverKey, store, events, closers, tls, lines: made?.lines });
    } catch (err) {
      await closers.close();
      throw err;
    }
  }

  private constructor(o: StartOptions, engines: Node["engines"], opened: Opened) {
    const { config } = o;
    this.o = o;
    this.config = config;
    this.engines = engines;
    this.clock = o.clock ?? systemClock;
    ({ logger: this.logger, serverKey: this.serverKey, store: this.store, events: this.events, closers: this.closers, lines: this.lines } = opened);
    this.commands = new Commands(this.events, config.node_name);
    this.closers.defer(() => this.commands.close());
    this.domain = new Domain(
      { store: this.store, clock: this.clock, config, serverKey: this.serverKey, events: new DomainEvents(this.events) },
      { live: o.liveKeepAliveMs ? { keepAliveMs: o.liveKeepAliveMs } : {} },
    );
    this.metrics = new Metrics(
      () => this.store.read((r) => r.sessions.countLive(this.clock.now())),
      () => engines.schedulers(),
      () => engines.states(),
    );
    this.tracing = Tracing.of(config.tracing, {
      registry: this.metrics.registry,
      env: o.env ?? process.env,
      node: config.node_name,
      version: buildInfo().version,
      warn: (message, err) => this.logger.warn({ err: err instanceof Error ? err.message : err }, message),
    });
    // Deferred early, so run late: what the node's parts end last is still sent.
    if (this.tracing) this.closers.defer(() => this.tracing?.shutdown());
    this.jobs = new Jobs(this.logger);
    const cpu = o.cpuShare ? undefined : new CpuWindow();
    if (cpu) this.closers.defer(async () => cpu.stop());
    this.fleet = new Fleet(config.fleet, {
      counts: () => ({ connections: this.transport?.size ?? 0, conversations: this.voice?.size ?? 0 }),
      cpu: o.cpuShare ?? (() => cpu!.share()),
    });
    this.domain.usage.meter.setHooks(usageHooks(this.domain, this.metrics.registry, this.logger.child({ component: "usage" })));
    const { speech, transcription } = engines;
    const catalog = new Catalog(config, {
      ...(speech ? { speech: { voices: speech.voices } } : {}),
      ...(transcription ? { transcription: { languages: transcription.languages } } : {}),
    });
    const router = new ChatRouter(config, engines.json, o.env, o.providerFactory);
    const bodies = new JsonBodies(engines.json);
    const embeddedVoice = embeddedPorts(speech, transcription);
    this.voiceEngines = {
      activity: embeddedVoice.activity,
      engineFor: engineChooser({ catalog, embedded: embeddedVoice, providers: { config, remote: { router, inFlight: new InFlight() } } }),
    };
    const tools = startToolbox(config, {
      domain: this.domain,
      logger: this.logger,
      env: o.env ?? process.env,
      registry: this.metrics.registry,
      devices: (key) => this.transport?.deviceTools(key),
    });
    this.tools = tools;
    this.closers.defer(() => tools.close());
    this.commands.handle("device.tools", ({ key }) => (typeof key === "string" ? toolSummary(this.transport?.deviceTools(key)) : undefined));
    this.chat = new ChatService({ router, catalog, tools, usage: this.domain.usage.meter });
    this.memory = new MemoryRewriter({
      memory: this.domain.memory,
      complete: (publicKey, model, messages, signal) => completeText(this.chat, publicKey, model, messages, signal),
      registry: this.metrics.registry,
      logger: this.logger.child({ component: "memory" }),
    });
    // Rewrites under way finish (or are aborted) before the store closes.
    this.closers.defer(() => this.memory.close());
    this.compat = (base) => (callers) =>
      compatSurface({
        callers,
        catalog,
        chat: this.chat,
        router,
        metrics: this.metrics,
        logger: this.logger,
        speech,
        transcription,
        limits: config.compat,
        bodies,
        usage: this.domain.usage.meter,
        ...(base ? { base } : {}),
      });
    this.app = this.createApp();
    const served = {
      // Requests wait while the node joins: what they write (an event stream's slot) must come after what the join clears.
      listener: listenerOf(this.app, () => this.joining),
      requestTimeoutMs: config.http.request_timeout_ms,
      maxConnections: config.http.max_connections,
      logger: this.logger,
      metrics: this.metrics,
    };
    this.httpServer = createHttpServer({ ...served, tls: opened.tls });
    this.scheme = opened.tls ? "https" : "http";
    // In-process requests are plain HTTP on a server of their own when the port serves HTTPS.
    this.request = inProcess(opened.tls ? createHttpServer(served) : this.httpServer);
  }

  private createApp(): HttpApp {
    const build = buildInfo();
    const webrtcEnabled = this.config.webrtc.enabled;
    const identity = { version: build.version, buildCommit: build.commit, ice: { udp: webrtcEnabled, tcp: false } };
    const { host, public_endpoint } = this.config;
    const wildcard = host === "0.0.0.0" || host === "::";
    return createApp({
      domain: this.domain,
      logger: this.logger,
      metrics: this.metrics,
      tracing: this.tracing,
      version: build.version,
      webrtc: webrtcEnabled ? { ...nodeWebRtcPort(this), admit: () => this.fleet.admit() } : undefined,
      fleetState: () => this.fleet.state(),
      // Test surfaces first: of surfaces sharing a base, the first mounted answers its unrouted paths.
      surfaces: (callers) => [...(this.o.surfaces?.() ?? []), this.compat()(callers)],
      // A wildcard listen address is not one a client can dial, so then the request's Host is used.
      serverInfo: (requestHost) =>
        serverInfo(this.domain.ctx, identity, public_endpoint ?? (wildcard ? (requestHost ?? this.hostPort("127.0.0.1")) : this.hostPort(host))),
    });
  }

  /** The port the listener is bound to (`config.port` may be 0: any free one). */
  get port(): number {
    return (this.httpServer.address() as AddressInfo | null)?.port ?? this.config.port;
  }

  private hostPort(host: string): string {
    return host.includes(":") ? `[${host}]:${this.port}` : `${host}:${this.port}`;
  }

  /**
   * Takes the port, joins the store, starts the WebRTC transport when enabled and the periodic
   * jobs. Once only; when a step fails, what the earlier ones began is closed and the error thrown.
   */
  async listen(): Promise<RunningServer> {
    if (this.listening || this.closing) throw new Error("listen() was already called on this server");
    this.listening = true;
    try {
      // The port first: a node that cannot take it (the same node already runs there) must not
      // touch the store, where joining clears what the running one holds.
      await new Promise<void>((resolve, reject) => {
        this.httpServer.once("error", reject);
        this.httpServer.listen(this.config.port, this.config.host, () => {
          this.httpServer.off("error", reject);
          resolve();
        });
      });
      await this.join();
      if (this.config.webrtc.enabled) this.transport = await this.startTransport();
    } catch (err) {
      await this.close();
      throw err;
    }
    this.startJobs();
    this.announce();
    return this.running();
  }

  /**
   * The node joins before it serves anything (requests wait for it): what a crashed run of it left
   * is cleared, and its heartbeat (which makes its peers' records and its event streams count) starts.
   */
  private async join(): Promise<void> {
    this.joining = this.domain.presence.join(
      this.config.public_endpoint ?? this.hostPort(this.config.host === "0.0.0.0" || this.config.host === "::" ? "127.0.0.1" : this.config.host),
    );
    try {
      await this.joining;
    } finally {
      this.joining = undefined;
    }
    this.heartbeat = this.domain.presence.startHeartbeat({
      onError: (err) => this.logger.warn({ err: err instanceof Error ? err.message : String(err) }, "node heartbeat failed; retrying"),
      onRecovered: () => this.logger.info("node heartbeat written again"),
      report: () => this.fleet.report(),
      onDrainRequested: () => {
        if (this.draining || this.closing) return;
        this.logger.info("a drain of this node was asked through the store");
        void this.drain();
      },
    });
  }

  /** The WebRTC transport: stream 1 serves this same application, stream 2 the Compatible API at `/v1`. */
  private async startTransport(): Promise<WebRtcTransport> {
    const compatibleApi = createSurfacesApp({ domain: this.domain, logger: this.logger, metrics: this.metrics, tracing: this.tracing }, (callers) => [
      this.compat("/v1")(callers),
    ]);
    return startTransport(this.config, {
      voice: await this.startVoice(),
      domain: this.domain,
      logger: this.logger,
      registry: this.metrics.registry,
      httpMetrics: this.metrics,
      httpPort: this.port,
      publicApi: listenerOf(this.app),
      compatibleApi: listenerOf(compatibleApi),
    });
  }

  /** Voice conversations, when an agent may answer devices and the engines can hear and speak. */
  private async startVoice(): Promise<VoiceService | undefined> {
    if (this.config.agents.length === 0) return undefined;
    const { activity, engineFor } = this.voiceEngines;
    if (!activity) {
      if (this.config.voice.agent) this.logger.warn({ reason: "voice activity detection needs the embedded recogniser" }, "voice conversations are off");
      return undefined;
    }
    const voice = new VoiceService({
      config: this.config,
      domain: this.domain,
      chat: this.chat,
      activity,
      engineFor,
      resampler: await this.engines.resampler(),
      registry: this.metrics.registry,
      logger: this.logger.child({ component: "voice" }),
      toolbox: this.tools,
      env: this.o.env ?? process.env,
      memory: this.memory,
      tracing: this.tracing,
    });
    this.closers.defer(() => voice.close());
    this.voice = voice;
    return voice;
  }

  /** The periodic jobs of a listening node; a capability with a job of its own adds one line here. */
  private startJobs(): void {
    const { config, clock, store } = this;
    this.jobs.every("cleanup of expired rows", this.o.cleanupIntervalMs ?? CLEANUP_INTERVAL_MS, async () => {
      const now = clock.now();
      await store.deleteExpired(now, now - config.telemetry.retention_days * DAY_MS);
      await this.domain.live.sweep();
    });
    this.jobs.every("transcript retention", this.o.cleanupIntervalMs ?? CLEANUP_INTERVAL_MS, () => this.domain.conversations.sweep());
    this.jobs.every("log flush", LOG_FLUSH_INTERVAL_MS, () => this.logger.flush());
    // Usage counted in memory reaches the store at least once a second (usage.md §1).
    this.jobs.every("usage flush", USAGE_FLUSH_INTERVAL_MS, () => this.domain.usage.meter.flush(true));
    this.jobs.every("usage retention", this.o.cleanupIntervalMs ?? CLEANUP_INTERVAL_MS, () => this.domain.usage.sweep());
  }

  /** The start-up line, then the background loading of the engines the node needs now (`enginesAtStart`). */
  private announce(): void {
    // Written at any level but "silent": operators and scripts look for it.
    const startup = this.logger.level === "silent" ? this.logger : this.logger.child({}, { level: "info" });
    startup.info(
      { address: this.hostPort(this.config.host), scheme: this.scheme, server_public_key: this.serverKey.publicKeyText, store: this.store.dialect },
      "perch listening",
    );
    const wanted = enginesAtStart(this.config);
    // flite's warm-up for agents is the command line's (`warmUp`): test servers sharing one host leave it to the first sentence.
    const { preload } = this.config.engines;
    if (!this.o.warmUp && preload !== true && !(Array.isArray(preload) && preload.includes("speech"))) wanted.delete("speech");
    // The models load in their worker processes while the server already answers; once they and the
    // speech warm-up are done, a line says so (the start-up's CPU is then spent).
    const started = performance.now();
    const loading = this.engines.load(wanted).map(({ engine, ready }) =>
      ready.then(
        () => true,
        (err: unknown) => {
          // A model's failure is said where it happens (`watchLoads`), once per attempt.
          if (engine === "speech") this.logger.warn({ err }, "speech engine warm-up failed");
          return false;
        },
      ),
    );
    if (loading.length > 0) {
      void Promise.all(loading).then(
        (done) => done.every(Boolean) && startup.info({ ms: Math.round(performance.now() - started), engines: [...wanted] }, "speech engines ready"),
      );
    }
    this.logger.flush();
  }

  private running(): RunningServer {
    const wildcard = this.config.host === "0.0.0.0" || this.config.host === "::";
    const { domain, store, httpServer, request, transport, events, commands, memory, engines, chat, tracing } = this;
    return {
      url: `${this.scheme}://${this.hostPort(wildcard ? "127.0.0.1" : this.config.host)}`,
      port: this.port,
      domain,
      store,
      httpServer,
      request,
      transport,
      events,
      commands,
      memory,
      engines,
      chat,
      tracing,
      close: () => this.close(),
      drain: () => this.drain(),
      finished: this.finished,
      fleetState: () => this.fleet.state(),
    };
  }

  /** Shuts the node down from whatever step it reached; once (later calls get the same promise). */
  close(): Promise<void> {
    this.closing ??= this.shutdown().finally(() => this.finish());
    return this.closing;
  }

  /**
   * Drains (fleet.md §3), once: state `draining` at once (offers and `/readyz` 503, its row says so),
   * Side Control event streams closed (their apps reconnect through the balancer), each device
   * handed over with `node.reconnect` when not talking, whatever is left after
   * `fleet.drain_timeout_s` the same way; then `close()` (in-flight requests answered, the row
   * `gone`, the store closed). A `close()` meanwhile stops at once.
   */
  drain(): Promise<void> {
    this.draining ??= (async () => {
      if (this.closing) return this.closing;
      this.fleet.startDraining();
      const deadline = performance.now() + this.config.fleet.drain_timeout_s * 1000;
      this.logger.info({ connections: this.transport?.size ?? 0, timeout_s: this.config.fleet.drain_timeout_s }, "draining");
      this.logger.flush();
      // The row says draining now, not at the next beat (an operator's `perch nodes` sees it at once).
      if (this.heartbeat) await this.domain.presence.beat(this.fleet.report()).catch((err) => this.logger.warn({ err }, "could not write the draining state"));
      this.domain.live.close();
      await this.transport?.drain(deadline);
      await this.close();
    })();
    return this.draining;
  }

  /**
   * Stops accepting first; closes the event streams and the WebRTC connections while in-flight
   * requests finish; then the node leaves the store (`presence.leave`, the one writer of its peers'
   * offline records at shutdown), closes what `build` opened, and flushes the log.
   */
  private async shutdown(): Promise<void> {
    await this.jobs.stop();
    const server = this.httpServer;
    const stopped = new Promise<void>((resolve) => {
      if (!server.listening) return resolve();
      server.close(() => resolve());
      server.closeIdleConnections();
      // A kept-alive connection whose in-flight response finishes later is closed too: close()
      // waits for requests, not for idle clients to hang up (up to the keep-alive timeout).
      const sweep = setInterval(() => server.closeIdleConnections(), 50);
      server.once("close", () => clearInterval(sweep));
    });
    // Event streams never finish by themselves: they end here, and their clients reconnect elsewhere.
    this.domain.live.close();
    await this.transport?.close();
    await stopped;
    // What was counted and not written yet, before the store closes.
    await this.domain.usage.meter.close();
    if (this.heartbeat) {
      await this.heartbeat.stop();
      await this.domain.presence.leave().catch((err) => this.logger.error({ err }, "could not clear this node's records"));
    }
    await this.closers.close();
    this.logger.flush();
    this.lines?.close();
  }
}
