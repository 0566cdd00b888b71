/**
 * The benchmark's provider, run as its own process: the test suite's scripted OpenAI-compatible
 * server. Model `chunks-<n>` streams n one-word chunks, each its own write; any other model answers
 * one short sentence. Prints its base URL on the first line of stdout.
 */
import { FakeUpstream } from "../test/support/fake-upstream.ts";

const upstream = new FakeUpstream();
upstream.defaultReply = (body) => {
  const n = /^chunks-(\d+)$/.exec(String(body.model))?.[1];
  const usage = { prompt_tokens: 12, completion_tokens: 9, total_tokens: 21 };
  if (n) return { chunks: Array.from({ length: Number(n) }, (_, i) => `w${i} `), delayMs: 0, usage };
  return { content: "The quick brown fox jumps over the lazy dog.", usage };
};
// The benchmark makes millions of requests: keep no record of them.
upstream.received.push = () => 0;
await upstream.start();
process.stdout.write(`${upstream.url}\n`);
