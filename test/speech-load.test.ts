/**
 * Speech under load (issue 24), on the real server with real clients: conversations' work goes
 * before the Compatible API's, callers are served in turn, a client that stops reading stops
 * costing synthesis, and an engine that cannot start work in time says so (429 with Retry-After,
 * `overloaded` turn events) and recovers. Every check is an order or a count, never a time.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import net from "node:net";
import { after, before, describe, test } from "node:test";
import { createSpeechEngine, type FliteSpeechEngine } from "../src/ai/speech/index.ts";
import { speechChunks } from "../src/ai/speech/text.ts";
import { wavFile } from "../src/audio/samples.ts";
import { engines } from "./support/engines.ts";
import { type FakeUpstream, startFakeUpstream } from "./support/fake-upstream.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { EventLog, resample, talkerConfig } from "./support/voice.ts";
import { connect, eventually } from "./support/webrtc.ts";

const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");
const KEYS = { a: "sk-perch-load-a", b: "sk-perch-load-b" };
const API_KEYS = Object.entries(KEYS).map(([name, key]) => ({ name, sha256: sha256(key) }));
const LONG = "The small device reports its battery level, its temperature and its location to the server every single minute. ".repeat(40).slice(0, 4096);
const QUESTION = "What is the weather like today?";

interface Speech {
  /** Resolves when the first byte of audio arrived. */
  firstByte: Promise<void>;
  /** Resolves with the status and the bytes of audio once the answer ended. */
  done: Promise<{ status: number; bytes: number; retryAfter: string | null }>;
}

/** One `POST /audio/speech`, read as it arrives; an aborted one ends with status 0. */
function speech(server: TestServer, key: string, input: string, signal?: AbortSignal): Speech {
  let arrived!: () => void;
  const firstByte = new Promise<void>((resolve) => {
    arrived = resolve;
  });
  const done = (async () => {
    let bytes = 0;
    try {
      const res = await fetch(`${server.url}/openai/v1/audio/speech`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "tts-1", input, voice: "alloy", response_format: "pcm" }),
        ...(signal ? { signal } : {}),
      });
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
        if (bytes === 0 && chunk.length > 0) arrived();
        bytes += chunk.length;
      }
      return { status: res.status, bytes, retryAfter: res.headers.get("retry-after") };
    } catch (err) {
      if (!signal?.aborted) throw err;
      return { status: 0, bytes, retryAfter: null };
    } finally {
      arrived();
    }
  })();
  return { firstByte, done };
}

/** One `POST /audio/transcriptions` of `wav` with segments (verbose_json). */
async function transcribe(server: TestServer, key: string, wav: Uint8Array): Promise<{ status: number; body: unknown }> {
  const form = new FormData();
  form.append("model", "whisper-1");
  form.append("response_format", "verbose_json");
  form.append("file", new Blob([new Uint8Array(wav)], { type: "audio/wav" }), "speech.wav");
  const res = await fetch(`${server.url}/openai/v1/audio/transcriptions`, { method: "POST", headers: { authorization: `Bearer ${key}` }, body: form });
  return { status: res.status, body: await res.json() };
}

/** Clients that each ask for long speech again and again until stopped; each answer's size is kept. */
function loopingClients(server: TestServer, count: number, key = KEYS.a) {
  let stopped = false;
  const answers: Array<{ status: number; bytes: number }> = [];
  let started = 0;
  const clients = Array.from({ length: count }, async () => {
    while (!stopped) {
      started++;
      answers.push(await speech(server, key, LONG).done);
    }
  });
  return {
    answers,
    get started() {
      return started;
    },
    /** Stops asking; resolves when every client's last request has ended. */
    stop: async () => {
      stopped = true;
      await Promise.all(clients);
    },
  };
}

/** The value of a /metrics sample, 0 when absent. */
async function metric(server: TestServer, name: string, labels: string): Promise<number> {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(`${name}{${labels}}`));
  return line ? Number(line.split(" ").at(-1)) : 0;
}

/** Bytes of PCM (24 kHz, 16-bit) the long text makes, at least: a second a dozen characters is far below flite's pace. */
const LONG_PCM_MIN_BYTES = (LONG.length / 12) * 48_000 * 0.5;

