import { connect, type Socket } from "node:net";
import type { Duplex } from "node:stream";

export interface RawResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/** Parses one HTTP/1.1 response (Content-Length or close-delimited) from raw bytes. */
export function parseRawResponse(raw: string): RawResponse | undefined {
  const end = raw.indexOf("\r\n\r\n");
  if (end < 0) return undefined;
  const [statusLine, ...lines] = raw.slice(0, end).split("\r\n");
  const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(statusLine ?? "")?.[1]);
  const headers: Record<string, string> = {};
  for (const line of lines) {
    const i = line.indexOf(":");
    headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
  }
  let body = raw.slice(end + 4);
  if (headers["transfer-encoding"] === "chunked") {
    let out = "";
    for (let rest = body; ; ) {
      const lineEnd = rest.indexOf("\r\n");
      const size = Number.parseInt(rest.slice(0, lineEnd), 16);
      if (!size) break;
      out += rest.slice(lineEnd + 2, lineEnd + 2 + size);
      rest = rest.slice(lineEnd + 2 + size + 2);
    }
    body = out;
  } else if (headers["content-length"] !== undefined) body = body.slice(0, Number(headers["content-length"]));
  return { status, headers, body };
}

/**
 * Writes `request` (in pieces, with pauses, when given several) on `stream` and collects what comes
 * back until the other side closes, or `timeoutMs` passes (then `timedOut`).
 */
export function exchange(stream: Duplex, request: string | string[], timeoutMs = 10_000): Promise<{ raw: string; timedOut: boolean; ms: number }> {
  const started = Date.now();
  return new Promise((resolve) => {
    let raw = "";
    let done = false;
    const finish = (timedOut: boolean) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      stream.destroy();
      resolve({ raw, timedOut, ms: Date.now() - started });
    };
    const timer = setTimeout(() => finish(true), timeoutMs);
    stream.on("data", (chunk: Buffer) => (raw += chunk.toString("utf8")));
    stream.on("end", () => finish(false));
    stream.on("close", () => finish(false));
    stream.on("error", () => finish(false));
    const pieces = Array.isArray(request) ? request : [request];
    (async () => {
      for (const [i, piece] of pieces.entries()) {
        if (i > 0) await new Promise((r) => setTimeout(r, 50));
        if (done) return;
        stream.write(piece);
      }
    })();
  });
}

/** A TCP connection to 127.0.0.1:`port`, once connected. */
export function tcp(port: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, "127.0.0.1");
    socket.once("connect", () => resolve(socket));
    socket.once("error", reject);
  });
}
