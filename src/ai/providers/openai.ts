/**
 * `openai` and `openai-compatible` providers: a thin pass-through over undici's `Pool` (keep-alive
 * connections to the provider; about a third less CPU a call than node:http's client and agent,
 * docs/benchmarks.md). The request body
 * is the validated client body with the upstream model; a stream's server-sent events are relayed
 * as the bytes that arrived, cut only at event boundaries, with `"model"` renamed to the id the
 * client asked for. See docs/decisions.md for why this is not the AI SDK.
 */
import { EventEmitter } from "node:events";
import type { Readable } from "node:stream";
import { Pool } from "undici";
import type { ChatCompletion } from "../../protocol/compat.ts";
import { DONE_EVENT, readSse } from "../../protocol/sse.ts";
import { type ChatPiece, type ChatStats, ChatStream, RawChatPiece } from "../chat-stream.ts";
import { GenerationError } from "../errors.ts";
import { type JsonThread, OFFLOAD_BYTES } from "../json-thread.ts";
import { type CallOptions, type ChatProvider, ProviderError, type ProviderRequest, retryAfterMs } from "./provider.ts";

export interface OpenAIProviderOptions {
  baseUrl: string;
  apiKey: string | undefined;
  /** Idle timeout: for the answer to start, and between two of its pieces. */
  timeoutMs: number;
  /** Overall deadline of one call (default 10 minutes). */
  deadlineMs?: number;
  /** Where a large request's JSON is written (the node's; default one of this provider's own). */
  json: JsonThread;
}

const MAX_ERROR_BODY = 64 * 1024;
const MAX_COMPLETION_BODY = 64 * 1024 * 1024;
/** One server-sent event (the bytes up to a blank line); a stream that never has one is cut here. */
export const MAX_EVENT_BYTES = 4 * 1024 * 1024;
const DEFAULT_DEADLINE_MS = 600_000;

export interface RawAnswer {
  contentType: string;
  body: AsyncIterable<Uint8Array>;
}

/** The provider's answer once its head arrived: status, headers and the body to read. */
interface Answer {
  statusCode: number;
  headers: Record<string, string | string[] | undefined>;
  body: Readable;
}

export class OpenAIProvider implements ChatProvider {
  private readonly basePath: string;
  /** Keep-alive connections to the provider, one pool per provider (so per origin). */
  private readonly pool: Pool;
  private readonly headers: Record<string, string>;
  /** The headers of a JSON request, made once (undici only reads them). */
  private readonly jsonHeaders: Readonly<Record<string, string>>;
  private readonly timeoutMs: number;
  private readonly deadlineMs: number;
  private readonly json: JsonThread;

  constructor(o: OpenAIProviderOptions) {
    this.json = o.json;
    const url = new URL(`${o.baseUrl.replace(/\/+$/, "")}/chat/completions`);
    this.basePath = url.pathname.slice(0, -"/chat/completions".length);
    // The idle timeout and the deadline are this class's own (undici's are turned off): one error for each.
    this.pool = new Pool(url.origin, { connections: 256, headersTimeout: 0, bodyTimeout: 0 });
    this.headers = { "content-type": "application/json", accept: "application/json, text/event-stream" };
    if (o.apiKey) this.headers.authorization = `Bearer ${o.apiKey}`;
    this.jsonHeaders = Object.freeze({ ...this.headers });
    this.timeoutMs = o.timeoutMs;
    this.deadlineMs = o.deadlineMs ?? DEFAULT_DEADLINE_MS;
  }

  async complete(request: ProviderRequest, o: CallOptions): Promise<ChatCompletion> {
    const body = requestBody(request, this.json);
    const call = this.send("/chat/completions", typeof body === "string" ? body : await body, "application/json", o.signal);
    try {
      const res = await call.response;
      const text = await readBody(res.body, MAX_COMPLETION_BODY, call.touch).catch((err: unknown) => {
        throw call.failure() ?? err;
      });
      let completion: ChatCompletion;
      try {
        completion = JSON.parse(text) as ChatCompletion;
      } catch {
        throw new ProviderError("the provider's answer is not JSON");
      }
      if (!completion || !Array.isArray(completion.choices)) throw new ProviderError("the provider's answer has no choices");
      return normalize(completion, o.publicModel);
    } finally {
      call.done();
    }
  }

