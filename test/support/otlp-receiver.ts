import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { ExportTraceServiceRequestSchema, ExportTraceServiceResponseSchema } from "./otlp/gen/opentelemetry/proto/collector/trace/v1/trace_service_pb.ts";
import type { AnyValue } from "./otlp/gen/opentelemetry/proto/common/v1/common_pb.ts";
import { type Span_SpanKind, Status_StatusCode } from "./otlp/gen/opentelemetry/proto/trace/v1/trace_pb.ts";

/** A span as the receiver decoded it, its ids in hex and its attributes as plain values. */
export interface ReceivedSpan {
  name: string;
  traceId: string;
  spanId: string;
  /** "" for a root span. */
  parentSpanId: string;
  kind: Span_SpanKind;
  attributes: Record<string, unknown>;
  events: Array<{ name: string; attributes: Record<string, unknown>; timeUnixNano: bigint }>;
  failed: boolean;
  startUnixNano: bigint;
  endUnixNano: bigint;
  resource: Record<string, unknown>;
}

/**
 * The tests' OpenTelemetry collector: an HTTP server taking OTLP/HTTP protobuf exports at
 * `/v1/traces`, decoded with the specification's messages (opentelemetry-proto, compiled with
 * protoc-gen-es). `silent`: it takes connections and requests and never answers.
 */
export class OtlpReceiver {
  readonly spans: ReceivedSpan[] = [];
  /** Export requests received (answered or not). */
  requests = 0;
  silent = false;
  private readonly server: Server;
  private readonly sockets = new Set<Socket>();
  private waiters: Array<() => void> = [];

  private constructor(server: Server) {
    this.server = server;
    server.on("connection", (s) => {
      this.sockets.add(s);
      s.once("close", () => this.sockets.delete(s));
    });
    server.on("request", (req, res) => void this.serve(req, res));
  }

  static async start(o: { silent?: boolean } = {}): Promise<OtlpReceiver> {
    const server = createServer();
    const r = new OtlpReceiver(server);
    r.silent = o.silent ?? false;
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    return r;
  }

  /** The base URL to configure as `tracing.otlp.endpoint`. */
  get endpoint(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  private async serve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    this.requests++;
    if (this.silent) {
      this.notify();
      return;
    }
    if (req.method !== "POST" || req.url !== "/v1/traces" || req.headers["content-type"] !== "application/x-protobuf") {
      res.writeHead(400).end();
      return;
    }
    const request = fromBinary(ExportTraceServiceRequestSchema, Buffer.concat(chunks));
    for (const rs of request.resourceSpans) {
      const resource = attributesOf(rs.resource?.attributes ?? []);
      for (const ss of rs.scopeSpans) {
        for (const s of ss.spans) {
          this.spans.push({
            name: s.name,
            traceId: hex(s.traceId),
            spanId: hex(s.spanId),
            parentSpanId: hex(s.parentSpanId),
            kind: s.kind,
            attributes: attributesOf(s.attributes),
            events: s.events.map((e) => ({ name: e.name, attributes: attributesOf(e.attributes), timeUnixNano: e.timeUnixNano })),
            failed: s.status?.code === Status_StatusCode.ERROR,
            startUnixNano: s.startTimeUnixNano,
            endUnixNano: s.endTimeUnixNano,
            resource,
          });
        }
      }
    }
    res.writeHead(200, { "content-type": "application/x-protobuf" }).end(toBinary(ExportTraceServiceResponseSchema, create(ExportTraceServiceResponseSchema)));
    this.notify();
  }

  private notify(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  /** Waits until `check` holds over what was received (checked on each export; at most `ms`). */
  async until<T>(check: (spans: ReceivedSpan[]) => T | undefined | false, ms = 15_000): Promise<T> {
    const deadline = Date.now() + ms;
    for (;;) {
      const v = check(this.spans);
      if (v) return v;
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`the receiver did not get the spans awaited; it has: ${this.spans.map((s) => s.name).join(", ")}`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  /** The spans of one trace. */
  trace(traceId: string): ReceivedSpan[] {
    return this.spans.filter((s) => s.traceId === traceId);
  }

  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

function hex(b: Uint8Array): string {
  return Buffer.from(b).toString("hex");
}

function attributesOf(list: ReadonlyArray<{ key: string; value?: AnyValue | undefined }>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const kv of list) out[kv.key] = plainValue(kv.value);
  return out;
}

function plainValue(v: AnyValue | undefined): unknown {
  const c = v?.value;
  if (!c) return undefined;
  switch (c.case) {
    case "intValue":
      return Number(c.value);
    case "arrayValue":
      return c.value.values.map(plainValue);
    case "kvlistValue":
      return attributesOf(c.value.values);
    default:
      return c.value;
  }
}
