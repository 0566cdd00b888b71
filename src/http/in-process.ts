import http, { type Server } from "node:http";
import { type Duplex, duplexPair, Readable } from "node:stream";

/**
 * Requests served in process, without a port: each is written on one end of an in-memory pair of
 * streams whose other end the HTTP server takes as a connection (`emit("connection")`, as service
 * streams are served), so it goes through Node's parser and the exchange exactly as a TCP request
 * does, every route included. What the fast tests call (`Node.request`, like Hono's `app.request()`).
 */
export function inProcess(server: Server): (path: string, init?: RequestInit) => Promise<Response> {
  const connect = (): Duplex => {
    const [client, served] = duplexPair();
    // The members Node's server touches on a socket beyond a stream's.
    for (const end of [client, served] as Array<Duplex & Record<string, unknown>>) {
      end.setTimeout = () => end;
      end.setNoDelay = () => end;
      end.setKeepAlive = () => end;
      end.ref = () => end;
      end.unref = () => end;
    }
    server.emit("connection", served);
    return client;
  };
  return async (path, init = {}) => {
    const request = new Request(new URL(path, "http://in-process"), init);
    const headers: Record<string, string> = {};
    request.headers.forEach((value, name) => {
      headers[name] = value;
    });
    const body = request.body ? Buffer.from(await request.arrayBuffer()) : undefined;
    if (body && headers["content-length"] === undefined && headers["transfer-encoding"] === undefined) headers["content-length"] = String(body.length);
    return new Promise<Response>((resolve, reject) => {
      const req = http.request(
        {
          method: request.method,
          path: path.startsWith("/") ? path : `${new URL(path).pathname}${new URL(path).search}`,
          headers: { host: "in-process", ...headers, connection: "close" },
          createConnection: connect,
        },
        (res) => {
          const out = new Headers();
          for (const [name, value] of Object.entries(res.headers)) {
            for (const v of Array.isArray(value) ? value : [value ?? ""]) out.append(name, v);
          }
          const status = res.statusCode ?? 500;
          const nullBody = status === 204 || status === 304 || request.method === "HEAD";
          if (nullBody) res.resume();
          resolve(new Response(nullBody ? null : (Readable.toWeb(res) as ReadableStream<Uint8Array>), { status, headers: out }));
        },
      );
      req.on("error", reject);
      if (init.signal) init.signal.addEventListener("abort", () => req.destroy(new Error("aborted")), { once: true });
      req.end(body);
    });
  };
}
