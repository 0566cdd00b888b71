import type { AppBindings } from "./env.ts";

/**
 * What a transport knows about the connection a request arrived on when the request itself carries
 * no credential and no socket address: a DataChannel stream belongs to a connection that already
 * proved its key.
 */
export interface ConnectionContext {
  /** The peer's X25519 public key (base58), authenticated by the connection. */
  peerKey: string;
  /** The peer's IP address as the transport sees it: per-address limits and logs use it. */
  remoteAddress: string;
}

/** Where a bound stream carries its context (a property of the stream itself: no process-wide table). */
const CONTEXT = Symbol("connection context");
type Bound = { [CONTEXT]?: ConnectionContext };

/**
 * Binds `context` to a stream before it is handed to the HTTP server (`server.emit("connection", stream)`):
 * every request read from that stream then runs as the connection's peer.
 */
export function bindConnection(stream: object, context: ConnectionContext): void {
  (stream as Bound)[CONTEXT] = Object.freeze({ ...context });
}

/** The context of the connection a request came from, if it came from a bound stream or was given one directly. */
export function connectionOf(env: AppBindings | undefined): ConnectionContext | undefined {
  if (!env) return undefined;
  if (env.connection) return env.connection;
  const socket = env.incoming?.socket;
  return socket ? (socket as Bound)[CONTEXT] : undefined;
}
