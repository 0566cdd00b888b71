import type { IncomingMessage } from "node:http";
import type { Context } from "hono";
import type { AppEnv } from "./env.ts";

/**
 * A request header (lower-case `name`). Under the Node server it is read from Node's own parsed
 * headers: asking the web `Request` builds a `Headers` object, validating every header, on each
 * request — about a tenth of a `GET /me/status`.
 */
export function requestHeader(c: Context<AppEnv>, name: string): string | undefined {
  const incoming = c.env?.incoming;
  if (!incoming) return c.req.header(name);
  return nodeHeader(incoming, name);
}

/** A header (lower-case `name`) of Node's parsed request. */
export function nodeHeader(incoming: IncomingMessage, name: string): string | undefined {
  const value = incoming.headers[name];
  return Array.isArray(value) ? value.join(", ") : value;
}
