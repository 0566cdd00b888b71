import type { Hono } from "hono";
import type { ChatService } from "../../ai/chat.ts";
import { parseChatRequest } from "../../protocol/compat.ts";
import type { Metrics } from "../metrics.ts";
import type { CompatEnv } from "./env.ts";
import { invalidParameter, toOpenAIError } from "./errors.ts";
import { clientGone, readJson } from "./json.ts";
import { asIs, EVENT_STREAM, streamBody, streamHeaders } from "./stream-body.ts";

const ROUTE = "/chat/completions";

export function registerChatRoute(app: Hono<CompatEnv>, chat: ChatService, metrics: Metrics): void {
  app.post(ROUTE, async (c) => {
    const started = performance.now();
    const parsed = parseChatRequest(await readJson(c));
    if (!parsed.success) throw invalidParameter(parsed.error);
    const request = parsed.data;
    const caller = c.get("caller");
    const signal = clientGone(c);
    let model = "unknown";
    const observe = (status: number, errorType?: string) => metrics.observeAi(ROUTE, model, status, (performance.now() - started) / 1000, errorType);
    try {
      const entry = chat.resolve(caller, request.model);
      model = entry.id;
      const result = await chat.run(entry, caller, request, signal);
      if (result.kind === "completion") {
        observe(200);
        metrics.tokens(model, result.completion.usage);
        return c.json(result.completion);
      }
      const { stream } = result;
      const done = (status: number, errorType?: string) => {
        observe(status, errorType);
        metrics.tokens(model, stream.stats.usage);
      };
      // A failure after the first event ends the stream with the error event; cancelling it (the
      // client went away) ends the provider's stream, which closes the provider's connection.
      const body = streamBody(stream.events[Symbol.asyncIterator](), { sse: true, encode: asIs, done });
      return c.body(body, 200, streamHeaders(EVENT_STREAM));
    } catch (err) {
      // The client went away: 499 (the root answers it so, to nobody), not a server error.
      if (signal.aborted) observe(499);
      else {
        const e = toOpenAIError(err);
        observe(e.status, e.type);
      }
      throw err;
    }
  });
}