  async stream(request: ProviderRequest, o: CallOptions): Promise<ChatStream> {
    // The provider is asked for its usage whatever the client asked (it is counted, usage.md §1);
    // a client that did not ask gets no usage in its stream (stripped below).
    const asked = request.stream_options?.include_usage === true;
    const upstream = asked ? request : { ...request, stream_options: { ...request.stream_options, include_usage: true } };
    const body = requestBody(upstream, this.json);
    const call = this.send("/chat/completions", typeof body === "string" ? body : await body, "application/json", o.signal);
    let relay: SseRelay;
    let first: Buffer | undefined;
    try {
      const res = await call.response;
      relay = new SseRelay(res.body, Buffer.from(o.publicModel), call.touch, call.failure);
      first = await relay.next();
    } catch (err) {
      call.done();
      throw err;
    }
    if (first === undefined) {
      call.done();
      throw new ProviderError("the provider's stream ended before its first event");
    }
    const stats: ChatStats = {};
    // The events stay the provider's bytes (model renamed); they are read as events only by a
    // reader that asks, and here only where the usage chunk is (for the metrics).
    const piece = (raw: Buffer): ChatPiece => {
      stats.outputChars = (stats.outputChars ?? 0) + contentChars(raw);
      let block = raw;
      if (raw.includes(USAGE_KEY)) {
        for (const e of new RawChatPiece(raw).events) if (e.type === "chunk" && e.chunk.usage) stats.usage = e.chunk.usage;
        if (!asked) block = withoutUsage(raw);
      } else if (!asked && raw.includes(USAGE_NULL)) block = withoutUsage(raw);
      return new RawChatPiece(block);
    };
    async function* pieces(): AsyncGenerator<ChatPiece> {
      try {
        yield piece(first as Buffer);
        for (;;) {
          const block = await relay.next();
          if (block === undefined) break;
          yield piece(block);
        }
      } finally {
        call.done();
      }
    }
    return new ChatStream(pieces(), stats);
  }

  /**
   * Any other route (`/audio/speech`, `/audio/transcriptions`): the body as given, the answer's
   * bytes relayed as they arrive. Resolves once the first bytes are in, so failures before them can
   * be retried.
   */
  async relay(path: string, body: string | Buffer, contentType: string, signal: AbortSignal): Promise<RawAnswer> {
    const call = this.send(path, body, contentType, signal);
    let it: AsyncIterator<Buffer>;
    let first: IteratorResult<Buffer>;
    let res: Answer;
    try {
      res = await call.response;
      it = (res.body as AsyncIterable<Buffer>)[Symbol.asyncIterator]();
      first = await it.next();
    } catch (err) {
      call.done();
      const reason = call.failure() ?? err;
      throw toProviderError(reason, reason instanceof ProviderError && reason.timedOut);
    }
    async function* bytes(): AsyncGenerator<Uint8Array> {
      try {
        if (first.done) return;
        yield first.value;
        for (;;) {
          let r: IteratorResult<Buffer>;
          try {
            r = await it.next();
          } catch (err) {
            // Our own timeout or deadline cut it: say that, not the socket's "aborted".
            throw call.failure() ?? err;
          }
          if (r.done) return;
          call.touch();
          yield r.value;
        }
      } finally {
        call.done();
      }
    }
    return { contentType: String(res.headers["content-type"] ?? "application/octet-stream"), body: closing(bytes(), call.done) };
  }

