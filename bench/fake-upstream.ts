/**
 * The benchmark's provider, run as its own process: the test suite's scripted OpenAI-compatible
 * server. Model `chunks-<n>` streams n one-word chunks, each its own write; any other model answers
 * one short sentence (a story of a few sentences when the last user message asks for one).
 * `BENCH_MODEL_TTFT_MS` (default 0): streamed answers wait this long before their first text, as a
 * real model does. Prints its base URL on the first line of stdout.
 */
import { FakeUpstream } from "../test/support/fake-upstream.ts";

const TTFT_MS = Number(process.env.BENCH_MODEL_TTFT_MS ?? 0);
const STORY = [
  "Once upon a time a cat lived by the sea. ",
  "Every morning it watched the boats come in. ",
  "One day a boat brought a fish as big as the cat. ",
];

const upstream = new FakeUpstream();
upstream.defaultReply = (body) => {
  const n = /^chunks-(\d+)$/.exec(String(body.model))?.[1];
  const usage = { prompt_tokens: 12, completion_tokens: 9, total_tokens: 21 };
  const first = TTFT_MS > 0 ? { firstTokenMs: TTFT_MS } : {};
  if (n) return { chunks: Array.from({ length: Number(n) }, (_, i) => `w${i} `), delayMs: 0, usage, ...first };
  const messages = Array.isArray(body.messages) ? (body.messages as Array<{ role?: string; content?: unknown }>) : [];
  const said = messages.filter((m) => m.role === "user").at(-1)?.content;
  if (typeof said === "string" && /story/i.test(said)) return { chunks: STORY, usage, ...first };
  return { content: "The quick brown fox jumps over the lazy dog.", usage, ...first };
};
// The benchmark makes millions of requests: keep no record of them.
upstream.received.push = () => 0;
await upstream.start();
process.stdout.write(`${upstream.url}\n`);
