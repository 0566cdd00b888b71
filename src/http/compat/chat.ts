import { usageWho } from "../../ai/caller.ts";
import type { ChatService } from "../../ai/chat.ts";
import type { UsageMeter } from "../../domain/usage-meter.ts";
import type { ChatCompletion } from "../../protocol/compat.ts";
import { parseChatRequest } from "../../protocol/compat.ts";
import { clientGoneOf } from "../client-gone.ts";
import type { Exchange } from "../exchange.ts";
import { writeJson } from "../json.ts";
import type { Metrics } from "../metrics.ts";
import type { NativeRoute } from "../native.ts";
import { asIs, EVENT_STREAM, writeStream } from "../stream.ts";
import { invalidParameter, sseErrorEvent, toOpenAIError } from "./errors.ts";
import type { JsonBodies } from "./json.ts";

export const CHAT_ROUTE = "/chat/completions";
const JSON_TYPE = "application/json";

/**
 * `POST /chat/completions`, the Compatible API's busiest route: served on Node's request and
 * response (its only handler; the Compatible API has no OpenAPI document), behind the surface's
 * gate like its other routes, every error answered by the surface's mapping (`mountSurfaces`). A
 * stream is written by the one stream writer: a failure after the first event ends it with the
 * `error` event; the client's leaving ends the provider's stream, which closes the provider's connection.
 */
export function chatRoute(o: { chat: ChatService; metrics: Metrics; bodies: JsonBodies; usage: UsageMeter }): NativeRoute {
  const serve = async (x: Exchange) => {
    const caller = x.caller;
    if (!caller) throw new Error("the Compatible API's routes run behind its gate (compat/surface.ts)");
    const body = o.bodies.read(x.env, caller);
    const parsed = parseChatRequest(body instanceof Promise ? await body : body);
    if (!parsed.success) throw invalidParameter(parsed.error);
    const request = parsed.data;
    const call = new ChatCallMetrics(o.metrics, x.started);
    const signal = clientGoneOf(x.outgoing);
    try {
      const entry = o.chat.resolve(caller, request.model);
      call.model = entry.id;
      // A usage limit reached refuses the request before the model is called (usage.md §2, 429 insufficient_quota).
      const admitted = o.usage.admit(usageWho(caller), entry.id);
      const admission = admitted instanceof Promise ? await admitted : admitted;
      let result: Awaited<ReturnType<ChatService["run"]>>;
      try {
        result = await o.chat.run(entry, caller, request, signal, undefined, x.traced);
      } catch (err) {
        admission.abandon();
        throw err;
      }
      // Answered once the answer starts: a stream that fails or is left later still consumed its tokens.
      admission.answered();
      if (result.kind === "completion") {
        call.completed(result.completion);
        writeJson(x, 200, JSON.stringify(result.completion), { contentType: JSON_TYPE });
        return;
      }
      const { stream } = result;
      const done = (status: number, errorType?: string) => call.streamEnded(status, errorType, stream.stats.usage);
      // Its head is written at once; the rest goes on after this returns.
      writeStream(x, EVENT_STREAM, stream.sse(), { failed: sseErrorEvent, encode: asIs, done }).catch(() => x.outgoing.destroy());
    } catch (err) {
      call.failed(err, signal.aborted);
      throw err;
    }
  };
  return { method: "POST", path: CHAT_ROUTE, guards: [], serve };
}

/** The Compatible API's metrics of one chat call. */
export class ChatCallMetrics {
  /** The catalog id once resolved. */
  model = "unknown";
  private readonly metrics: Metrics;
  private readonly started: number;

  constructor(metrics: Metrics, started: number) {
    this.metrics = metrics;
    this.started = started;
  }

  completed(completion: ChatCompletion): void {
    this.observe(200);
    this.metrics.tokens(this.model, completion.usage);
  }

  streamEnded(status: number, errorType: string | undefined, usage: ChatCompletion["usage"]): void {
    this.observe(status, errorType);
    this.metrics.tokens(this.model, usage);
  }

  /** The call failed before it answered: 499 when the client went away (the root answers it so, to nobody), not a server error. */
  failed(err: unknown, clientGone: boolean): void {
    if (clientGone) {
      this.observe(499);
      return;
    }
    const e = toOpenAIError(err);
    this.observe(e.status, e.type);
  }

  private observe(status: number, errorType?: string): void {
    this.metrics.observeAi(CHAT_ROUTE, this.model, status, (performance.now() - this.started) / 1000, errorType);
  }
}