  /** Starts the request; `response` resolves with a 2xx answer or rejects with a ProviderError. */
  private send(path: string, body: string | Buffer, contentType: string, signal: AbortSignal) {
    // One timer for both the idle timeout and the deadline: a piece of the answer only notes the
    // time, and the timer, when it fires, sees which (if either) has passed and otherwise waits on.
    let timer: NodeJS.Timeout | undefined;
    let lastPiece = 0;
    let deadlineAt = 0;
    /** Ends the exchange: undici takes an emitter as its signal (lighter than an AbortController). */
    const abort = new EventEmitter();
    let ended = false;
    let stopListening = () => {};
    let timedOut = false;
    /** Why we ended the exchange ourselves (a timeout or the deadline): what its readers report. */
    let failure: ProviderError | undefined;
    const fail = (error: ProviderError) => {
      timedOut = true;
      failure ??= error;
      abort.emit("abort");
    };
    const response = new Promise<Answer>((resolve, reject) => {
      if (signal.aborted) return reject(signal.reason);
      const onAbort = () => abort.emit("abort");
      signal.addEventListener("abort", onAbort, { once: true });
      // Off once the exchange is over (its reader finished, or the answer closed): an abort after
      // that must not touch an exchange nobody listens to any more.
      stopListening = () => signal.removeEventListener("abort", onAbort);
      lastPiece = performance.now();
      deadlineAt = lastPiece + this.deadlineMs;
      const check = () => {
        const now = performance.now();
        if (now - lastPiece >= this.timeoutMs) {
          fail(new ProviderError(`the provider did not answer within ${this.timeoutMs} ms`, { timedOut: true }));
        } else if (now >= deadlineAt) {
          // Beside the idle timeout, which every piece of the answer restarts: a trickle cannot hold the call forever.
          fail(new ProviderError(`the provider did not finish within ${this.deadlineMs} ms`, { timedOut: true, retryable: false }));
        } else {
          timer = setTimeout(check, Math.min(lastPiece + this.timeoutMs, deadlineAt) - now);
        }
      };
      timer = setTimeout(check, Math.min(this.timeoutMs, this.deadlineMs));
      this.pool
        .request({
          path: this.basePath + path,
          method: "POST",
          headers: contentType === "application/json" ? this.jsonHeaders : { ...this.headers, "content-type": contentType },
          body,
          signal: abort,
        })
        .then(
          (res) => {
            const answer: Answer = { statusCode: res.statusCode, headers: res.headers, body: res.body };
            res.body.once("end", () => {
              ended = true;
            });
            res.body.once("close", stopListening);
            const status = res.statusCode;
            if (status >= 200 && status < 300) return resolve(answer);
            readBody(answer.body, MAX_ERROR_BODY).then(
              (text) => reject(upstreamError(status, text, res.headers["retry-after"])),
              (err) => reject(failure ?? toProviderError(err, timedOut)),
            );
          },
          (err: unknown) => {
            stopListening();
            reject(signal.aborted ? signal.reason : (failure ?? toProviderError(err, timedOut)));
          },
        );
    });
    return {
      response,
      /** Restarts the idle timeout: it bounds the wait for each piece of the answer; the deadline bounds the whole. */
      touch: () => {
        lastPiece = performance.now();
      },
      /** The timeout or deadline that ended the exchange, if one did. */
      failure: () => failure,
      done: () => {
        stopListening();
        clearTimeout(timer);
        timer = undefined;
        // Ends the exchange early when the consumer stopped (client gone): the provider sees its connection close.
        if (!ended) abort.emit("abort");
      },
    };
  }
}

/**
 * `source`, with `close` called once when it ends, fails or is left, even if it was never started:
 * a generator's own `finally` runs only once its body began, and an answer refused on its headers
 * alone must still end its exchange (timers, the abort listener, the connection).
 */
export function closing<T>(source: AsyncIterator<T>, close: () => void): AsyncIterableIterator<T> {
  let closed = false;
  const once = () => {
    if (closed) return;
    closed = true;
    close();
  };
  return {
    [Symbol.asyncIterator]() {
      return this;
    },
    async next() {
      try {
        const r = await source.next();
        if (r.done) once();
        return r;
      } catch (err) {
        once();
        throw err;
      }
    },
    async return(value?: unknown) {
      try {
        return (await source.return?.(value)) ?? { done: true, value: undefined };
      } finally {
        once();
      }
    },
  } as AsyncIterableIterator<T>;
}

function toProviderError(err: unknown, timedOut: boolean): ProviderError {
  if (err instanceof ProviderError) return err;
  return new ProviderError(`cannot reach the provider: ${(err as Error).message}`, { timedOut });
}

