import { randomUUID } from "node:crypto";
import { type ServerResponse, STATUS_CODES } from "node:http";
import type { Duplex } from "node:stream";
import { JSON_CONTENT_TYPE } from "./json.ts";

/** An answer Node's HTTP parser or timers force before the app sees a request. */
export interface FramingError {
  status: 400 | 408 | 413 | 417 | 431;
  code: string;
  message: string;
}

const BY_NODE_CODE: Record<string, FramingError> = {
  HPE_HEADER_OVERFLOW: { status: 431, code: "HEADERS_TOO_LARGE", message: "the request headers are too large" },
  HPE_CHUNK_EXTENSIONS_OVERFLOW: { status: 413, code: "PAYLOAD_TOO_LARGE", message: "the chunk extensions are too large" },
  ERR_HTTP_REQUEST_TIMEOUT: { status: 408, code: "REQUEST_TIMEOUT", message: "the request was not received in time" },
};
const MALFORMED: FramingError = { status: 400, code: "INVALID_REQUEST", message: "the request is not well-formed HTTP/1.1" };
/** A CONNECT request (Node would close the connection without a word). */
export const CONNECT_REFUSED: FramingError = { status: 400, code: "INVALID_REQUEST", message: "CONNECT is not supported" };
/** An `Expect` other than 100-continue (Node would answer a bare 417). */
export const EXPECTATION_FAILED: FramingError = { status: 417, code: "EXPECTATION_FAILED", message: "the only expectation supported is 100-continue" };

/** How long a connection answered with a framing error may take to read the answer before it is dropped. */
const LINGER_MS = 1_000;

/** Marks a socket already answered with a framing error (a property of the socket itself: no process-wide set). */
const ANSWERED = Symbol("answered with a framing error");
type Marked = Duplex & { [ANSWERED]?: true };

/** The framing error Node reported as `code` (its parser's `HPE_*` codes, or a timeout). */
export function framingError(code: string | undefined): FramingError {
  return BY_NODE_CODE[code ?? ""] ?? MALFORMED;
}

/** `ErrorResponse` for a framing error, as JSON text. */
export function framingErrorBody(f: FramingError): string {
  return JSON.stringify({ error: { code: f.code, message: f.message } });
}

/** The headers of a framing error's answer, which closes the connection. */
export function framingErrorHeaders(body: string, requestId: string): Record<string, string> {
  return {
    "Content-Type": JSON_CONTENT_TYPE,
    "Content-Length": String(Buffer.byteLength(body)),
    "X-Request-ID": requestId,
    "Access-Control-Allow-Origin": "*",
    Connection: "close",
  };
}

/**
 * The server's `clientError` handler: answers in the `ErrorResponse` envelope, with a request id,
 * then closes the connection. Writes only when the socket is writable and no response was started
 * on it (Node's own rule); returns what it answered, with whether a request was in flight (whose
 * handler then ends as a closed request), or undefined when it only dropped the connection.
 */
export function answerClientError(err: NodeJS.ErrnoException, socket: Duplex): (FramingError & { requestId: string; inFlight: boolean }) | undefined {
  if ((socket as Marked)[ANSWERED]) return undefined;
  (socket as Marked)[ANSWERED] = true;
  // Node keeps the response in progress on its socket; it has no public accessor.
  const inFlight = (socket as Duplex & { _httpMessage?: ServerResponse | null })._httpMessage ?? undefined;
  if (err.code === "ECONNRESET" || !socket.writable || inFlight?.headersSent) {
    socket.destroy();
    return undefined;
  }
  const f = framingError(err.code);
  return { ...f, requestId: answerOnSocket(socket, f), inFlight: inFlight !== undefined };
}

/** Writes `f` on a socket no response was started on, closes it, and returns the request id. */
export function answerOnSocket(socket: Duplex, f: FramingError): string {
  (socket as Marked)[ANSWERED] = true;
  const requestId = randomUUID();
  const body = framingErrorBody(f);
  const headers = Object.entries(framingErrorHeaders(body, requestId)).map(([name, value]) => `${name}: ${value}\r\n`);
  socket.end(`HTTP/1.1 ${f.status} ${STATUS_CODES[f.status]}\r\n${headers.join("")}\r\n${body}`);
  const linger = setTimeout(() => socket.destroy(), LINGER_MS);
  linger.unref();
  socket.once("close", () => clearTimeout(linger));
  return requestId;
}
