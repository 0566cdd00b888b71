import type { Context } from "hono";
import type { Caller } from "../../ai/caller.ts";
import { type JsonThread, OFFLOAD_BYTES, parseJsonHere } from "../../ai/json-thread.ts";
import { readNodeBody } from "../body.ts";
import { clientGone, nodeBindings } from "../client-gone.ts";
import type { AppBindings } from "../env.ts";
import { JsonBudget, LargeBodies } from "../json-budget.ts";
import { OpenAIError } from "./errors.ts";

export { clientGone };

/** A JSON body with more values than this is refused before it is parsed (see json-budget.ts). */
export const MAX_JSON_VALUES = 100_000;
/** A body over this many bytes is large: each caller may send MAX_LARGE_BODIES_PER_CALLER at once. */
export const LARGE_BODY_BYTES = 1024 * 1024;
export const MAX_LARGE_BODIES_PER_CALLER = 2;
/** Large bodies in progress on the node at once, whoever sends them. */
export const MAX_LARGE_BODIES = 8;

function callerKey(caller: Caller | undefined): string {
  if (!caller) return "anonymous";
  return caller.kind === "device" ? `device:${caller.publicKey}` : `application:${caller.name}`;
}

const invalidJson = () => new OpenAIError(400, "We could not parse the JSON body of your request.", { code: "invalid_json" });
const tooComplex = () => new OpenAIError(413, `The JSON body holds more than ${MAX_JSON_VALUES} values.`, { code: "request_too_complex" });
const tooManyLarge = (who: "caller" | "node") =>
  new OpenAIError(
    429,
    who === "caller"
      ? `You already have ${MAX_LARGE_BODIES_PER_CALLER} requests over ${LARGE_BODY_BYTES} bytes in progress; send this one when one has finished.`
      : `The server has ${MAX_LARGE_BODIES} requests over ${LARGE_BODY_BYTES} bytes in progress; try again shortly.`,
    { code: "too_many_large_requests", retryAfter: 1 },
  );

/** The Compatible API's request bodies on one node: its large-body slots and its JSON thread. */
export class JsonBodies {
  private readonly largeBodies = new LargeBodies(MAX_LARGE_BODIES_PER_CALLER, MAX_LARGE_BODIES);
  private readonly json: JsonThread;

  constructor(json: JsonThread) {
    this.json = json;
  }

  /** Starts the JSON thread before the first large body needs it. */
  warm(): void {
    this.json.warm();
  }

  /**
   * One of the caller's (and the node's) large-body slots when `bytes` makes the body large, held
   * until the response has gone (through the Node adapter; otherwise until the returned function is
   * called). Throws a 429 when none is free; undefined when the body is not large.
   */
  slot(c: Context, bytes: number): (() => void) | undefined {
    return this.slotOf(nodeBindings(c)?.outgoing, (c.env as AppBindings | undefined)?.exchange?.caller, bytes);
  }

  /**
   * The request body as JSON; any content type is read, as OpenAI does. A body over a MiB is parsed
   * in the JSON thread, so that it does not hold the event loop.
   */
  async readOf(c: Context): Promise<unknown> {
    return this.read(c.env as AppBindings, (c.env as AppBindings | undefined)?.exchange?.caller);
  }

  /**
   * `readOf` of a request known by its bindings, sent by `caller`: the value itself when the body
   * was at hand and small (parsed on this thread, no promise), else a promise of it.
   */
  read(env: AppBindings, caller: Caller | undefined): unknown {
    const bytes = bodyBytes(env, (outgoing, bytes) => this.slotOf(outgoing, caller, bytes));
    return bytes instanceof Promise ? bytes.then((b) => this.jsonOf(b)) : this.jsonOf(bytes);
  }

  /** The JSON value of a body: parsed here when small, in the JSON thread (a promise) when large. */
  private jsonOf(bytes: Buffer): unknown {
    if (blank(bytes)) throw new OpenAIError(400, "The request body is empty: send a JSON object.", { code: "invalid_json" });
    if (bytes.length < OFFLOAD_BYTES) {
      try {
        return parseJsonHere(bytes);
      } catch {
        throw invalidJson();
      }
    }
    return this.json.parse(bytes).catch((err: unknown) => {
      if (err instanceof SyntaxError) throw invalidJson();
      // The JSON thread failed (it is replaced): the node's fault, not the body's.
      throw new OpenAIError(503, "The server could not read this large body just now; try again shortly.", { code: "unavailable", retryAfter: 1 });
    });
  }

  private slotOf(outgoing: AppBindings["outgoing"], caller: Caller | undefined, bytes: number): (() => void) | undefined {
    if (bytes <= LARGE_BODY_BYTES) return undefined;
    const slot = this.largeBodies.acquire(callerKey(caller));
    if (typeof slot === "string") throw tooManyLarge(slot);
    outgoing?.once("close", slot);
    return slot;
  }
}

type SlotOf = (outgoing: AppBindings["outgoing"], bytes: number) => (() => void) | undefined;

/**
 * The request body's bytes, their cost checked as it arrives: more than MAX_JSON_VALUES values, or
 * a large body beyond the caller's allowance, is refused before the rest is read (the rest is
 * drained unread). A body of declared length is read straight from Node's request: asking the web
 * Request for it builds a full undici Request and a web stream, which cost more than the rest of a
 * relayed call.
 */
function bodyBytes(env: AppBindings, slotOf: SlotOf): Buffer | Promise<Buffer> {
  const budget = new JsonBudget(MAX_JSON_VALUES);
  const { incoming, outgoing } = env;
  if (!incoming || !outgoing) throw new Error("the Compatible API is served through the exchange (src/http/exchange.ts)");
  let release: (() => void) | undefined;
  const sized = (bytes: number) => {
    if (!release) release = slotOf(outgoing, bytes);
  };
  if (env.body || incoming.readableEnded) {
    // Already in memory (a chunked body the body limit read).
    const body = env.body ?? Buffer.alloc(0);
    sized(body.length);
    if (!budget.feed(body)) throw tooComplex();
    return body;
  }
  {
    const declared = Number(incoming.headers["content-length"] ?? 0);
    sized(declared);
    if (declared < MAX_JSON_VALUES && incoming.readableLength === declared) {
      // The whole body arrived with its head (a small request usually does): taken at once, without
      // listeners, and not counted: each value takes at least a byte, so it cannot be over budget.
      // Node marks the request complete only later (after I/O), but its parser hands on no byte
      // past the declared length, so holding that many is holding it whole.
      return declared === 0 ? Buffer.alloc(0) : (incoming.read() as Buffer);
    }
    // A large body of declared length is copied piece by piece into one buffer of its own as it
    // arrives (no 30 MB concatenation at the end), which then moves to the JSON thread uncopied.
    const into = declared > LARGE_BODY_BYTES ? Buffer.allocUnsafeSlow(declared) : undefined;
    return readNodeBody(incoming, {
      maxSize: Number.POSITIVE_INFINITY,
      drainLimit: Number.POSITIVE_INFINITY,
      // Refused as it arrives: the rest is read and dropped, never kept or parsed.
      take: (piece, size) => {
        sized(size);
        if (!budget.feed(piece)) throw tooComplex();
      },
      ...(into ? { into } : {}),
    }).then((body) => body ?? Buffer.alloc(0));
  }
}

/** Whether `b` holds only JSON whitespace (it stops at the first byte that is not). */
function blank(b: Uint8Array): boolean {
  for (const byte of b) if (byte !== 0x20 && byte !== 0x0a && byte !== 0x0d && byte !== 0x09) return false;
  return true;
}