function upstreamError(status: number, text: string, retryAfter: string | string[] | undefined): ProviderError {
  let upstream: ProviderError["upstream"];
  try {
    const parsed = JSON.parse(text) as { error?: unknown };
    if (parsed.error && typeof parsed.error === "object") upstream = parsed.error as ProviderError["upstream"];
    else if (typeof parsed.error === "string") upstream = { message: parsed.error };
  } catch {
    // Not JSON: the status says enough.
  }
  const message = upstream?.message || `the provider answered ${status}`;
  return new ProviderError(message, { status, upstream, retryAfterMs: retryAfterMs(Array.isArray(retryAfter) ? retryAfter[0] : retryAfter) });
}

/** The whole body as text, up to `max` bytes. Events rather than the async iterator, which costs several promises per read. */
function readBody(res: Readable, max: number, touch?: () => void): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let complete = false;
    res.on("data", (chunk: Buffer) => {
      touch?.();
      size += chunk.length;
      if (size > max) {
        res.destroy();
        reject(new ProviderError(`the provider's answer is over ${max} bytes`));
        return;
      }
      chunks.push(chunk);
    });
    res.once("end", () => {
      complete = true;
      resolve(chunks.length === 1 ? chunks[0]!.toString("utf8") : Buffer.concat(chunks).toString("utf8"));
    });
    res.once("error", reject);
    res.once("close", () => {
      if (!complete) reject(new ProviderError("the provider closed the connection before its answer ended"));
    });
  });
}

/** The request's JSON: at once when it is small, in the JSON thread when it is large (a request over a MiB). */
function requestBody(request: ProviderRequest, json: JsonThread): string | Promise<Buffer> {
  const size = approximateSize(request);
  return size < OFFLOAD_BYTES ? JSON.stringify(withoutNulls(request)) : json.stringify(withoutNulls(request), size);
}

/** Characters the request's messages hold, roughly (text, image URLs, audio data): cheap, one pass over the parts. */
function approximateSize(request: ProviderRequest): number {
  let size = 0;
  for (const m of request.messages) {
    const content = (m as { content?: unknown }).content;
    if (typeof content === "string") size += content.length;
    else if (Array.isArray(content)) {
      for (const part of content as Array<Record<string, any>>) {
        size += part.text?.length ?? part.image_url?.url?.length ?? part.input_audio?.data?.length ?? 0;
      }
    }
    for (const call of (m as { tool_calls?: Array<{ function: { arguments: string } }> }).tool_calls ?? []) size += call.function.arguments.length;
  }
  return size;
}

/** The request as the provider gets it: absent and null fields are left out (some servers refuse null). */
function withoutNulls(request: ProviderRequest): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const k of Object.keys(request)) {
    const v = request[k as keyof ProviderRequest];
    if (v !== null && v !== undefined) out[k] = v;
  }
  return out;
}

function normalize(c: ChatCompletion, model: string): ChatCompletion {
  c.object = "chat.completion";
  c.model = model;
  for (const choice of c.choices) {
    if (choice.message) {
      choice.message.refusal ??= null;
      choice.message.content ??= null;
    }
    choice.logprobs ??= null;
  }
  return c;
}

const USAGE_NULL = Buffer.from('"usage":null');
const CONTENT_KEY = Buffer.from('"content":"');
const BACKSLASH = 92;
const QUOTE = 34;

/** Bytes of the `"content":"…"` strings of a block (an estimate of the reply's length when no usage comes). */
function contentChars(block: Buffer): number {
  let n = 0;
  let at = block.indexOf(CONTENT_KEY);
  while (at >= 0) {
    const start = at + CONTENT_KEY.length;
    let end = block.indexOf(QUOTE, start);
    while (end > 0 && block[end - 1] === BACKSLASH) end = block.indexOf(QUOTE, end + 1);
    if (end < 0) break;
    n += end - start;
    at = block.indexOf(CONTENT_KEY, end);
  }
  return n;
}

/**
 * The block without what the provider sent only because Perch asked for usage: the usage chunk
 * (`choices: []`) is dropped, a usage given with a choice is taken out of its chunk, and
 * `"usage":null` of the other chunks is removed, so the client's stream is as it asked.
 */
