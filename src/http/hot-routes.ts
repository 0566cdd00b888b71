import type { IncomingMessage, ServerResponse } from "node:http";
import type { Logger } from "pino";
import { recordExchange, sharedHeaders } from "./exchange.ts";
import type { Metrics } from "./metrics.ts";

/**
 * A route the TCP listener serves itself, before Hono's adapter, for the calls that dominate the
 * load (`GET /me/status`, the chat pass-through): Hono's dispatch, its middleware chain and the
 * adapter's Request/Response objects were a quarter of such a call's CPU.
 *
 * A hot route answers only what it can answer exactly as the app does, through the same domain
 * functions, error renderers and shared headers; anything else it hands to `app` (the Hono
 * listener) untouched — a request it returns `false` for at once, or one it gives up on later,
 * before it has written or changed anything (the app then answers it whole, errors included).
 * `test/hot-routes.test.ts` sends the same battery to both paths and compares the answers.
 */
export type HotRoute = (incoming: IncomingMessage, outgoing: ServerResponse, app: () => void) => boolean;

/** Routes by exact method and target (`GET /me/status`: no query string, no absolute form). */
export type HotRouteTable = Record<string, HotRoute>;

/** At most this many Host values are remembered as ones the app accepted. */
const MAX_HOSTS = 64;

/**
 * The listener's lookup: a request goes to its hot route only when its `Host` is one the app has
 * already accepted (the adapter refuses a missing or malformed one with a framing error, which
 * only the app gives), so the first request of a new Host always goes through the app.
 */
export class HotRoutes {
  private readonly table: Map<string, HotRoute>;
  private readonly hosts = new Set<string>();
  private readonly ready: () => boolean;
  private taken = 0;
  private handed = 0;

  /** `ready`: whether the node serves requests at once (not while it joins). */
  constructor(table: HotRouteTable, ready: () => boolean = () => true) {
    this.table = new Map(Object.entries(table));
    this.ready = ready;
  }

  /** The app accepted a request with this `Host`. */
  accepted(host: string | undefined): void {
    if (host !== undefined && this.hosts.size < MAX_HOSTS) this.hosts.add(host);
  }

  /** Whether a hot route took the request (it answers it, or hands it to `app` itself). */
  take(incoming: IncomingMessage, outgoing: ServerResponse, app: () => void): boolean {
    const route = this.table.get(`${incoming.method} ${incoming.url}`);
    if (!route || !this.ready()) return false;
    const host = incoming.headers.host;
    if (host === undefined || !this.hosts.has(host)) return false;
    const taken = route(incoming, outgoing, () => {
      this.handed++;
      app();
    });
    if (taken) this.taken++;
    return taken;
  }

  /** Requests a hot route took and has not handed to the app (answered, or being answered), for operators and tests. */
  get answered(): number {
    return this.taken - this.handed;
  }
}

/**
 * Writes a JSON answer as the app's Node adapter writes one that the app built whole: the shared
 * headers first, then the type (with `Retry-After`, as the adapter copies a web `Headers`:
 * lower-case names, in order), then the length. Given to `writeHead` as one flat list, the order
 * the adapter's `setHeader` calls give, without their per-header bookkeeping.
 */
export function writeJson(outgoing: ServerResponse, requestId: string, status: number, contentType: string, body: string, retryAfter?: number): void {
  const headers: string[] = [];
  sharedHeaders((name, value) => void headers.push(name, value), requestId);
  const length = String(Buffer.byteLength(body));
  if (retryAfter === undefined) headers.push("Content-Type", contentType, "Content-Length", length);
  else headers.push("content-type", contentType, "retry-after", String(retryAfter), "Content-Length", length);
  outgoing.writeHead(status, headers);
  outgoing.end(body);
}

/** What a hot route records for its request: the app's log line and metrics, for `route`. */
export function hotExchange(logger: Logger, metrics: Metrics, route: string) {
  return (requestId: string, method: string, status: number, client: string, started: number) =>
    recordExchange(logger, metrics, { requestId, method, path: route, route, status, client, ms: performance.now() - started });
}
