import type { IncomingMessage, ServerResponse } from "node:http";
import type { Logger } from "pino";
import type { Caller } from "../../ai/caller.ts";
import type { ChatEntry, ChatService } from "../../ai/chat.ts";
import { parseJsonHere } from "../../ai/json-thread.ts";
import { type ChatRequest, parseChatRequest } from "../../protocol/compat.ts";
import { clientGoneOf } from "../client-gone.ts";
import { logFailure, requestIdOf } from "../exchange.ts";
import { nodeHeader } from "../headers.ts";
import { type HotRoute, hotExchange, writeJson } from "../hot-routes.ts";
import { pipeEvents, writeStreamHead } from "../hot-stream.ts";
import type { Metrics } from "../metrics.ts";
import { CLIENT_CLOSED_REQUEST, clientLeft } from "../middleware.ts";
import type { Callers } from "../principal.ts";
import { authenticateCaller } from "./auth.ts";
import { CHAT_ROUTE, ChatCallMetrics } from "./chat.ts";
import { openAIErrorEnvelope, toOpenAIError } from "./errors.ts";
import { MAX_JSON_VALUES } from "./json.ts";
import { EVENT_STREAM, streamHeaders } from "./stream-body.ts";
import { COMPAT_BASE } from "./surface.ts";
import { unsent, writeTimeoutOf } from "./write-timeout.ts";

export const HOT_CHAT_PATH = `${COMPAT_BASE}${CHAT_ROUTE}`;
const JSON_TYPE = "application/json";

export interface HotChatOptions {
  callers: Callers;
  chat: ChatService;
  logger: Logger;
  metrics: Metrics;
  writeTimeoutMs: number;
}

/**
 * `POST /openai/v1/chat/completions` served by the listener (see hot-routes.ts), for a request
 * whose whole body arrived with its head (as a small one does), streamed or not.
 *
 * Until the provider is called nothing has changed, so every refusal before it is the app's: a
 * caller that does not authenticate, a body that is not a valid request, an unknown
 * model — the body is put back unread and the request handed to the app, which answers it in
 * full. From the call on, the route answers as the app's route does: the completion, or the
 * error through the surface's renderer (`toOpenAIError`), with the same metrics and log lines.
 */
export function hotChatRoute(o: HotChatOptions): HotRoute {
  const record = hotExchange(o.logger, o.metrics, HOT_CHAT_PATH);
  const watch = writeTimeoutOf(o.writeTimeoutMs);
  const watchUnsent = (outgoing: ServerResponse) => {
    if (unsent(outgoing)) watch(outgoing);
  };

  /** The parsed request and its model, taken in one tick (so that the body can still be put back), or undefined. */
  const take = (incoming: IncomingMessage, caller: Caller, declared: number): { request: ChatRequest; entry: ChatEntry } | undefined => {
    if (!bodyArrived(incoming, declared)) return undefined;
    const bytes = incoming.read() as Buffer;
    try {
      const parsed = parseChatRequest(parseJsonHere(bytes));
      if (parsed.success) return { request: parsed.data, entry: o.chat.resolve(caller, parsed.data.model) };
    } catch {
      // Not JSON, or no such model for this caller: the app says which.
    }
    incoming.unshift(bytes);
    return undefined;
  };

  const serve = async (incoming: IncomingMessage, outgoing: ServerResponse, app: () => void, declared: number) => {
    const started = performance.now();
    const env = { incoming, outgoing };
    let caller: Caller;
    try {
      caller = await authenticateCaller(o.callers, env, (name) => nodeHeader(incoming, name));
    } catch {
      app();
      return;
    }
    const taken = take(incoming, caller, declared);
    if (!taken) {
      app();
      return;
    }
    const requestId = requestIdOf(nodeHeader(incoming, "x-request-id"));
    const signal = clientGoneOf(outgoing);
    const call = new ChatCallMetrics(o.metrics, started);
    call.model = taken.entry.id;
    let status = 200;
    try {
      const result = await o.chat.run(taken.entry, caller, taken.request, signal);
      if (result.kind === "stream") {
        const { stream } = result;
        const done = (status: number, errorType?: string) => call.streamEnded(status, errorType, stream.stats.usage);
        // As the app's route: the same body (its error event, its cancellation), written as the adapter writes it.
        watch(outgoing);
        writeStreamHead(outgoing, requestId, streamHeaders(EVENT_STREAM));
        record(requestId, "POST", 200, o.callers.resolveAddress(env), started);
        await pipeEvents(stream.sse(), outgoing, done);
        return;
      }
      call.completed(result.completion);
      writeJson(outgoing, requestId, 200, JSON_TYPE, JSON.stringify(result.completion));
      watchUnsent(outgoing);
    } catch (err) {
      call.failed(err, signal.aborted);
      if (clientLeft(outgoing)) status = CLIENT_CLOSED_REQUEST;
      else {
        const e = toOpenAIError(err);
        status = e.status;
        logFailure(o.logger, err, status, requestId, HOT_CHAT_PATH);
        writeJson(outgoing, requestId, status, JSON_TYPE, JSON.stringify(openAIErrorEnvelope(e)), e.retryAfter);
        watchUnsent(outgoing);
      }
    }
    record(requestId, "POST", status, o.callers.resolveAddress(env), started);
  };

  return (incoming, outgoing, app) => {
    // Node's parser reads the body after it announces the request: whether it came with the head is known once the caller is.
    if (incoming.headers["transfer-encoding"] !== undefined) return false;
    const declared = Number(incoming.headers["content-length"]);
    if (!(declared > 0 && declared < MAX_JSON_VALUES)) return false;
    serve(incoming, outgoing, app, declared).catch((err: unknown) => {
      o.logger.error({ err, path: HOT_CHAT_PATH }, "hot route failed");
      outgoing.destroy();
    });
    return true;
  };
}

/**
 * Whether the whole declared body (under MAX_JSON_VALUES bytes, checked by the route: small enough
 * to take without counting its values, as `readJson` does) waits unread. Node marks the request complete only later (after I/O), but the parser
 * hands on no byte past the declared length, so holding that many is holding it whole.
 */
function bodyArrived(incoming: IncomingMessage, declared: number): boolean {
  return !incoming.readableEnded && incoming.readableLength === declared;
}