export function withoutUsage(block: Buffer): Buffer {
  const events = block.toString("utf8").split(/(?<=\n\n|\r\n\r\n)/);
  let out = "";
  for (const event of events) {
    if (event.includes('"usage":{')) {
      const data = /^data: ?(.*)$/m.exec(event)?.[1];
      let chunk: { choices?: unknown[]; usage?: unknown } | undefined;
      try {
        chunk = data ? (JSON.parse(data) as typeof chunk) : undefined;
      } catch {
        chunk = undefined;
      }
      if (chunk && typeof chunk === "object") {
        if (Array.isArray(chunk.choices) && chunk.choices.length === 0) continue;
        delete chunk.usage;
        out += `data: ${JSON.stringify(chunk)}\n\n`;
        continue;
      }
    }
    out += event.includes('"usage":null') ? event.replaceAll(',"usage":null', "").replaceAll('"usage":null,', "") : event;
  }
  return Buffer.from(out);
}

const LF = 10;
const CR = 13;
const MODEL_KEY = Buffer.from('"model":"');
const USAGE_KEY = Buffer.from('"usage":{');
const DONE = Buffer.from("data: [DONE]");
const FINISH = Buffer.from('"finish_reason":"');
const ERROR_EVENT = Buffer.from('data: {"error"');

/** A streamed chat that failed after its first event (nothing can be retried then). */
function streamFailed(message: string, code = "upstream_error"): GenerationError {
  return new GenerationError("upstream_failed", message, { code });
}

/** The provider's own error event (`data: {"error":{…}}`) as the failure it reports. */
function providerErrorEvent(event: Buffer): GenerationError {
  let parsed: unknown;
  try {
    parsed = JSON.parse(readSse(event.toString("utf8"))[0]?.data ?? "");
  } catch {
    // Not JSON: the generic message below.
  }
  const error = (parsed as { error?: { message?: unknown; code?: unknown } } | undefined)?.error;
  const message = typeof error?.message === "string" ? error.message : "the provider reported an error";
  return streamFailed(`the provider's stream failed: ${message}`, typeof error?.code === "string" ? error.code : undefined);
}

/**
 * Cuts the provider's byte stream at server-sent event boundaries and hands on whole events,
 * as few pieces as arrived. Looks into their bytes only where it must: the model name (renamed),
 * the provider's error event, and whether the stream ended properly.
 */
class SseRelay {
  /** The bytes of an event not yet complete, as they arrived (joined once, when it completes). */
  private pending: Buffer[] = [];
  private pendingLength = 0;
  private readonly it: AsyncIterator<Buffer>;
  private sawDone = false;
  private sawFinish = false;
  private ended = false;
  private sawAnything = false;
  /** Thrown at the next call, once the events before it were handed on. */
  private failing: GenerationError | undefined;

  private readonly model: Buffer;
  private readonly touch: () => void;
  private readonly failure: () => ProviderError | undefined;

  constructor(res: Readable, model: Buffer, touch: () => void, failure: () => ProviderError | undefined) {
    this.it = (res as AsyncIterable<Buffer>)[Symbol.asyncIterator]();
    this.model = model;
    this.touch = touch;
    this.failure = failure;
  }

  /**
   * The next run of whole events, or undefined at the end. A failure after the first event (the
   * connection broke, the stream ended early, the provider's own error event) is thrown as a
   * `GenerationError` once the events before it were handed on; the surface writes it its own way. Linear in the bytes: only each new piece is searched for a boundary, and an
   * incomplete event over MAX_EVENT_BYTES ends the stream.
   */
  async next(): Promise<Buffer | undefined> {
    if (this.failing) throw this.takeFailing();
    if (this.ended) return undefined;
    for (;;) {
      let r: IteratorResult<Buffer>;
      try {
        r = await this.it.next();
      } catch (caught) {
        const err = this.failure() ?? caught;
        if (this.pendingLength === 0 && !this.sawAnything) throw toProviderError(err, err instanceof ProviderError && err.timedOut);
        this.ended = true;
        throw streamFailed(`the provider's stream failed: ${(err as Error).message}`);
      }
      if (r.done) return this.finish();
      this.touch();
      const piece = r.value;
      // A boundary may straddle the previous piece: look back three bytes (`\r\n\r` of `\r\n\r\n`).
      const back = Math.min(3, this.pendingLength);
      const searched = back > 0 ? Buffer.concat([this.tail(back), piece]) : piece;
      const end = lastBoundary(searched);
      if (end < 0) {
        this.pending.push(piece);
        this.pendingLength += piece.length;
        if (this.pendingLength > MAX_EVENT_BYTES) return this.tooLong();
        continue;
      }
      const cut = end - back;
      const block = this.pendingLength > 0 ? Buffer.concat([...this.pending, piece.subarray(0, cut)]) : piece.subarray(0, cut);
      const rest = piece.subarray(cut);
      this.pending = rest.length > 0 ? [rest] : [];
      this.pendingLength = rest.length;
      this.sawAnything = true;
      if (this.pendingLength > MAX_EVENT_BYTES) return this.tooLong();
      return this.inspect(block);
    }
  }

