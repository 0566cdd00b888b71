import type { IncomingMessage, ServerResponse } from "node:http";
import type { Context } from "hono";
import { OpenAIError } from "./errors.ts";

/** The Node request and response behind `c`, when it came through the Node adapter (not over a DataChannel stream). */
function nodeBindings(c: Context): { incoming: IncomingMessage; outgoing: ServerResponse } | undefined {
  const env = c.env as { incoming?: IncomingMessage; outgoing?: ServerResponse } | undefined;
  return env?.incoming && env.outgoing ? { incoming: env.incoming, outgoing: env.outgoing } : undefined;
}

/**
 * The request body as text. Through the Node adapter a body of declared length is read straight
 * from the socket: asking the web Request for it builds a full undici Request and a web stream,
 * which cost more than the rest of a relayed call.
 */
async function bodyText(c: Context): Promise<string> {
  const node = nodeBindings(c);
  if (!node || node.incoming.headers["transfer-encoding"] !== undefined || node.incoming.readableEnded) return c.req.text();
  const { incoming } = node;
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    incoming.on("data", (chunk: Buffer) => chunks.push(chunk));
    incoming.once("end", () => resolve(chunks.length === 1 ? chunks[0]!.toString("utf8") : Buffer.concat(chunks).toString("utf8")));
    incoming.once("error", reject);
    incoming.once("close", () => {
      if (!incoming.complete) reject(new Error("the client closed the connection before its body ended"));
    });
  });
}

/** The request body as JSON; any content type is read, as OpenAI does. */
export async function readJson(c: Context): Promise<unknown> {
  const text = await bodyText(c);
  if (!text.trim()) throw new OpenAIError(400, "The request body is empty: send a JSON object.", { code: "invalid_json" });
  try {
    return JSON.parse(text);
  } catch {
    throw new OpenAIError(400, "We could not parse the JSON body of your request.", { code: "invalid_json" });
  }
}

/** Aborted when the client goes away before the response is complete (the Node adapter's own signal needs a full Request). */
export function clientGone(c: Context): AbortSignal {
  const node = nodeBindings(c);
  if (!node) return c.req.raw.signal;
  const controller = new AbortController();
  node.outgoing.once("close", () => {
    if (!node.outgoing.writableFinished) controller.abort(new Error("the client closed the connection"));
  });
  return controller.signal;
}
