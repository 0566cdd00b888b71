import { createRoute, z } from "@hono/zod-openapi";
import type { MiddlewareHandler } from "hono";
import type { Domain } from "../../domain/index.ts";
import type { LiveEvent, LiveSink } from "../../domain/live.ts";
import type { SideControlPrincipal } from "../../domain/principal.ts";
import {
  Contact,
  ContactCreate,
  ContactList,
  ContactListQuery,
  ContactUpdate,
  Conversation,
  ConversationList,
  ConversationListQuery,
  DeviceInfo,
  MemoryUpdate,
  MemoryView,
  PeerStatus,
  Runtime,
  TelemetryAggregate,
  TelemetryAggregateQuery,
  TelemetryLatest,
  TelemetryLatestQuery,
  TelemetryRange,
  TelemetryRangeQuery,
  TurnAudioParams,
  TurnAudioQuery,
  UsageView,
} from "../../protocol/public.ts";
import { SSE_KEEP_ALIVE, sseEvent } from "../../protocol/sse.ts";
import type { App, AppEnv } from "../env.ts";
import { ApiError, invalid } from "../errors.ts";
import { JSON_UTF8, jsonText } from "../json.ts";
import { requireJson } from "../middleware.ts";
import type { Callers } from "../principal.ts";
import { asIs, EVENT_STREAM, PushSource, streamed } from "../stream.ts";
import { jsonBodyLimit } from "./limits.ts";
import { bearerSecurity, errors, json, jsonBody, noContent } from "./responses.ts";

