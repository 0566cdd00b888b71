import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import OpenAI from "openai";
import pino from "pino";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { OtlpReceiver, type ReceivedSpan } from "./support/otlp-receiver.ts";
import { startTestServer, type TestServer } from "./support/server.ts";

/**
 * Traces (voice.md §8) of HTTP requests and Compatible API calls, checked at an OTLP/HTTP receiver
 * decoding the specification's protobuf messages: the server exports through the OpenTelemetry SDK
 * as it would to a Collector.
 */

const SPAN_KIND_SERVER = 2;
const SPAN_KIND_CLIENT = 3;
const SECRET_WORDS = "purple elephant 4711";

type LogLine = Record<string, unknown>;

function chatConfig(upstream: FakeUpstream, endpoint: string | undefined, includeText = false) {
  return {
    providers: [{ id: "primary", kind: "openai-compatible" as const, base_url: upstream.url, max_retries: 0 }],
    models: [{ id: "my-chat", kind: "chat" as const, provider: "primary", upstream_model: "llama3.2" }],
    agents: [{ id: "helper", model: "my-chat", instructions: "Be brief.", tools: ["device_status"], max_steps: 3 }],
    tracing: {
      ...(endpoint ? { otlp: { endpoint, schedule_delay_ms: 5 } } : {}),
      include_text: includeText,
    },
  };
}

async function metricValue(server: TestServer, name: string, labels = ""): Promise<number | undefined> {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(`${name}${labels} `));
  return line === undefined ? undefined : Number(line.split(" ").at(-1));
}

/** Every attribute value of the spans, as text. */
function attributeTexts(spans: ReceivedSpan[]): string[] {
  return spans.flatMap((s) => [
    ...Object.values(s.attributes).map((v) => JSON.stringify(v)),
    ...s.events.flatMap((e) => Object.values(e.attributes).map((v) => JSON.stringify(v))),
  ]);
}

