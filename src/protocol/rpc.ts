import { randomBytes, randomUUID } from "node:crypto";
import type { Duplex } from "node:stream";
import { create, type DescMessage, fromBinary, type MessageShape, toBinary } from "@bufbuild/protobuf";
import { encodeFrame, envelopeFrames, type Frame, FrameDecoder, FrameType, MAX_FRAME_PAYLOAD } from "./frames.ts";
import {
  PingRequestSchema,
  PingResponseSchema,
  type RpcMethod,
  RpcMethod as RpcMethods,
  type RpcRequest,
  RpcRequestSchema,
  type RpcResponse,
  RpcResponseSchema,
  SpeedTestRequestSchema,
  SpeedTestResponseSchema,
} from "./gen/rpc_pb.ts";

/** Peer RPC over service stream 0 (transport contract, section 5): one call per stream. */
export const RpcCode = {
  PARSE: -32700,
  INVALID_REQUEST: -32600,
  METHOD_NOT_FOUND: -32601,
  INVALID_PARAMS: -32602,
  INTERNAL: -32603,
  CONFLICT: 409,
} as const;

/** Envelopes are small; continuation frames may carry more, up to this. */
const MAX_ENVELOPE_BYTES = 1024 * 1024;
/** The most bytes a speed test moves each way. */
export const MAX_SPEED_TEST_BYTES = 64 * 1024 * 1024;
/** How long a provider waits for a whole request, unless told otherwise. */
const REQUEST_TIMEOUT_MS = 10_000;
const PROVIDER_CLOSE_GRACE_MS = 2_000;

export class RpcError extends Error {
  readonly code: number;
  constructor(code: number, message: string) {
    super(message);
    this.code = code;
  }
}

/** A broken stream (malformed frame, early end, timeout): the call fails, the connection stays. */
export class RpcStreamError extends Error {}

interface Message {
  envelope: Buffer;
  /** Bytes of the binary frames after the envelope. */
  dataBytes: number;
}

/** Reads one envelope (binary, or continuations) and any binary data frames up to end-of-stream. */
function readMessage(stream: Duplex, timeoutMs: number): Promise<Message> {
  return new Promise((resolve, reject) => {
    const decoder = new FrameDecoder();
    const parts: Buffer[] = [];
    let envelope: Buffer | undefined;
    let continued = 0;
    let dataBytes = 0;
    const finish = (error: Error | undefined, message?: Message) => {
      clearTimeout(timer);
      stream.off("data", onData);
      stream.off("end", onEnd);
      stream.off("close", onEnd);
      stream.off("error", onEnd);
      if (error) reject(error);
      else resolve(message!);
    };
    const onFrame = (f: Frame): boolean => {
      if (f.type === FrameType.END) {
        if (envelope === undefined && continued === 0) throw new RpcStreamError("end-of-stream before an envelope");
        finish(undefined, { envelope: envelope ?? Buffer.concat(parts), dataBytes });
        return true;
      }
      if (f.type === FrameType.JSON) throw new RpcStreamError("JSON frames are not used by this protocol");
      if (f.type === FrameType.CONTINUATION) {
        if (envelope !== undefined) throw new RpcStreamError("continuation frame after the envelope");
        continued += f.payload.length;
        if (continued > MAX_ENVELOPE_BYTES) throw new RpcStreamError("envelope too large");
        parts.push(Buffer.from(f.payload));
        return false;
      }
      if (continued > 0) throw new RpcStreamError("binary frame inside a continued envelope");
      if (envelope === undefined) envelope = Buffer.from(f.payload);
      else dataBytes += f.payload.length;
      return false;
    };
    const onData = (chunk: Buffer) => {
      try {
        for (const f of decoder.push(chunk)) if (onFrame(f)) return;
      } catch (err) {
        finish(err instanceof RpcStreamError ? err : new RpcStreamError((err as Error).message));
      }
    };
    const onEnd = () =>
      finish(
        new RpcStreamError(
          `the stream ended before end-of-stream (${envelope ? "after the envelope and" : "without an envelope,"} ${dataBytes} data bytes, ${decoder.pending} pending)`,
        ),
      );
    const timer = setTimeout(() => finish(new RpcStreamError("timed out")), timeoutMs);
    stream.on("data", onData);
    stream.once("end", onEnd);
    stream.once("close", onEnd);
    stream.once("error", onEnd);
  });
}