describe("speech under load: conversations first, callers in turn", () => {
  let upstream: FakeUpstream;
  let server: TestServer;
  /** The question as a device's microphone gives it (another voice than the reply's), made before any load. */
  let question: Int16Array;
  /** About a minute of speech, as a WAV file. */
  let longSpeech: Uint8Array;

  before(async () => {
    upstream = await startFakeUpstream();
    server = await startTestServer({ config: { ...talkerConfig(upstream.url), api_keys: API_KEYS }, engines: engines() });
    const flite = engines().speech as FliteSpeechEngine;
    const { samples, sampleRate } = await flite.speak(QUESTION, "nova");
    question = await resample(samples, sampleRate, 48_000);
    const talk = await flite.speak(LONG.slice(0, 900), "echo");
    longSpeech = wavFile(talk.samples, talk.sampleRate);
  });

  after(async () => {
    await server?.stop();
    await upstream?.close();
  });

  test("a conversation's reply arrives while 8 clients loop on 4,096-character speech requests, and each of them completes", { timeout: 600_000 }, async () => {
    const conn = await connect(server);
    const log = new EventLog(conn);
    const mic = await conn.microphone();
    const load = loopingClients(server, 8);
    try {
      // Every client has a long request streaming before the device speaks.
      await eventually(() => load.started >= 8, 60_000, "8 requests started");
      await eventually(async () => (await metric(server, "perch_engine_queue_depth", 'engine="speech",class="api"')) >= 4, 60_000, "a queue of API work");
      const inFlight = load.started;
      upstream.reply({ content: "It is sunny today." });
      await mic.say(question);
      await log.wait((s) => s.stream === "out-1" && s.type === "BOS" && s.label === "assistant.audio", 120_000, "the reply's audio");
      // Not one of the long requests that were streaming when the device spoke has ended yet.
      assert.equal(load.answers.length, 0, `${load.answers.length} of the ${inFlight} long requests ended before the reply's first audio`);
      await log.wait((s) => s.stream === "out-1" && s.label === "turn.metrics", 120_000, "the turn's end");
      assert.equal(log.of("out-1").find((s) => s.type === "EOS" && s.label === "assistant.audio")?.error, undefined);
    } finally {
      await load.stop();
      conn.close();
    }
    assert.equal(load.answers.length, load.started);
    for (const answer of load.answers) {
      assert.equal(answer.status, 200);
      assert.ok(answer.bytes > LONG_PCM_MIN_BYTES, `a whole answer: ${answer.bytes} bytes`);
    }
  });

  test("a file started first: a turn beside it waits for one of the file's jobs, and its transcript comes before the file's", {
    timeout: 600_000,
  }, async () => {
    const conn = await connect(server);
    const log = new EventLog(conn);
    const mic = await conn.microphone();
    const transcripts = () => log.all.filter((s) => s.type === "TEXT_DONE" && s.label === "user.transcript").length;
    try {
      // A first turn: the conversation is going on.
      upstream.reply({ content: "It is sunny today." });
      await mic.say(question);
      await log.wait((s) => s.stream === "out-1" && s.label === "turn.metrics", 120_000, "the first turn's end");
      const started = () => metric(server, "perch_engine_jobs_total", 'engine="recognition",class="api"');
      const before = await started();
      let fileDone = -1;
      const file = transcribe(server, KEYS.a, longSpeech).then((r) => {
        fileDone = transcripts();
        return r;
      });
      // The file's first recognition job runs; then the device asks.
      await eventually(async () => (await started()) > before, 120_000, "the file's first recognition job");
      upstream.reply({ content: "It is sunny today." });
      await mic.say(question);
      await eventually(() => transcripts() >= 2, 120_000, "the second turn's transcript");
      const { status, body } = await file;
      assert.equal(status, 200);
      assert.ok(fileDone >= 2, "the file's transcription ended before the turn's transcript");
      // The file's jobs are as a file alone gets them (neighbours joined up to 12 s): a conversation does not change its words.
      const segments = (body as { segments: Array<{ start: number; end: number }> }).segments;
      assert.ok(segments.length >= 3, `${segments.length} segments`);
      for (const seg of segments) assert.ok(seg.end - seg.start <= 20.01, `a job of ${seg.end - seg.start} s`);
    } finally {
      conn.close();
    }
  });

  test("two callers, one with 12 requests in flight and one with 1: the single request's first byte comes before the other's 12th", {
    timeout: 300_000,
  }, async () => {
    const order: string[] = [];
    const stop = new AbortController();
    const many = Array.from({ length: 12 }, (_, i) => {
      const s = speech(server, KEYS.a, LONG, stop.signal);
      s.firstByte.then(() => order.push(`a${i + 1}`));
      return s;
    });
    try {
      // All twelve are queued on the engine (two run, one sentence each, the rest wait) before b asks.
      await eventually(async () => (await metric(server, "perch_engine_queue_depth", 'engine="speech",class="api"')) >= 10, 60_000, "a's 12 requests queued");
      const one = speech(server, KEYS.b, "Hello there.");
      one.firstByte.then(() => order.push("b"));
      await one.firstByte;
      await Promise.all(many.map((m) => m.firstByte));
      const b = order.indexOf("b");
      assert.ok(b >= 0 && b < 11, `b's first byte after ${b} of a's first bytes: ${order.join(" ")}`);
      assert.equal((await one.done).status, 200);
    } finally {
      // a's answers are not needed whole.
      stop.abort();
      await Promise.all(many.map((m) => m.done));
    }
  });
});

