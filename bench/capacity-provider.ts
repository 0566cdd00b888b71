/**
 * The capacity benchmark's provider, its own process: an OpenAI-compatible server that answers at
 * once. `POST /v1/audio/transcriptions`: the question's words; `/v1/chat/completions` (streamed or
 * not): one short sentence; `/v1/audio/speech`: BENCH_CAPACITY_REPLY_MS (1200) of 24 kHz PCM, in
 * one write. It reads every body (as a provider must) and keeps nothing. Prints its base URL on the
 * first line of stdout.
 */
import http from "node:http";
import type { AddressInfo } from "node:net";

const REPLY_MS = Number(process.env.BENCH_CAPACITY_REPLY_MS ?? 1200);
const HEARD = "What is the weather like today?";
const ANSWER = "It is sunny and warm today.";
const RATE = 24_000;

/** A voice-like sound: a 180 Hz tone whose loudness moves at syllable rate. */
const pcm = new Int16Array(Math.round((REPLY_MS / 1000) * RATE));
for (let i = 0; i < pcm.length; i++) {
  const t = i / RATE;
  pcm[i] = Math.round(9000 * (0.6 + 0.4 * Math.sin(2 * Math.PI * 4 * t)) * Math.sin(2 * Math.PI * 180 * t));
}
const speech = Buffer.from(pcm.buffer);
const usage = { prompt_tokens: 12, completion_tokens: 7, total_tokens: 19 };

const server = http.createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on("data", (c: Buffer) => chunks.push(c));
  req.on("end", () => {
    const path = req.url ?? "";
    if (req.method !== "POST") return void res.writeHead(404).end();
    if (path === "/v1/audio/transcriptions") {
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ text: HEARD }));
      return;
    }
    if (path === "/v1/audio/speech") {
      res.writeHead(200, { "content-type": "audio/pcm", "content-length": speech.length }).end(speech);
      return;
    }
    if (path !== "/v1/chat/completions") return void res.writeHead(404, { "content-type": "application/json" }).end('{"error":{"message":"not found"}}');
    const body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as { model?: string; stream?: boolean };
    const base = { id: "chatcmpl-capacity", created: 1, model: body.model ?? "scripted" };
    if (!body.stream) {
      const message = { role: "assistant", content: ANSWER };
      res
        .writeHead(200, { "content-type": "application/json" })
        .end(JSON.stringify({ ...base, object: "chat.completion", choices: [{ index: 0, message, finish_reason: "stop" }], usage }));
      return;
    }
    const event = (choices: unknown[], extra: Record<string, unknown> = {}) =>
      `data: ${JSON.stringify({ ...base, object: "chat.completion.chunk", choices, ...extra })}\n\n`;
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.end(
      event([{ index: 0, delta: { role: "assistant", content: ANSWER }, finish_reason: null }]) +
        event([{ index: 0, delta: {}, finish_reason: "stop" }]) +
        event([], { usage }) +
        "data: [DONE]\n\n",
    );
  });
});
server.keepAliveTimeout = 60_000;
server.listen(0, "127.0.0.1", () => {
  process.stdout.write(`http://127.0.0.1:${(server.address() as AddressInfo).port}/v1\n`);
});
process.on("disconnect", () => process.exit(0));