  /** The last `n` pending bytes. */
  private tail(n: number): Buffer {
    const out = Buffer.alloc(n);
    let need = n;
    for (let i = this.pending.length - 1; i >= 0 && need > 0; i--) {
      const p = this.pending[i]!;
      const take = Math.min(need, p.length);
      p.copy(out, need - take, p.length - take);
      need -= take;
    }
    return out;
  }

  private tooLong(): Buffer {
    this.ended = true;
    this.pending = [];
    const message = `the provider sent an event over ${MAX_EVENT_BYTES} bytes`;
    if (!this.sawAnything) throw new ProviderError(message, { retryable: false });
    throw streamFailed(message);
  }

  private finish(): Buffer | undefined {
    this.ended = true;
    const last = Buffer.concat(this.pending);
    this.pending = [];
    const rest = last.length > 0 && last.toString("utf8").trim() !== "" ? this.inspect(Buffer.concat([last, Buffer.from("\n\n")])) : undefined;
    if (this.sawDone || this.failing) return rest;
    if (!this.sawAnything && !rest) return undefined;
    // Some servers close after the finishing chunk without `[DONE]`; a stream cut short fails instead.
    if (this.sawFinish) return rest ? Buffer.concat([rest, DONE_EVENT]) : DONE_EVENT;
    const failure = streamFailed("the provider's stream ended early");
    if (!rest) throw failure;
    this.failing = failure;
    return rest;
  }

  private takeFailing(): GenerationError {
    const failing = this.failing!;
    this.failing = undefined;
    return failing;
  }

  private inspect(whole: Buffer): Buffer {
    // The provider's own error event ends the stream: what came before it is handed on, then it is thrown.
    const at = whole.indexOf(ERROR_EVENT);
    const block = at < 0 ? whole : whole.subarray(0, at);
    if (at >= 0) {
      this.ended = true;
      this.failing = providerErrorEvent(whole.subarray(at));
    }
    if (block.length === 0) throw this.takeFailing();
    if (!this.sawDone && block.includes(DONE)) this.sawDone = true;
    if (!this.sawFinish && block.includes(FINISH)) this.sawFinish = true;
    return renameModel(block, this.model);
  }
}

/** The index just past the last blank line (`\n\n` or `\r\n\r\n`) in `data`, or -1. */
function lastBoundary(data: Buffer): number {
  let i = data.lastIndexOf(LF);
  while (i > 0) {
    if (data[i - 1] === LF) return i + 1;
    if (data[i - 1] === CR && i >= 3 && data[i - 2] === LF && data[i - 3] === CR) return i + 1;
    i = data.lastIndexOf(LF, i - 1);
  }
  return -1;
}

/** Replaces each `"model":"…"` value in `block` with `model`. */
function renameModel(block: Buffer, model: Buffer): Buffer {
  let at = block.indexOf(MODEL_KEY);
  if (at < 0) return block;
  const parts: Buffer[] = [];
  let from = 0;
  while (at >= 0) {
    const valueStart = at + MODEL_KEY.length;
    const valueEnd = block.indexOf(34, valueStart); // the closing quote; model names hold no escaped quotes
    if (valueEnd < 0) break;
    parts.push(block.subarray(from, valueStart), model);
    from = valueEnd;
    at = block.indexOf(MODEL_KEY, valueEnd);
  }
  parts.push(block.subarray(from));
  return Buffer.concat(parts);
}