describe("a client that never reads", () => {
  let server: TestServer;
  before(async () => {
    // Long enough that without a bound on the read-ahead the whole text would be synthesised first.
    server = await startTestServer({ config: { api_keys: API_KEYS, compat: { write_timeout_ms: 15_000 } }, engines: engines() });
  });
  after(() => server?.stop());

  test("synthesis stops after the bounded read-ahead, and the write timeout still ends the request", { timeout: 300_000 }, async () => {
    const jobs = () => metric(server, "perch_engine_jobs_total", 'engine="speech",class="api"');
    const gaveUp = () => metric(server, "perch_ai_requests_total", 'route="/audio/speech",model="tts-1",status="499"');
    const before = await jobs();
    // At a quarter of the speed, ~40 MB of PCM: far more than the sockets' buffers take (a few MB).
    const json = JSON.stringify({ model: "tts-1", input: LONG, voice: "alloy", response_format: "pcm", speed: 0.25 });
    const socket = net.connect(Number(new URL(server.url).port), "127.0.0.1", () => {
      socket.write(
        `POST /openai/v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${KEYS.a}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(json)}\r\n\r\n${json}`,
      );
      socket.pause();
    });
    socket.on("error", () => {});
    const closed = new Promise<void>((resolve) => socket.once("close", () => resolve()));
    try {
      // Synthesis stops for it: nothing of it runs or waits, and no job starts for a while (a few
      // polls), all before the write timeout ends the request.
      let spent = -1;
      for (let still = 0; still < 5; ) {
        assert.equal(await gaveUp(), 0, "synthesis was still going when the write timeout ended the request");
        const now = (await jobs()) - before;
        const idle =
          (await metric(server, "perch_engine_jobs_running", 'engine="speech"')) === 0 &&
          (await metric(server, "perch_engine_queue_depth", 'engine="speech",class="api"')) === 0;
        still = idle && now === spent ? still + 1 : 0;
        spent = now;
        await new Promise((r) => setTimeout(r, 500));
      }
      const chunks = speechChunks(LONG).length;
      assert.ok(spent > 0, "synthesis started");
      assert.ok(spent < chunks / 2, `${spent} of the text's ${chunks} sentences were synthesised for a client that read none`);
      // Then the write timeout ends the request, which cancels the synthesis.
      await eventually(async () => (await gaveUp()) === 1, 120_000, "the write timeout");
      // What the client had been sent is still there to read, then the connection ends.
      socket.resume();
      await closed;
      // Nothing more was synthesised for it.
      assert.equal(await metric(server, "perch_engine_queue_depth", 'engine="speech",class="api"'), 0);
      assert.equal((await jobs()) - before, spent);
    } finally {
      socket.destroy();
    }
  });
});

