import { randomUUID } from "node:crypto";
import { type ServerResponse, STATUS_CODES } from "node:http";
import type { Duplex } from "node:stream";
import { JSON_CONTENT_TYPE } from "./json.ts";

/** An answer Node's HTTP parser or timers force before the app sees a request. */
export interface FramingError {
  status: 400 | 408 | 413 | 431;
  code: string;
  message: string;
}

const BY_NODE_CODE: Record<string, FramingError> = {
  HPE_HEADER_OVERFLOW: { status: 431, code: "HEADERS_TOO_LARGE", message: "the request headers are too large" },
  HPE_CHUNK_EXTENSIONS_OVERFLOW: { status: 413, code: "PAYLOAD_TOO_LARGE", message: "the chunk extensions are too large" },
  ERR_HTTP_REQUEST_TIMEOUT: { status: 408, code: "REQUEST_TIMEOUT", message: "the request was not received in time" },
};
const MALFORMED: FramingError = { status: 400, code: "INVALID_REQUEST", message: "the request is not well-formed HTTP/1.1" };

/** How long a connection answered with a framing error may take to read the answer before it is dropped. */
const LINGER_MS = 1_000;

const answered = new WeakSet<Duplex>();

/** The framing error Node reported as `code` (its parser's `HPE_*` codes, or a timeout). */
export function framingError(code: string | undefined): FramingError {
  return BY_NODE_CODE[code ?? ""] ?? MALFORMED;
}

/** `ErrorResponse` for a framing error, as JSON text. */
export function framingErrorBody(f: FramingError): string {
  return JSON.stringify({ error: { code: f.code, message: f.message } });
}

/**
 * The server's `clientError` handler: answers in the `ErrorResponse` envelope, with a request id,
 * then closes the connection. Writes only when the socket is writable and no response was started
 * on it (Node's own rule); returns what it answered, with whether a request was in flight (whose
 * handler then ends as a closed request), or undefined when it only dropped the connection.
 */
export function answerClientError(err: NodeJS.ErrnoException, socket: Duplex): (FramingError & { requestId: string; inFlight: boolean }) | undefined {
  if (answered.has(socket)) return undefined;
  answered.add(socket);
  // Node keeps the response in progress on its socket; it has no public accessor.
  const inFlight = (socket as Duplex & { _httpMessage?: ServerResponse | null })._httpMessage ?? undefined;
  if (err.code === "ECONNRESET" || !socket.writable || inFlight?.headersSent) {
    socket.destroy();
    return undefined;
  }
  const f = framingError(err.code);
  const requestId = randomUUID();
  const body = framingErrorBody(f);
  socket.end(
    `HTTP/1.1 ${f.status} ${STATUS_CODES[f.status]}\r\n` +
      `Content-Type: ${JSON_CONTENT_TYPE}\r\nContent-Length: ${Buffer.byteLength(body)}\r\n` +
      `X-Request-ID: ${requestId}\r\nAccess-Control-Allow-Origin: *\r\nConnection: close\r\n\r\n${body}`,
  );
  const linger = setTimeout(() => socket.destroy(), LINGER_MS);
  linger.unref();
  socket.once("close", () => clearTimeout(linger));
  return { ...f, requestId, inFlight: inFlight !== undefined };
}
