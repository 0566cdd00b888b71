/**
 * A fake realtime model for the benchmark and for trying a realtime agent by hand (never part of
 * the server): the tests' fake (test/support/fake-realtime.ts), a WebSocket server on 127.0.0.1
 * speaking the OpenAI Realtime API's GA events. It hears speech with its own energy detector and
 * answers each turn at once (its first audio delta 0 ms after speech_stopped), faster than real
 * time. Prints its base URL (for an `openai-compatible` provider's `base_url`) on the first line.
 *
 *   npx tsx bench/realtime-fake.ts [--port 9000] [--reply "text"] [--voice]
 *
 * `--voice`: the reply is the text spoken by the embedded synthesiser (else a tone of its length).
 * BENCH_REALTIME_STAMP=1: each reply's transcript starts with the speech_stopped time (the bench).
 */
import { createSpeechEngine } from "../src/ai/speech/index.ts";
import { loadResampler, Resampler } from "../src/audio/resampler.ts";
import { startFakeRealtime } from "../test/support/fake-realtime.ts";

const arg = (name: string) => {
  const at = process.argv.indexOf(name);
  return at >= 0 ? process.argv[at + 1] : undefined;
};
const reply = arg("--reply") ?? "Hello from the fake realtime model. It is sunny today.";
const fake = await startFakeRealtime({ stamp: process.env.BENCH_REALTIME_STAMP === "1", ...(arg("--port") ? { port: Number(arg("--port")) } : {}) });
if (process.argv.includes("--voice")) {
  const spoken = await createSpeechEngine().speak(reply, "alloy");
  const r = new Resampler(await loadResampler(), spoken.sampleRate, 24_000);
  fake.fallback = { kind: "reply", text: reply, pcm: r.process(spoken.samples) };
  r.close();
} else fake.fallback = { kind: "reply", text: reply, ms: Number(process.env.BENCH_REALTIME_REPLY_MS ?? 2_000) };
fake.transcript = process.env.BENCH_REALTIME_TRANSCRIPT ?? "What is the weather like in Paris?";
process.stdout.write(`${fake.url}\n`);
process.on("SIGTERM", () => void fake.close().then(() => process.exit(0)));
process.on("SIGINT", () => void fake.close().then(() => process.exit(0)));