describe("tracing: HTTP requests and Compatible API calls", () => {
  let receiver: OtlpReceiver;
  let upstream: FakeUpstream;
  let server: TestServer;
  let device: OpenAI;
  const lines: LogLine[] = [];

  before(async () => {
    receiver = await OtlpReceiver.start();
    upstream = await startFakeUpstream();
    const logger = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line) as LogLine) });
    server = await startTestServer({ logger, config: chatConfig(upstream, receiver.endpoint) });
    const peer = server.client();
    await peer.login();
    device = new OpenAI({ apiKey: peer.accessToken!, baseURL: `${server.url}/openai/v1`, maxRetries: 0 });
  });

  after(async () => {
    await server?.stop();
    await upstream?.close();
    await receiver?.close();
  });

  test("every request is a server span named by its route pattern, and its log line carries the trace id", async () => {
    const ids = ["trace-info", "trace-unknown", "trace-contact"];
    assert.equal((await fetch(`${server.url}/server-info`, { headers: { "X-Request-ID": ids[0]! } })).status, 200);
    assert.equal((await fetch(`${server.url}/no/such/route`, { headers: { "X-Request-ID": ids[1]! } })).status, 404);
    assert.equal((await fetch(`${server.url}/side-control/contacts/bob`, { headers: { "X-Request-ID": ids[2]! } })).status, 401);
    const traceIds = ids.map((id) => {
      const line = lines.find((l) => l.req_id === id && l.msg === "request");
      assert.ok(line, `the log line of ${id}`);
      assert.match(String(line.trace_id), /^[0-9a-f]{32}$/, `${id}: its trace id`);
      return String(line.trace_id);
    });
    const [info, unknown, contact] = await receiver.until((spans) => {
      const found = traceIds.map((t) => spans.find((s) => s.traceId === t));
      return found.every(Boolean) ? (found as ReceivedSpan[]) : undefined;
    });
    assert.equal(info!.name, "GET /server-info");
    assert.equal(info!.kind, SPAN_KIND_SERVER);
    assert.equal(info!.parentSpanId, "");
    assert.deepEqual(
      [info!.attributes["http.request.method"], info!.attributes["http.route"], info!.attributes["http.response.status_code"], info!.attributes["url.path"]],
      ["GET", "/server-info", 200, "/server-info"],
    );
    assert.equal(info!.resource["service.name"], "perch");
    // No route: the method alone names it (a path would make a name per URL).
    assert.equal(unknown!.name, "GET");
    assert.equal(unknown!.attributes["http.route"], undefined);
    assert.equal(unknown!.attributes["http.response.status_code"], 404);
    // A route with a parameter: named by its pattern, not by the path.
    assert.equal(contact!.name, "GET /side-control/contacts/:name");
    assert.equal(contact!.attributes["url.path"], "/side-control/contacts/bob");
  });

  test("a chat completion of an agent: model calls with gen_ai attributes and the tool call, under the request's server span", async () => {
    upstream.reply(
      { tool_calls: [{ id: "call_7", name: "device_status", arguments: "{}" }], usage: { prompt_tokens: 11, completion_tokens: 5, total_tokens: 16 } },
      { content: "All is well.", usage: { prompt_tokens: 20, completion_tokens: 4, total_tokens: 24 } },
    );
    const r = await device.chat.completions.create({ model: "helper", messages: [{ role: "user", content: `How are you? ${SECRET_WORDS}` }] });
    assert.equal(r.choices[0]?.message.content, "All is well.");
    const spans = await receiver.until((all) => {
      const root = all.find((s) => s.name === "POST /openai/v1/chat/completions");
      if (!root) return undefined;
      const trace = receiver.trace(root.traceId);
      return trace.length >= 4 ? trace : undefined;
    });
    const root = spans.find((s) => s.name === "POST /openai/v1/chat/completions")!;
    assert.equal(root.kind, SPAN_KIND_SERVER);
    assert.equal(root.attributes["http.route"], "/openai/v1/chat/completions");
    const models = spans.filter((s) => s.name === "chat llama3.2");
    assert.equal(models.length, 2, "one span per model call");
    for (const m of models) {
      assert.equal(m.parentSpanId, root.spanId);
      assert.equal(m.kind, SPAN_KIND_CLIENT);
      assert.equal(m.attributes["gen_ai.operation.name"], "chat");
      assert.equal(m.attributes["gen_ai.request.model"], "llama3.2");
      assert.equal(m.attributes["gen_ai.provider.name"], "primary");
    }
    assert.deepEqual(models.map((m) => [m.attributes["gen_ai.usage.input_tokens"], m.attributes["gen_ai.usage.output_tokens"]]).sort(), [
      [11, 5],
      [20, 4],
    ]);
    const tool = spans.find((s) => s.name === "execute_tool device_status");
    assert.ok(tool, "the tool call's span");
    assert.equal(tool.parentSpanId, root.spanId);
    assert.deepEqual([tool.attributes["gen_ai.tool.name"], tool.attributes["gen_ai.tool.call.id"], tool.failed], ["device_status", "call_7", false]);
    // What the user said is in no attribute (tracing.include_text is off).
    for (const text of attributeTexts(spans)) assert.ok(!text.includes("elephant"), `an attribute holds what was said: ${text}`);
  });

  test("a streamed chat completion: its model call's time to first chunk and tokens", async () => {
    upstream.reply({
      content: "Streaming.",
      chunks: ["Stream", "ing."],
      firstTokenMs: 30,
      usage: { prompt_tokens: 9, completion_tokens: 2, total_tokens: 11 },
    });
    const stream = await device.chat.completions.create({ model: "my-chat", messages: [{ role: "user", content: "Hi" }], stream: true });
    let text = "";
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? "";
    assert.equal(text, "Streaming.");
    const model = await receiver.until((all) => all.find((s) => s.name === "chat llama3.2" && s.attributes["gen_ai.request.stream"] === true));
    const ttft = model.attributes["perch.gen_ai.time_to_first_token"] as number;
    const ttfc = model.attributes["gen_ai.response.time_to_first_chunk"] as number;
    assert.ok(ttft >= 0.03, `time to first token ${ttft} s, the upstream waited 30 ms before its first text`);
    assert.ok(ttfc <= ttft, `time to first chunk ${ttfc} s: its role came first`);
    assert.deepEqual([model.attributes["gen_ai.usage.input_tokens"], model.attributes["gen_ai.usage.output_tokens"]], [9, 2]);
    const root = receiver.spans.find((s) => s.spanId === model.parentSpanId);
    assert.equal(root?.name, "POST /openai/v1/chat/completions");
    // The server span lasts as long as the stream: it ends after the model's first text was relayed.
    assert.ok(root.endUnixNano >= model.startUnixNano + BigInt(Math.round(ttft * 1e9)), "the server span covers the stream");
  });
});