/** The `/side-control/*` routes: a Side Control session acting on its bound target device. */
export function registerSideControlRoutes(app: App, domain: Domain, callers: Callers): void {
  const sideControl = callers.require("side_control");
  // An event shared by many streams (a device's change, to each of its controllers) is encoded
  // once: the encodings of this node's surface, held as long as the event is.
  const encoded = new WeakMap<LiveEvent, Uint8Array>();
  const encode = (e: LiveEvent): Uint8Array => {
    let bytes = encoded.get(e);
    if (!bytes) {
      bytes = sseEvent(e.data, e.event);
      encoded.set(e, bytes);
    }
    return bytes;
  };
  const route = <P extends string, M extends "get" | "put" | "post" | "delete">(method: M, path: P) => ({
    method,
    path,
    tags: ["side-control"],
    security: bearerSecurity,
    middleware: [jsonBodyLimit, sideControl],
  });
  const authErrors = errors(401, 403, 503);
  const target = (c: { get(key: "principal"): unknown }) => (c.get("principal") as SideControlPrincipal).targetKey;
  const contactName = z.object({ name: z.string().openapi({ description: "the contact's name (URL-encoded)" }) });
  // A segment that is not percent-encoded UTF-8 is kept as it came by the router ("%FF" would be
  // the name "%FF", whose URL is %25FF): it names no contact, and "" is no contact's name.
  const nameOf = (c: { req: { path: string; valid(target: "param"): { name: string } } }) => {
    const segment = c.req.path.slice(c.req.path.lastIndexOf("/") + 1);
    try {
      decodeURIComponent(segment);
    } catch {
      return "";
    }
    return c.req.valid("param").name;
  };

  app.openapi(
    createRoute({
      ...route("get", "/side-control/info"),
      summary: "The target device's information",
      responses: { 200: json(DeviceInfo, "Device information"), ...authErrors },
    }),
    async (c) => c.json(await domain.peers.deviceInfo(target(c)), 200, JSON_UTF8),
  );

  app.openapi(
    createRoute({
      ...route("get", "/side-control/runtime"),
      summary: "The target device's runtime",
      responses: { 200: json(Runtime, "Runtime"), ...authErrors },
    }),
    async (c) => c.json(await domain.peers.runtime(target(c)), 200, JSON_UTF8),
  );

  app.openapi(
    createRoute({
      ...route("get", "/side-control/status"),
      summary: "The target device's status",
      responses: { 200: json(PeerStatus, "Status"), ...authErrors },
    }),
    async (c) => jsonText(c, await domain.peers.statusText(target(c))),
  );

  app.openapi(
    createRoute({
      ...route("get", "/side-control/usage"),
      summary: "What the target device used today and this month (UTC), against its limits, and whether a limit refuses its work now",
      responses: { 200: json(UsageView, "Usage"), ...authErrors },
    }),
    async (c) => c.json(await domain.usage.view(target(c)), 200, JSON_UTF8),
  );

  app.openapi(
    createRoute({
      ...route("delete", "/side-control/session"),
      summary: "End the caller's own Side Control session (the app's \"forget this device\"); its event streams end on every node",
      responses: { 204: noContent, ...authErrors },
    }),
    async (c) => {
      await domain.sideControl.endOwnSession(c.get("principal") as SideControlPrincipal);
      return c.body(null, 204);
    },
  );

  app.openapi(
    createRoute({
      ...route("get", "/side-control/events"),
      summary: "The target device's changes, live (server-sent events; bearer header only)",
      description:
        "Events `status` (PeerStatus) and `runtime` (Runtime) at once, then `status` on every change, `runtime` when `online` or the node " +
        "changes, `telemetry` ({values: [{field, value, observed_at_unix_ms}]}, at most every 250 ms), `contacts` ({name, change}), and " +
        "`memory` ({updated_at_unix_ms}: the device's memory changed), `usage` (Usage: a usage limit was reached, or reset), `conversation` (ConversationEntry: each finished user transcript, reply and tool call of the device's voice conversation, " +
        "whether or not transcripts are stored), and `session` ({state: revoked | expired}) after which the stream ends. A comment line after 15 s without an event. " +
        "At most 4 open streams per session (429 `RATE_LIMITED`).",
      responses: {
        200: {
          description: "An event stream",
          content: { "text/event-stream": { schema: z.string().openapi({ description: "event: <name>\\ndata: <JSON>" }) } },
        },
        ...authErrors,
        ...errors(429),
      },
    }),
    async (c) => {
      // Written by the one stream writer: the events wait in `source` until the client takes them.
      const source = new PushSource(MAX_BACKLOG_BYTES);
      const sink: LiveSink = { event: (e) => source.push(encode(e)), keepAlive: () => source.push(SSE_KEEP_ALIVE), end: () => source.end() };
      const handle = await domain.live.open(c.get("principal") as SideControlPrincipal, sink);
      // The client's leaving, even while its stream opened (its slot taken in the store), ends it.
      source.onReturn = () => handle.close();
      return streamed(c, EVENT_STREAM, source, { encode: asIs });
    },
  );

  app.openapi(
    createRoute({
      ...route("get", "/side-control/telemetry/latest"),
      summary: "The newest value of each telemetry field",
      request: { query: TelemetryLatestQuery },
      responses: { 200: json(TelemetryLatest, "Latest values"), ...authErrors, ...errors(400) },
    }),
    async (c) => c.json(await domain.telemetry.latest(target(c), c.req.valid("query").fields), 200, JSON_UTF8),
    invalid("INVALID_TELEMETRY_QUERY"),
  );

  app.openapi(
    createRoute({
      ...route("get", "/side-control/telemetry"),
      summary: "Points of one telemetry field: raw, or the last value of each step",
      request: { query: TelemetryRangeQuery },
      responses: { 200: json(TelemetryRange, "Points"), ...authErrors, ...errors(400) },
    }),
    async (c) => c.json(await domain.telemetry.range(target(c), c.req.valid("query")), 200, JSON_UTF8),
    invalid("INVALID_TELEMETRY_QUERY"),
  );

  app.openapi(
    createRoute({
      ...route("get", "/side-control/telemetry/aggregate"),
      summary: "One telemetry field aggregated per bucket",
      request: { query: TelemetryAggregateQuery },
      responses: { 200: json(TelemetryAggregate, "Buckets"), ...authErrors, ...errors(400) },
    }),
    async (c) => c.json(await domain.telemetry.aggregate(target(c), c.req.valid("query")), 200, JSON_UTF8),
    invalid("INVALID_TELEMETRY_QUERY"),
  );

  app.openapi(
    createRoute({
      ...route("get", "/side-control/contacts"),
      summary: "The target device's contacts, by name",
      request: { query: ContactListQuery },
      responses: { 200: json(ContactList, "A page of contacts"), ...authErrors, ...errors(400) },
    }),
    async (c) => {
      const { cursor, limit } = c.req.valid("query");
      return c.json(await domain.contacts.list(target(c), cursor, limit), 200, JSON_UTF8);
    },
    invalid("INVALID_CONTACT"),
  );

  app.openapi(
    createRoute({
      ...route("post", "/side-control/contacts"),
      middleware: [jsonBodyLimit, sideControl, requireJson],
      summary: "Add a contact",
      request: { body: jsonBody(ContactCreate) },
      responses: { 201: json(Contact, "The new contact"), ...authErrors, ...errors(400, 409, 413, 415) },
    }),
    async (c) => c.json(await domain.contacts.create(target(c), c.req.valid("json")), 201, JSON_UTF8),
    invalid("INVALID_CONTACT"),
  );

  app.openapi(
    createRoute({
      ...route("get", "/side-control/contacts/{name}"),
      summary: "One contact",
      request: { params: contactName },
      responses: { 200: json(Contact, "The contact"), ...authErrors, ...errors(404) },
    }),
    async (c) => c.json(await domain.contacts.get(target(c), nameOf(c)), 200, JSON_UTF8),
  );

  app.openapi(
    createRoute({
      ...route("put", "/side-control/contacts/{name}"),
      middleware: [jsonBodyLimit, sideControl, requireJson],
      summary: "Change a contact's display name or phone number (absent fields keep their value)",
      request: { params: contactName, body: jsonBody(ContactUpdate) },
      responses: { 200: json(Contact, "The contact"), ...authErrors, ...errors(400, 404, 409, 413, 415) },
    }),
    async (c) => c.json(await domain.contacts.update(target(c), nameOf(c), c.req.valid("json")), 200, JSON_UTF8),
    invalid("INVALID_CONTACT"),
  );

  app.openapi(
    createRoute({
      ...route("delete", "/side-control/contacts/{name}"),
      summary: "Delete a contact; returns it",
      request: { params: contactName },
      responses: { 200: json(Contact, "The deleted contact"), ...authErrors, ...errors(404) },
    }),
    async (c) => c.json(await domain.contacts.delete(target(c), nameOf(c)), 200, JSON_UTF8),
  );

  app.openapi(
    createRoute({
      ...route("get", "/side-control/memory"),
      summary: "What the target device's agent remembers of its people (max_chars 0: its agent does not remember)",
      responses: { 200: json(MemoryView, "The memory"), ...authErrors },
    }),
    async (c) => c.json(await domain.memory.view(target(c)), 200, JSON_UTF8),
  );

  app.openapi(
    createRoute({
      ...route("put", "/side-control/memory"),
      middleware: [jsonBodyLimit, sideControl, requireJson, memoryBody],
      summary: "Edit the memory (`text`), or turn remembering off or on for this device (`enabled`)",
      request: { body: jsonBody(MemoryUpdate) },
      responses: { 200: json(MemoryView, "The memory now"), ...authErrors, ...errors(400, 409, 413, 415) },
    }),
    async (c) => c.json(await domain.memory.update(target(c), c.req.valid("json")), 200, JSON_UTF8),
    invalid("INVALID_MEMORY"),
  );

  app.openapi(
    createRoute({
      ...route("delete", "/side-control/memory"),
      summary: "Forget the memory for good (deleted from the store and its files)",
      responses: { 204: noContent, ...authErrors },
    }),
    async (c) => {
      await domain.memory.forget(target(c));
      return c.body(null, 204);
    },
  );

  const conversationId = z.object({ id: z.string().openapi({ description: "the conversation's id" }) });

  app.openapi(
    createRoute({
      ...route("get", "/side-control/conversations"),
      summary: "The target device's stored conversations, newest first (`stored: false` and no items while the server stores none)",
      request: { query: ConversationListQuery },
      responses: { 200: json(ConversationList, "A page of conversations"), ...authErrors, ...errors(400) },
    }),
    async (c) => {
      const { cursor, limit } = c.req.valid("query");
      return c.json(await domain.conversations.list(target(c), cursor, limit), 200, JSON_UTF8);
    },
    invalid("INVALID_REQUEST"),
  );

  app.openapi(
    createRoute({
      ...route("get", "/side-control/conversations/{id}"),
      summary: "One stored conversation with its entries in order",
      request: { params: conversationId },
      responses: { 200: json(Conversation, "The conversation"), ...authErrors, ...errors(404) },
    }),
    async (c) => c.json(await domain.conversations.get(target(c), c.req.valid("param").id), 200, JSON_UTF8),
  );

  app.openapi(
    createRoute({
      ...route("get", "/side-control/conversations/{id}/turns/{turn}/audio"),
      summary: "One side of a turn's recording as Ogg Opus (agents with `record.audio`; voice.md §8)",
      request: { params: TurnAudioParams, query: TurnAudioQuery },
      responses: {
        200: { description: "The side's audio", content: { "audio/ogg": { schema: z.string().openapi({ type: "string", format: "binary" }) } } },
        ...authErrors,
        ...errors(400, 404),
      },
    }),
    async (c) => {
      const { id, turn } = c.req.valid("param");
      const audio = await domain.conversations.audio(target(c), id, turn, c.req.valid("query").side);
      // A recording never changes: the app may keep it; it is the device's people's, so no shared cache.
      return c.body(audio as Uint8Array<ArrayBuffer>, 200, { "Content-Type": "audio/ogg", "Cache-Control": "private, max-age=3600" }) as never;
    },
    invalid("INVALID_REQUEST"),
  );

  app.openapi(
    createRoute({
      ...route("delete", "/side-control/conversations/{id}"),
      summary: "Delete a stored conversation for good",
      request: { params: conversationId },
      responses: { 204: noContent, ...authErrors, ...errors(404) },
    }),
    async (c) => {
      await domain.conversations.delete(target(c), c.req.valid("param").id);
      return c.body(null, 204);
    },
  );

  app.openapi(
    createRoute({
      ...route("delete", "/side-control/conversations"),
      summary: "Delete every stored conversation of the target device for good",
      responses: { 204: noContent, ...authErrors },
    }),
    async (c) => {
      await domain.conversations.deleteAll(target(c));
      return c.body(null, 204);
    },
  );
}

/** A memory edit's body that is empty or not JSON is `INVALID_MEMORY` too, as a wrong one is. */
const memoryBody: MiddlewareHandler<AppEnv> = async (c, next) => {
  const text = await c.req.text();
  try {
    JSON.parse(text);
  } catch {
    throw new ApiError(400, "INVALID_MEMORY", text.trim() ? "the body is not JSON" : "the body is empty: give text, enabled or both");
  }
  await next();
};

/** A client this far behind (bytes not yet taken by its connection) is dropped; it reconnects and reads the state again. */
const MAX_BACKLOG_BYTES = 1024 * 1024;
