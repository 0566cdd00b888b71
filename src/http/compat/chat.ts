import type { Hono } from "hono";
import type { ChatService } from "../../ai/chat.ts";
import type { ChatCompletion } from "../../protocol/compat.ts";
import { parseChatRequest } from "../../protocol/compat.ts";
import type { Metrics } from "../metrics.ts";
import type { CompatEnv } from "./env.ts";
import { invalidParameter, toOpenAIError } from "./errors.ts";
import { clientGone, readJson } from "./json.ts";
import { asIs, EVENT_STREAM, streamBody, streamHeaders } from "./stream-body.ts";

export const CHAT_ROUTE = "/chat/completions";

export function registerChatRoute(app: Hono<CompatEnv>, chat: ChatService, metrics: Metrics): void {
  app.post(CHAT_ROUTE, async (c) => {
    const call = new ChatCallMetrics(metrics, performance.now());
    const parsed = parseChatRequest(await readJson(c));
    if (!parsed.success) throw invalidParameter(parsed.error);
    const request = parsed.data;
    const caller = c.get("caller");
    const signal = clientGone(c);
    try {
      const entry = chat.resolve(caller, request.model);
      call.model = entry.id;
      const result = await chat.run(entry, caller, request, signal);
      if (result.kind === "completion") {
        call.completed(result.completion);
        return c.json(result.completion);
      }
      const { stream } = result;
      const done = (status: number, errorType?: string) => call.streamEnded(status, errorType, stream.stats.usage);
      // A failure after the first event ends the stream with the error event; cancelling it (the
      // client went away) ends the provider's stream, which closes the provider's connection.
      const body = streamBody(stream.sse(), { sse: true, encode: asIs, done });
      return c.body(body, 200, streamHeaders(EVENT_STREAM));
    } catch (err) {
      call.failed(err, signal.aborted);
      throw err;
    }
  });
}

/** The Compatible API's metrics of one chat call, shared by the app's route and the listener's hot route (`hot-chat.ts`). */
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