describe("tracing: words only with include_text", () => {
  test("the request's messages are an attribute of the model call with tracing.include_text", async () => {
    const receiver = await OtlpReceiver.start();
    const upstream = await startFakeUpstream();
    const server = await startTestServer({ config: chatConfig(upstream, receiver.endpoint, true) });
    try {
      const peer = server.client();
      await peer.login();
      const device = new OpenAI({ apiKey: peer.accessToken!, baseURL: `${server.url}/openai/v1`, maxRetries: 0 });
      await device.chat.completions.create({ model: "my-chat", messages: [{ role: "user", content: `Hello ${SECRET_WORDS}` }] });
      const model = await receiver.until((all) => all.find((s) => s.name === "chat llama3.2"));
      assert.match(String(model.attributes["gen_ai.input.messages"]), /purple elephant 4711/);
      assert.match(String(model.attributes["gen_ai.output.messages"]), /Hello from llama3\.2/);
    } finally {
      await server.stop();
      await upstream.close();
      await receiver.close();
    }
  });
});

describe("tracing: a collector that never answers, or is away", () => {
  test("a silent collector: requests are answered while its export hangs, and the spans beyond the queue are dropped and counted", async () => {
    const receiver = await OtlpReceiver.start({ silent: true });
    const server = await startTestServer({
      config: { tracing: { otlp: { endpoint: receiver.endpoint, max_queue_size: 4, max_export_batch_size: 2, schedule_delay_ms: 1, timeout_ms: 60_000 } } },
    });
    try {
      // The first spans go out in an export the collector never answers; the next ones fill the queue.
      assert.equal((await fetch(`${server.url}/server-info`)).status, 200);
      await receiver.until(() => receiver.requests >= 1);
      for (let i = 0; i < 12; i++) assert.equal((await fetch(`${server.url}/server-info`)).status, 200);
      assert.equal(receiver.spans.length, 0);
      const dropped = await metricValue(server, "perch_tracing_spans_dropped_total", '{reason="queue_full"}');
      assert.ok(dropped !== undefined && dropped >= 6, `spans dropped for a full queue: ${dropped}`);
    } finally {
      // Closing does not wait for the silent collector beyond its bound.
      await server.stop();
      await receiver.close();
    }
  });

  test("an absent collector: the failed exports' spans are counted as dropped", async () => {
    const gone = await OtlpReceiver.start();
    const endpoint = gone.endpoint;
    await gone.close();
    const server = await startTestServer({ config: { tracing: { otlp: { endpoint, schedule_delay_ms: 1, timeout_ms: 300 } } } });
    try {
      for (let i = 0; i < 3; i++) assert.equal((await fetch(`${server.url}/server-info`)).status, 200);
      const deadline = Date.now() + 15_000;
      let failed = 0;
      while (Date.now() < deadline) {
        failed = (await metricValue(server, "perch_tracing_spans_dropped_total", '{reason="export_failed"}')) ?? 0;
        if (failed >= 3) break;
        await new Promise((r) => setTimeout(r, 50));
      }
      assert.ok(failed >= 3, `spans of failed exports: ${failed}`);
    } finally {
      await server.stop();
    }
  });

  test("sample_ratio 0: requests are answered and traced by no span sent, their log lines without a trace id", async () => {
    const receiver = await OtlpReceiver.start();
    const lines: LogLine[] = [];
    const logger = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line) as LogLine) });
    const server = await startTestServer({ logger, config: { tracing: { otlp: { endpoint: receiver.endpoint, schedule_delay_ms: 1 }, sample_ratio: 0 } } });
    try {
      for (let i = 0; i < 5; i++) assert.equal((await fetch(`${server.url}/server-info`, { headers: { "X-Request-ID": `unsampled-${i}` } })).status, 200);
      await server.tracing!.flush();
      assert.equal(receiver.requests, 0, "nothing exported");
      assert.equal(await metricValue(server, "perch_tracing_spans_dropped_total", '{reason="queue_full"}'), 0);
      const line = lines.find((l) => l.req_id === "unsampled-0" && l.msg === "request");
      assert.ok(line);
      assert.equal(line.trace_id, undefined);
    } finally {
      await server.stop();
      await receiver.close();
    }
  });

  test("no endpoint: no tracing at all (no provider, no tracing metrics, no trace id in the log line)", async () => {
    const lines: LogLine[] = [];
    const logger = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line) as LogLine) });
    const server = await startTestServer({ logger });
    try {
      assert.equal(server.tracing, undefined);
      await fetch(`${server.url}/server-info`, { headers: { "X-Request-ID": "untraced" } });
      assert.equal(await metricValue(server, "perch_tracing_spans_dropped_total", '{reason="queue_full"}'), undefined);
      const line = lines.find((l) => l.req_id === "untraced" && l.msg === "request");
      assert.ok(line);
      assert.equal(line.trace_id, undefined);
    } finally {
      await server.stop();
    }
  });
});
