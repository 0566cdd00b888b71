import http from "node:http";
import type { AddressInfo } from "node:net";

/** What the fake provider answers to one request. */
export type Reply =
  | { status: number; error?: { message: string; type?: string; param?: string | null; code?: string | null }; retryAfter?: string }
  | {
      content?: string;
      /** Streamed pieces of `content` (default: the content in one piece). */
      chunks?: string[];
      tool_calls?: Array<{ id: string; name: string; arguments: string }>;
      finish_reason?: string;
      usage?: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
      /** Milliseconds between streamed chunks; 0 yields to the event loop between them, so each is its own write. */
      delayMs?: number;
      /** Milliseconds before the first streamed piece (a model's time to first token). */
      firstTokenMs?: number;
      /** Stream the first chunk, then never finish (not streaming: never answer). */
      hang?: boolean;
      /** Not streaming: the answer waits for this. */
      wait?: Promise<unknown>;
      /** Awaited before each streamed piece after the first: the test decides when the next piece is sent. */
      gate?: (piece: number) => Promise<void>;
      /** After the pieces and tool calls: `close` ends the response with no finish chunk and no `[DONE]`; `hold` keeps it open, sending nothing more. */
      after?: "close" | "hold";
    };

export interface ReceivedRequest {
  body: Record<string, any>;
  headers: http.IncomingHttpHeaders;
  /** Resolves when this request's response is closed by the other side before it finished (its call was cancelled). */
  aborted: Promise<void>;
}

/** An OpenAI-compatible provider on loopback that answers from a script, for tests and the benchmark. */
export class FakeUpstream {
  readonly received: ReceivedRequest[] = [];
  /** Requests to the audio routes, raw. */
  readonly audio: Array<{ path: string; contentType: string; body: Buffer }> = [];
  /** Responses whose connection was closed by the other side before they finished. */
  aborted = 0;
  /** False: a provider that reports no usage (no `usage` in completions, no usage chunk in streams, whatever it is asked). */
  reportsUsage = true;
  private readonly replies: Reply[] = [];
  private server!: http.Server;
  url = "";

  /** Replies used in order, one per request; when none is queued the default reply is used. */
  reply(...replies: Reply[]): this {
    this.replies.push(...replies);
    return this;
  }

  defaultReply: (body: Record<string, any>) => Reply = (body) => ({
    content: `Hello from ${body.model}`,
    usage: { prompt_tokens: 7, completion_tokens: 3, total_tokens: 10 },
  });

  async start(): Promise<this> {
    this.server = http.createServer((req, res) => this.handle(req, res));
    this.server.keepAliveTimeout = 30_000;
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/v1`;
    return this;
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise((resolve) => this.server.close(resolve));
  }

  private handle(req: http.IncomingMessage, res: http.ServerResponse): void {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      if (req.method === "POST" && (req.url === "/v1/audio/speech" || req.url === "/v1/audio/transcriptions")) {
        const body = Buffer.concat(chunks);
        this.audio.push({ path: req.url, contentType: req.headers["content-type"] ?? "", body });
        if (req.url === "/v1/audio/speech") res.writeHead(200, { "content-type": "audio/mpeg" }).end(Buffer.concat([Buffer.from("ID3"), body]));
        else res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ text: "upstream heard you" }));
        return;
      }
      if (req.url !== "/v1/chat/completions" || req.method !== "POST") {
        res.writeHead(404, { "content-type": "application/json" }).end(JSON.stringify({ error: { message: "not found" } }));
        return;
      }
      const body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as Record<string, any>;
      let cancelled!: () => void;
      const aborted = new Promise<void>((resolve) => (cancelled = resolve));
      this.received.push({ body, headers: req.headers, aborted });
      const reply = this.replies.shift() ?? this.defaultReply(body);
      res.on("close", () => {
        if (!res.writableFinished) {
          this.aborted++;
          cancelled();
        }
      });
      if ("status" in reply) {
        const headers: Record<string, string> = { "content-type": "application/json" };
        if (reply.retryAfter) headers["retry-after"] = reply.retryAfter;
        res.writeHead(reply.status, headers).end(JSON.stringify({ error: { type: "server_error", param: null, code: null, ...reply.error } }));
        return;
      }
      if (body.stream) void this.stream(body, reply, res);
      else if (reply.hang) return;
      else if (reply.wait)
        void reply.wait.then(() => {
          if (!res.destroyed) res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(completion(body, reply, this.reportsUsage)));
        });
      else res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(completion(body, reply, this.reportsUsage)));
    });
  }

  private async stream(body: Record<string, any>, reply: Exclude<Reply, { status: number }>, res: http.ServerResponse): Promise<void> {
    const includeUsage = body.stream_options?.include_usage === true && this.reportsUsage;
    const base = { id: "chatcmpl-fake", object: "chat.completion.chunk", created: 1, model: body.model };
    const send = (choices: unknown[], extra: Record<string, unknown> = {}) =>
      res.write(`data: ${JSON.stringify({ ...base, choices, ...(includeUsage ? { usage: null } : {}), ...extra })}\n\n`);
    const pause = () => (reply.delayMs === undefined ? undefined : new Promise((r) => (reply.delayMs ? setTimeout(r, reply.delayMs) : setImmediate(r))));
    res.writeHead(200, { "content-type": "text/event-stream" });
    send([{ index: 0, delta: { role: "assistant", content: "" }, finish_reason: null }]);
    if (reply.hang) return;
    if (reply.firstTokenMs) await new Promise((r) => setTimeout(r, reply.firstTokenMs));
    const pieces = reply.chunks ?? (reply.content !== undefined ? [reply.content] : []);
    for (const [i, piece] of pieces.entries()) {
      await pause();
      if (i > 0) await reply.gate?.(i);
      if (res.destroyed) return;
      send([{ index: 0, delta: { content: piece }, finish_reason: null }]);
    }
    (reply.tool_calls ?? []).forEach((call, index) => {
      send([
        { index: 0, delta: { tool_calls: [{ index, id: call.id, type: "function", function: { name: call.name, arguments: "" } }] }, finish_reason: null },
      ]);
      send([{ index: 0, delta: { tool_calls: [{ index, function: { arguments: call.arguments } }] }, finish_reason: null }]);
    });
    if (reply.after === "close") return void res.end();
    if (reply.after === "hold") return;
    await pause();
    send([{ index: 0, delta: {}, finish_reason: finishReason(reply) }]);
    if (includeUsage) send([], { usage: reply.usage ?? { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } });
    res.end("data: [DONE]\n\n");
  }
}

function finishReason(reply: Exclude<Reply, { status: number }>): string {
  return reply.finish_reason ?? (reply.tool_calls?.length ? "tool_calls" : "stop");
}

function completion(body: Record<string, any>, reply: Exclude<Reply, { status: number }>, reportsUsage = true) {
  const message: Record<string, unknown> = { role: "assistant", content: reply.tool_calls?.length ? null : (reply.content ?? "") };
  if (reply.tool_calls?.length) {
    message.tool_calls = reply.tool_calls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } }));
  }
  return {
    id: "chatcmpl-fake",
    object: "chat.completion",
    created: 1,
    model: body.model,
    choices: [{ index: 0, message, finish_reason: finishReason(reply), logprobs: null }],
    ...(reportsUsage ? { usage: reply.usage ?? { prompt_tokens: 7, completion_tokens: 3, total_tokens: 10 } } : {}),
  };
}

export async function startFakeUpstream(): Promise<FakeUpstream> {
  return new FakeUpstream().start();
}