function closedOrAfter(stream: Duplex, ms: number): Promise<void> {
  if (stream.destroyed) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      stream.off("close", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    stream.once("close", done);
  });
}

function write(stream: Duplex, data: Buffer): Promise<void> {
  if (stream.destroyed) return Promise.reject(new RpcStreamError("the stream is closed"));
  if (stream.write(data)) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const done = (err?: Error) => {
      stream.off("drain", done);
      stream.off("close", closed);
      if (err) reject(err);
      else resolve();
    };
    const closed = () => done(new RpcStreamError("the stream closed"));
    stream.once("drain", done);
    stream.once("close", closed);
  });
}

/** Writes an envelope, `dataBytes` bytes of binary frames and end-of-stream. */
async function writeMessage(stream: Duplex, envelope: Uint8Array, dataBytes = 0): Promise<void> {
  // A message without data is one write, so one DataChannel message when it fits in 16 KiB:
  // `@roamhq/wrtc` can hand the first messages of a channel the other side opened to the
  // application out of order (end-of-stream before the envelope), and one message cannot be.
  if (dataBytes === 0) return write(stream, Buffer.concat([...envelopeFrames(envelope), encodeFrame(FrameType.END)]));
  for (const f of envelopeFrames(envelope)) await write(stream, f);
  if (dataBytes > 0) {
    const chunk = encodeFrame(FrameType.BINARY, randomBytes(Math.min(MAX_FRAME_PAYLOAD, 16 * 1024 - 4)));
    const size = chunk.length - 4;
    let left = dataBytes;
    while (left >= size) {
      await write(stream, chunk);
      left -= size;
    }
    if (left > 0) await write(stream, encodeFrame(FrameType.BINARY, chunk.subarray(4, 4 + left)));
  }
  await write(stream, encodeFrame(FrameType.END));
}

export interface RpcReply {
  payload: Uint8Array;
  /** Bytes sent after the response envelope (the speed test's download). */
  dataBytes?: number;
  /** Called once the reply has been written, or could not be. */
  sent?: () => void;
}

export interface RpcContext {
  /** Bytes that arrived after the request envelope. */
  dataBytes: number;
}

export type RpcHandler = (payload: Uint8Array, ctx: RpcContext) => Promise<RpcReply> | RpcReply;
export type RpcHandlers = Partial<Record<RpcMethod, RpcHandler>>;

/**
 * Serves one call on `stream`: reads the request, answers with a payload or an error (−32601 for
 * a method without a handler) and closes. A malformed stream is destroyed; it never throws.
 */
export async function serveRpc(
  stream: Duplex,
  handlers: RpcHandlers,
  onError?: (err: unknown, method: RpcMethod | undefined) => void,
  requestTimeoutMs = REQUEST_TIMEOUT_MS,
): Promise<void> {
  let request: RpcRequest | undefined;
  try {
    const message = await readMessage(stream, requestTimeoutMs);
    let response: RpcResponse;
    let dataBytes = 0;
    let sent: (() => void) | undefined;
    try {
      request = fromBinary(RpcRequestSchema, message.envelope);
    } catch {
      response = errorResponse("", RpcCode.PARSE, "the request envelope does not decode");
    }
    if (request) {
      const handler = handlers[request.method];
      if (!handler) response = errorResponse(request.id, RpcCode.METHOD_NOT_FOUND, `method ${request.method} is not provided here`);
      else {
        try {
          const reply = await handler(request.payload ?? new Uint8Array(0), { dataBytes: message.dataBytes });
          response = create(RpcResponseSchema, { id: request.id, body: { case: "payload", value: reply.payload } });
          dataBytes = reply.dataBytes ?? 0;
          sent = reply.sent;
        } catch (err) {
          if (err instanceof RpcError) response = errorResponse(request.id, err.code, err.message);
          else {
            onError?.(err, request.method);
            response = errorResponse(request.id, RpcCode.INTERNAL, "internal error");
          }
        }
      }
    }
    try {
      await writeMessage(stream, toBinary(RpcResponseSchema, response!), dataBytes);
    } finally {
      sent?.();
    }
    stream.end();
  } catch (err) {
    if (!(err instanceof RpcStreamError)) onError?.(err, request?.method);
    stream.destroy();
  }
}

