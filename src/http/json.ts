import type { Context, TypedResponse } from "hono";
import type { Exchange } from "./exchange.ts";

/**
 * Headers of every JSON response. Passed to `c.json` so that the type is set as the response is
 * built (the Node adapter then writes it in one piece, as it does any response built whole).
 */
export const JSON_UTF8 = { "Content-Type": "application/json; charset=utf-8" };

export const JSON_CONTENT_TYPE = JSON_UTF8["Content-Type"];

/**
 * A 200 JSON response of text already serialised (a stored document, sent as it is), typed as the
 * route's JSON answer. The headers object is new each time: the Node adapter adds to the one it is
 * given (`Content-Length`).
 */
export function jsonText(c: Context, text: string): TypedResponse<never, 200, "json"> {
  return c.body(text, 200, { "Content-Type": JSON_CONTENT_TYPE }) as unknown as TypedResponse<never, 200, "json">;
}

/** Writes a whole JSON answer of a native route (exchange.ts): its type, its `Retry-After` when given, its length, in one head. */
export function writeJson(x: Exchange, status: number, body: string, o: { contentType?: string; retryAfter?: number | undefined } = {}): void {
  const headers = x.headers();
  headers.push("Content-Type", o.contentType ?? JSON_CONTENT_TYPE);
  if (o.retryAfter !== undefined) headers.push("Retry-After", String(o.retryAfter));
  headers.push("Content-Length", String(Buffer.byteLength(body)));
  x.outgoing.writeHead(status, headers);
  x.outgoing.end(body);
}