describe("overload: refused honestly, and recovered from", { timeout: 600_000 }, () => {
  let upstream: FakeUpstream;
  /** Where the load comes from (the default budget) and where the refusals are seen (a budget of 1 ms), sharing one flite worker. */
  let load: TestServer;
  let server: TestServer;
  let question: Int16Array;
  // No foreground worker kept for conversations: the turn shares the one worker with the API's load (and so can be refused).
  const speechEngine = createSpeechEngine({ concurrency: 1, foreground: 0 });

  before(async () => {
    upstream = await startFakeUpstream();
    const shared = { speech: speechEngine, transcription: engines().transcription };
    load = await startTestServer({ config: { api_keys: API_KEYS }, engines: shared });
    server = await startTestServer({
      config: { ...talkerConfig(upstream.url), api_keys: API_KEYS, compat: { max_queue_wait_ms: 1 }, voice: { agent: "talker", max_reply_delay_ms: 1 } },
      engines: shared,
    });
    const { samples, sampleRate } = await speechEngine.speak(QUESTION, "nova");
    question = await resample(samples, sampleRate, 48_000);
  });

  after(async () => {
    await server?.stop();
    await load?.stop();
    await upstream?.close();
  });

  test("with the queue full a turn ends with `overloaded` events and an API call gets 429 with Retry-After; both work once the load stops", {
    timeout: 600_000,
  }, async () => {
    const conn = await connect(server);
    const log = new EventLog(conn);
    const mic = await conn.microphone();
    const clients = loopingClients(load, 8);
    try {
      await eventually(async () => (await metric(load, "perch_engine_queue_depth", 'engine="speech",class="api"')) >= 2, 60_000, "a queue of API work");
      const tooBusy = await speech(server, KEYS.b, "Hello there.").done;
      assert.equal(tooBusy.status, 429);
      assert.ok(Number(tooBusy.retryAfter) >= 1, `Retry-After: ${tooBusy.retryAfter}`);

      // (On a starved machine the detector may cut the question in two, or miss it, or the worker
      // may be between two API jobs when the turn's job comes: the question is asked again until a
      // turn ends as overloaded.)
      const overloaded = (s: { type: string; label: string; error?: { code: string } }) =>
        s.type === "EOS" && s.label === "assistant.text" && s.error?.code === "overloaded";
      let refused: Awaited<ReturnType<typeof log.wait>> | undefined;
      for (let attempt = 0; attempt < 6 && !refused; attempt++) {
        await eventually(async () => (await metric(load, "perch_engine_queue_depth", 'engine="speech",class="api"')) >= 2, 60_000, "a queue of API work");
        upstream.reply({ content: "It is sunny today." });
        await mic.say(question);
        refused = await log.wait(overloaded, 30_000, "a turn ended as overloaded").catch(() => undefined);
      }
      assert.ok(refused, `no turn ended as overloaded; seen: ${JSON.stringify(log.all.map((s) => [s.type, s.stream, s.label, s.error?.code]))}`);
      assert.ok(!log.of(refused.stream).some((s) => s.label === "assistant.audio"), "no audio for an overloaded turn");
      // Counted by the engine that refused the turn: speech (its reply's first sentence) or, on a
      // starved machine, recognition (its transcript, under the same 1 ms budget).
      const engine = refused.error?.message.startsWith("recognition failed") ? "recognition" : "speech";
      assert.ok(
        (await metric(server, "perch_engine_refused_total", `engine="${engine}",class="conversation"`)) >= 1,
        `the ${engine} engine counted the refusal: ${refused.error?.message}`,
      );
    } finally {
      await clients.stop();
    }
    // The load is gone: both are served again.
    const served = await speech(server, KEYS.b, "Hello there.").done;
    assert.equal(served.status, 200);
    assert.ok(served.bytes > 0);
    const turnsSoFar = Math.max(...log.all.map((s) => Number(/^out-(\d+)$/.exec(s.stream)?.[1] ?? 0)));
    upstream.reply({ content: "It is sunny today." });
    await mic.say(question);
    const answered = await log.wait(
      (s) => s.type === "EOS" && s.label === "assistant.audio" && Number(s.stream.slice(4)) > turnsSoFar,
      120_000,
      "a reply's audio after the load",
    );
    assert.equal(answered.error, undefined);
    conn.close();
  });
});