function errorResponse(id: string, code: number, message: string): RpcResponse {
  return create(RpcResponseSchema, { id, body: { case: "error", value: { code, message } } });
}

/**
 * Calls `method` on a freshly opened stream: writes the request (and `upBytes` of data), waits for
 * the response up to `timeoutMs`, and closes the stream. Throws `RpcError` for an error answer.
 */
export async function callRpc(
  stream: Duplex,
  method: RpcMethod,
  payload: Uint8Array,
  o: { timeoutMs?: number; upBytes?: number } = {},
): Promise<{ payload: Uint8Array; dataBytes: number }> {
  // One request per stream: the id only has to differ from a stale answer's (no counter shared by every caller of the process).
  const id = randomUUID();
  try {
    const reading = readMessage(stream, o.timeoutMs ?? 5_000);
    reading.catch(() => {});
    await writeMessage(stream, toBinary(RpcRequestSchema, create(RpcRequestSchema, { id, method, payload })), o.upBytes ?? 0);
    const message = await reading;
    const response = fromBinary(RpcResponseSchema, message.envelope);
    if (response.id !== id) throw new RpcStreamError("the response answers another request");
    if (response.body.case === "error") throw new RpcError(response.body.value.code, response.body.value.message);
    if (response.body.case !== "payload") throw new RpcStreamError("the response carries neither payload nor error");
    // The provider closes the stream; closing it from here as well, at once, would let a new
    // stream reuse its id while the other side is still closing it.
    closedOrAfter(stream, PROVIDER_CLOSE_GRACE_MS).then(() => stream.destroy());
    return { payload: response.body.value, dataBytes: message.dataBytes };
  } catch (err) {
    stream.destroy();
    throw err;
  }
}

/** Decodes a request payload, answering −32602 when it does not decode. */
export function decodeParams<D extends DescMessage>(schema: D, payload: Uint8Array): MessageShape<D> {
  try {
    return fromBinary(schema, payload);
  } catch {
    throw new RpcError(RpcCode.INVALID_PARAMS, `the payload is not a ${schema.typeName}`);
  }
}

/** `all.ping` and `all.speed_test.run`: both sides provide them. */
export function commonHandlers(now: () => number = Date.now): RpcHandlers {
  return {
    [RpcMethods.ALL_PING]: () => ({ payload: toBinary(PingResponseSchema, create(PingResponseSchema, { serverTime: BigInt(now()) })) }),
    [RpcMethods.ALL_SPEED_TEST_RUN]: (payload, ctx) => {
      const req = decodeParams(SpeedTestRequestSchema, payload);
      const down = Number(req.downContentLength);
      if (down < 0 || down > MAX_SPEED_TEST_BYTES || req.upContentLength < 0n || req.upContentLength > BigInt(MAX_SPEED_TEST_BYTES)) {
        throw new RpcError(RpcCode.INVALID_PARAMS, `content lengths must be 0..${MAX_SPEED_TEST_BYTES}`);
      }
      const res = create(SpeedTestResponseSchema, { downContentLength: BigInt(down), upContentLength: BigInt(ctx.dataBytes) });
      return { payload: toBinary(SpeedTestResponseSchema, res), dataBytes: down };
    },
  };
}

/** Helpers for callers: encode a request payload, decode a response payload. */
export const rpcPayload = {
  ping: (now = Date.now()) => toBinary(PingRequestSchema, create(PingRequestSchema, { clientSendTime: BigInt(now) })),
  pingResponse: (p: Uint8Array) => fromBinary(PingResponseSchema, p),
  speedTest: (down: number, up: number) =>
    toBinary(SpeedTestRequestSchema, create(SpeedTestRequestSchema, { downContentLength: BigInt(down), upContentLength: BigInt(up) })),
  speedTestResponse: (p: Uint8Array) => fromBinary(SpeedTestResponseSchema, p),
};
