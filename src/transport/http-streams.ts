import type { Server } from "node:http";
import type { Logger } from "pino";
import { bindConnection, type ConnectionContext } from "../http/connection.ts";
import { createHttpServer, type RequestListener } from "../http/listener.ts";
import type { Metrics } from "../http/metrics.ts";
import type { ChannelPort } from "../protocol/channel.ts";
import { StreamSocket } from "../protocol/stream-socket.ts";

/** What serves a stream's request: the exchange of the Public API, or of the Compatible API. */
export type StreamApp = RequestListener;

/**
 * HTTP over DataChannel streams: the one place that makes Node's HTTP server and Hono's adapter
 * serve a stream that is not a TCP socket. What it relies on, all checked by
 * `test/stream-seam.test.ts` against the installed Node and `@hono/node-server`:
 *
 * - the stream is a `StreamSocket`, which has every member they use on a socket;
 * - a server that never listens still times requests once it has emitted `listening` (Node starts
 *   its connections checker then);
 * - `server.emit("connection", socket)` serves a socket like an accepted one;
 * - the caller is found from the socket (`bindConnection`, read back by the HTTP principal through
 *   `env.incoming.socket`);
 * - framing errors read the response in flight from the socket's `_httpMessage` (`src/http/framing.ts`,
 *   shared with TCP).
 *
 * One exchange per stream: the response closes the stream whatever the request asked, so a
 * kept-alive stream cannot hold one of the 256 slots, and a second request is never run.
 */
export class StreamHttpServer {
  private readonly server: Server;

  constructor(app: StreamApp, o: { requestTimeoutMs: number; logger: Logger; metrics: Metrics }) {
    // A request pipelined after the first is parsed but not run: its answer would never be sent.
    const served = new WeakSet<object>();
    const firstOnly: StreamApp = (incoming, outgoing) => {
      const stream = incoming.socket;
      if (served.has(stream)) {
        outgoing.writeHead(400).end();
        return;
      }
      served.add(stream);
      app(incoming, outgoing);
    };
    this.server = createHttpServer({
      listener: firstOnly,
      requestTimeoutMs: o.requestTimeoutMs,
      maxConnections: Number.MAX_SAFE_INTEGER,
      logger: o.logger,
      metrics: o.metrics,
    });
    this.server.prependListener("request", (_req, res) => {
      res.shouldKeepAlive = false;
    });
    // Node times requests only on servers that listen (it starts its checker on "listening"); these never do.
    this.server.emit("listening");
  }

  /** A socket for `port`, with the device's address (`ip:port`, when known). */
  static socket(port: ChannelPort, address: string | undefined): StreamSocket {
    const socket = new StreamSocket(port);
    const m = address ? /^\[?([^\]]+)\]?:(\d+)$/.exec(address) : null;
    if (m) {
      socket.remoteAddress = m[1];
      socket.remotePort = Number(m[2]);
      socket.remoteFamily = m[1]!.includes(":") ? "IPv6" : "IPv4";
    }
    return socket;
  }

  /** Serves one exchange on `socket`, as the connection `context`'s peer. */
  serve(socket: StreamSocket, context: ConnectionContext): void {
    bindConnection(socket, context);
    this.server.emit("connection", socket);
  }

  close(): void {
    this.server.close();
  }
}
