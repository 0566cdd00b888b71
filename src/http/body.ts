import type { IncomingMessage } from "node:http";
import type { AppBindings } from "./env.ts";

/**
 * Request bodies, read from Node's request (every request comes through the exchange, so there is
 * one): the one reader, and the body limits of the surfaces built on it.
 */

export interface ReadOptions {
  /** Pieces past this many bytes are not kept, and the body reads as null. */
  maxSize: number;
  /** Past this many bytes reading stops (the connection is left to its fate). */
  drainLimit: number;
  /** Sees each piece with the bytes so far; what it throws refuses the body: the rest is then read and dropped, unkept. */
  take?: (piece: Buffer, size: number) => void;
  /** A buffer the body is copied into as it arrives, when its length is known (no concatenation at the end). */
  into?: Buffer;
}

/** Reads the body of `incoming` as it arrives; null when it is over `maxSize`. */
export function readNodeBody(incoming: IncomingMessage, o: ReadOptions): Promise<Buffer | null> {
  return new Promise((resolve, reject) => {
    const pieces: Buffer[] = [];
    let size = 0;
    const off = () => {
      incoming.off("data", onData);
      incoming.off("end", onEnd);
      incoming.off("close", onClose);
      incoming.off("error", onError);
    };
    const onData = (piece: Buffer) => {
      size += piece.length;
      try {
        o.take?.(piece, size);
      } catch (err) {
        off();
        incoming.resume();
        reject(err);
        return;
      }
      if (size <= o.maxSize) {
        if (o.into && size <= o.into.length) piece.copy(o.into, size - piece.length);
        else pieces.push(piece);
      } else if (size > o.drainLimit) {
        off();
        incoming.pause();
        resolve(null);
      }
    };
    const onEnd = () => {
      off();
      if (size > o.maxSize) resolve(null);
      else if (o.into) resolve(size === o.into.length ? o.into : o.into.subarray(0, size));
      else resolve(pieces.length === 1 ? pieces[0]! : Buffer.concat(pieces));
    };
    const onClose = () => {
      if (incoming.complete) return;
      off();
      reject(new Error("the client closed the connection before its body ended"));
    };
    const onError = (err: Error) => {
      off();
      reject(err);
    };
    incoming.on("data", onData);
    incoming.once("end", onEnd);
    incoming.once("close", onClose);
    incoming.once("error", onError);
  });
}

/** The body a request's head announces: its declared length (undefined when it is chunked or has none) and whether it is chunked. */
function announced(incoming: IncomingMessage | undefined): { declared: number | undefined; chunked: boolean } {
  const headers = incoming?.headers ?? {};
  const chunked = headers["transfer-encoding"] !== undefined;
  const length = headers["content-length"];
  return { declared: length === undefined || chunked ? undefined : Number(length), chunked };
}

/**
 * Reads a request body of at most `maxSize` bytes; null when it is larger. A body without
 * Content-Length is counted as it arrives and, once over the limit, still read (and dropped) to
 * its end, up to `drainLimit` bytes: a client still sending would otherwise stall on a socket
 * nobody reads and never see the answer. A declared length over the limit is refused unread, so
 * that it can be drained after the answer. A body the limit check already read is taken from the bindings.
 */
export function readBodyWithin(env: AppBindings | undefined, maxSize: number, drainLimit = 16 * maxSize): Promise<Buffer | null> {
  const incoming = env?.incoming;
  if (!incoming) return Promise.reject(new Error("the application is served through the exchange (src/http/exchange.ts)"));
  if (env.body) return Promise.resolve(env.body.length > maxSize ? null : env.body);
  const { declared } = announced(incoming);
  if (declared !== undefined && declared > maxSize) return Promise.resolve(null);
  if (incoming.readableEnded) return Promise.resolve(Buffer.alloc(0));
  return readNodeBody(incoming, { maxSize, drainLimit });
}

/**
 * Whether the request body is at most `maxSize` bytes. A declared length is judged unread (at once,
 * no promise); a chunked body is read here (up to `drainLimit`) and kept in the bindings (`body`)
 * for the route.
 */
export function bodyWithinLimit(env: AppBindings, maxSize: number, drainLimit = 16 * maxSize): boolean | Promise<boolean> {
  const headers = env.incoming?.headers;
  if (headers?.["transfer-encoding"] === undefined) {
    // HTTP/1.1: neither header means no body.
    const length = headers?.["content-length"];
    return length === undefined || Number(length) <= maxSize;
  }
  return readBodyWithin(env, maxSize, drainLimit).then((body) => {
    if (!body) return false;
    env.body = body;
    return true;
  });
}
