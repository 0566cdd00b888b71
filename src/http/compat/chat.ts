import type { Hono } from "hono";
import type { ChatService } from "../../ai/chat.ts";
import type { ChatStream } from "../../ai/providers/provider.ts";
import { sseError } from "../../ai/sse.ts";
import { parseChatRequest } from "../../protocol/compat.ts";
import type { Metrics } from "../metrics.ts";
import type { CompatEnv } from "./env.ts";
import { invalidParameter, toOpenAIError } from "./errors.ts";
import { clientGone, readJson } from "./json.ts";

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
    try {
      model = chat.resolve(caller, request.model).id;
      const result = await chat.chat(caller, request, signal);
      if (result.kind === "completion") {
        metrics.observeAi(ROUTE, model, 200, (performance.now() - started) / 1000);
        metrics.tokens(model, result.completion.usage);
        return c.json(result.completion);
      }
      const end = (error: boolean) => {
        metrics.observeAi(ROUTE, model, 200, (performance.now() - started) / 1000, error ? "api_error" : undefined);
        metrics.tokens(model, result.stream.stats.usage);
      };
      const headers = {
        "content-type": "text/event-stream; charset=utf-8",
        "cache-control": "no-cache",
        "x-accel-buffering": "no",
        // Declared, so that the Node adapter writes the first chunk at once instead of waiting a timer tick to see whether the body is short.
        "transfer-encoding": "chunked",
      };
      return c.body(eventStream(result.stream, end), 200, headers);
    } catch (err) {
      if (signal.aborted) {
        // The client went away: nobody reads an answer, and it is not a server error.
        metrics.observeAi(ROUTE, model, 499, (performance.now() - started) / 1000);
        return c.body(null, 499 as 200);
      }
      const e = toOpenAIError(err);
      metrics.observeAi(ROUTE, model, e.status, (performance.now() - started) / 1000, e.type);
      throw err;
    }
  });
}

const ERROR_EVENT = Buffer.from('data: {"error"');

/**
 * The stream's events as a response body, pulled one piece at a time (no buffering). Cancelling it
 * (the client went away) ends the provider stream, which closes the provider's connection.
 */
function eventStream(stream: ChatStream, end: (error: boolean) => void): ReadableStream<Uint8Array> {
  const it = stream.events[Symbol.asyncIterator]();
  let failed = false;
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        let r: IteratorResult<Uint8Array>;
        try {
          r = await it.next();
        } catch {
          // A bug or an upstream answer nothing anticipated: the client still gets a well-formed ending.
          failed = true;
          controller.enqueue(sseError("the stream failed"));
          controller.close();
          end(true);
          return;
        }
        if (r.done) {
          controller.close();
          end(failed);
          return;
        }
        if (!failed && Buffer.from(r.value.buffer, r.value.byteOffset, r.value.byteLength).includes(ERROR_EVENT)) failed = true;
        controller.enqueue(r.value);
      },
      async cancel() {
        end(true);
        await it.return?.();
      },
    },
    { highWaterMark: 0 },
  );
}
