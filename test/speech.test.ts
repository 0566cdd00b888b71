import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readdirSync } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { getPriority, tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { startChild } from "../src/ai/speech/child.ts";
import { decodeAudio } from "../src/ai/speech/decode.ts";
import { ffmpegPath } from "../src/ai/speech/ffmpeg.ts";
import { FlitePool } from "../src/ai/speech/flite.ts";
import {
  AudioDecodeError,
  createSpeechEngine,
  createTranscriptionEngine,
  EngineBusyError,
  type FliteSpeechEngine,
  type MoonshineEngine,
  SPEECH_FORMATS,
  type SpeechFormat,
  UnsupportedLanguageError,
} from "../src/ai/speech/index.ts";
import { WorkQueue } from "../src/ai/speech/queue.ts";
import { initialVadState } from "../src/ai/speech/silero.ts";
import { speechChunks } from "../src/ai/speech/text.ts";
import { FileSpeech, FRAME_SECONDS, type Piece } from "../src/ai/speech/vad.ts";
import { concatFloat32 } from "../src/audio/samples.ts";
import { BACKGROUND_NICENESS, WorkerPool } from "../src/workers/pool.ts";
import { childProcesses } from "./support/processes.ts";
import { ESPEAK_VOICES, espeak, ROUND_TRIP_SENTENCES as ROUND_TRIP, silence, wavFile, wordErrorRate } from "./support/speech.ts";
import { eventually } from "./support/webrtc.ts";

const linux = process.platform === "linux";
/** The niceness a background worker runs at, beside this process's. */
const backgroundNiceness = () => Math.min(19, getPriority() + BACKGROUND_NICENESS);

const SENTENCE = "The small device reports its battery level and its temperature to the server.";

interface Collected {
  bytes: Buffer;
  chunks: number;
  firstByteMs: number;
  totalMs: number;
}

async function collect(audio: AsyncIterable<Uint8Array>): Promise<Collected> {
  const started = performance.now();
  const parts: Uint8Array[] = [];
  let firstByteMs = 0;
  for await (const part of audio) {
    if (parts.length === 0) firstByteMs = performance.now() - started;
    parts.push(part);
  }
  return { bytes: Buffer.concat(parts), chunks: parts.length, firstByteMs, totalMs: performance.now() - started };
}

/** ffmpeg run on `input` (stdin) with `args`; resolves with stdout, rejects on failure. */
async function ffmpeg(args: string[], input: Uint8Array): Promise<Buffer> {
  const child = startChild(ffmpegPath(), ["-hide_banner", "-loglevel", "error", ...args]);
  const out: Buffer[] = [];
  child.proc.stdout.on("data", (b: Buffer) => out.push(b));
  child.proc.stdin.end(input);
  const exit = await child.exited;
  if (exit.code !== 0) throw new Error(`ffmpeg ${args.join(" ")}: ${exit.stderr}`);
  return Buffer.concat(out);
}

/** Decodes encoded audio back to 16 kHz PCM: its duration in seconds and its loudness (RMS of 32767). */
async function decodeBack(bytes: Uint8Array, format: SpeechFormat): Promise<{ seconds: number; rms: number }> {
  const input = format === "pcm" ? ["-f", "s16le", "-ar", "24000", "-ac", "1"] : [];
  const pcm = await ffmpeg([...input, "-i", "pipe:0", "-ac", "1", "-ar", "16000", "-f", "s16le", "pipe:1"], bytes);
  return { seconds: pcm.length / 2 / 16000, rms: rms(pcm) };
}

function rms(pcm: Buffer): number {
  let sum = 0;
  for (let i = 0; i + 1 < pcm.length; i += 2) sum += pcm.readInt16LE(i) ** 2;
  return Math.sqrt(sum / Math.max(1, pcm.length / 2));
}

async function waitForNoChildren(prefix: string): Promise<void> {
  for (
    let i = 0;
    i < 50 &&
    childProcesses()
      .map((c) => c.name)
      .some((n) => n.startsWith(prefix));
    i++
  )
    await sleep(20);
  assert.deepEqual(
    childProcesses()
      .map((c) => c.name)
      .filter((n) => n.startsWith(prefix)),
    [],
  );
}

function isMp3(b: Buffer): boolean {
  let at = 0;
  // An ID3v2 tag: "ID3", version, flags, then a 28-bit syncsafe size.
  if (b.toString("latin1", 0, 3) === "ID3") at = 10 + ((b[6]! << 21) | (b[7]! << 14) | (b[8]! << 7) | b[9]!);
  return b[at] === 0xff && (b[at + 1]! & 0xe0) === 0xe0;
}

const MAGIC: Record<SpeechFormat, (b: Buffer) => boolean> = {
  mp3: isMp3,
  opus: (b) => b.toString("latin1", 0, 4) === "OggS" && b.toString("latin1", 28, 36) === "OpusHead",
  aac: (b) => b[0] === 0xff && (b[1]! & 0xf6) === 0xf0,
  flac: (b) => b.toString("latin1", 0, 4) === "fLaC",
  wav: (b) => b.toString("latin1", 0, 4) === "RIFF" && b.toString("latin1", 8, 12) === "WAVE",
  pcm: (b) => b.length % 2 === 0,
};

/** One engine for the whole file: its workers and their optimised code are shared. */
const engine: FliteSpeechEngine = createSpeechEngine({ concurrency: 2 });

describe("speech synthesis (flite)", () => {
  before(() => engine.warmUp());

  test("offers the six OpenAI voices", () => {
    assert.deepEqual([...engine.voices].sort(), ["alloy", "echo", "fable", "nova", "onyx", "shimmer"]);
  });

  test("the flite workers that take the Compatible API's sentences run at a lower OS priority; one is kept at the process's for conversations", {
    skip: !linux,
  }, async () => {
    const workers = await engine.workers();
    assert.deepEqual(workers.map((w) => w.lane).sort(), ["background", "background", "foreground"]);
    for (const w of workers) assert.equal(getPriority(w.osId!), w.lane === "background" ? backgroundNiceness() : getPriority(), `${w.lane} thread ${w.osId}`);
    // A conversation's sentence and an API request both still speak.
    assert.ok((await engine.speak("Hello there.", "nova")).samples.length > 0);
    assert.ok((await collect(engine.synthesize({ text: "Hello there.", voice: "alloy", format: "pcm", speed: 1 }))).bytes.length > 0);
  });

  test("every format: its container, and audio ffmpeg decodes to the right length", async () => {
    const results = await Promise.all(
      SPEECH_FORMATS.map(async (format) => ({ format, out: await collect(engine.synthesize({ text: SENTENCE, voice: "alloy", format, speed: 1 })) })),
    );
    const pcm = results.find((r) => r.format === "pcm")!.out.bytes;
    const seconds = pcm.length / 2 / 24000;
    // 13 words.
    assert.ok(seconds > 2.5 && seconds < 7, `pcm lasts ${seconds} s`);
    assert.ok(rms(pcm) > 500, "pcm is not silent");
    for (const { format, out } of results) {
      assert.ok(MAGIC[format](out.bytes), `${format} starts with ${out.bytes.subarray(0, 16).toString("hex")}`);
      const decoded = await decodeBack(out.bytes, format);
      // Lossy encoders add a frame or two of padding.
      assert.ok(Math.abs(decoded.seconds - seconds) < 0.15, `${format} decodes to ${decoded.seconds} s, pcm is ${seconds} s`);
      assert.ok(decoded.rms > 500, `${format} is audible (rms ${decoded.rms})`);
    }
  });

  test("audio is streamed as it is produced", async () => {
    // Not a timing (performance lives in the benchmark): the file arrives in many pieces, the first a small part of it.
    const sizes: number[] = [];
    for await (const chunk of engine.synthesize({ text: ROUND_TRIP.join(" "), voice: "alloy", format: "mp3", speed: 1 })) sizes.push(chunk.length);
    const total = sizes.reduce((a, b) => a + b, 0);
    assert.ok(sizes.length > 10, `${sizes.length} chunks`);
    assert.ok(sizes[0]! < total / 10, `the first chunk has ${sizes[0]} of ${total} bytes`);
  });

  test("speed scales the duration", async () => {
    const seconds = async (speed: number) => (await collect(engine.synthesize({ text: SENTENCE, voice: "echo", format: "pcm", speed }))).bytes.length / 48000;
    const [slow, normal, fast, fastest] = await Promise.all([seconds(0.5), seconds(1), seconds(2), seconds(4)]);
    assert.ok(Math.abs(slow / normal - 2) < 0.3, `0.5× lasts ${slow} s, 1× ${normal} s`);
    assert.ok(Math.abs(fast / normal - 0.5) < 0.08, `2× lasts ${fast} s, 1× ${normal} s`);
    assert.ok(fastest < fast * 0.65, `4× lasts ${fastest} s, 2× ${fast} s`);
    assert.throws(() => engine.synthesize({ text: SENTENCE, voice: "echo", format: "pcm", speed: 4.5 }), RangeError);
    assert.throws(() => engine.synthesize({ text: SENTENCE, voice: "echo", format: "pcm", speed: 0.2 }), RangeError);
  });

  test("each voice sounds different", async () => {
    const outs = await Promise.all(engine.voices.map((voice) => collect(engine.synthesize({ text: "Good morning.", voice, format: "pcm", speed: 1 }))));
    const hashes = new Set(outs.map((o) => createHash("sha256").update(o.bytes).digest("hex")));
    assert.equal(hashes.size, 6);
    for (const o of outs) assert.ok(rms(o.bytes) > 500);
    assert.throws(() => engine.synthesize({ text: "Hi.", voice: "coral", format: "mp3", speed: 1 }), RangeError);
  });

  test("text without words still makes a valid file; typography is read", async () => {
    const silent = await collect(engine.synthesize({ text: "...", voice: "alloy", format: "wav", speed: 1 }));
    assert.ok(MAGIC.wav(silent.bytes));
    assert.ok((await decodeBack(silent.bytes, "wav")).seconds > 0.05);
    const typographic = await collect(engine.synthesize({ text: "“Café” — it’s fine…", voice: "alloy", format: "pcm", speed: 1 }));
    assert.ok(rms(typographic.bytes) > 500);
  });

  test("beyond its streams the engine refuses at once; a stream frees when the listener leaves", async () => {
    const busy = createSpeechEngine({ concurrency: 1, maxStreams: 1 });
    const first = busy.synthesize({ text: SENTENCE, voice: "alloy", format: "wav", speed: 1 })[Symbol.asyncIterator]();
    assert.ok(!(await first.next()).done);
    assert.throws(() => busy.synthesize({ text: SENTENCE, voice: "alloy", format: "wav", speed: 1 }), EngineBusyError);
    await first.return?.();
    await waitForNoChildren("ffmpeg");
    const again = await collect(busy.synthesize({ text: "Hello.", voice: "alloy", format: "wav", speed: 1 }));
    assert.ok(MAGIC.wav(again.bytes));
  });

  test("abort kills the encoder", async () => {
    const controller = new AbortController();
    const text = ROUND_TRIP.join(" ").repeat(8).slice(0, 4096);
    const stream = engine.synthesize({ text, voice: "echo", format: "flac", speed: 0.5, signal: controller.signal })[Symbol.asyncIterator]();
    assert.ok(!(await stream.next()).done);
    assert.ok(
      childProcesses()
        .map((c) => c.name)
        .includes("ffmpeg"),
      "the encoder runs",
    );
    controller.abort();
    await assert.rejects(async () => {
      while (!(await stream.next()).done);
    }, /abort/i);
    await waitForNoChildren("ffmpeg");
  });

  test("a flite worker that dies mid-synthesis fails that synthesis (the real pool), and the next one is spoken", async () => {
    const flite = new FlitePool(1);
    await flite.warmUp();
    const pool = await (flite as unknown as { pool: Promise<WorkerPool<unknown, unknown>> }).pool;
    try {
      const long = flite.synthesize(ROUND_TRIP.join(" ").repeat(20), { name: "kal16" }, 1);
      await eventually(() => pool.workers().some((w) => w.busy), 30_000, "the worker busy");
      await pool
        .workers()
        .find((w) => w.busy)!
        .terminate();
      await assert.rejects(long, /exited|ended|worker/i);
      const next = await flite.synthesize("Still here.", { name: "kal16" }, 1);
      assert.ok(next.samples.length > 0);
    } finally {
      await pool.close();
    }
  });
});

describe("text chunking", () => {
  test("a short first chunk, sentences, clauses of long sentences", () => {
    const chunks = speechChunks(
      "The quick brown fox jumps over the lazy dog while the small device reports its battery level, its temperature and its location to the server every single minute. Dr. Smith agrees!",
    );
    assert.deepEqual(
      chunks.map((c) => c.text),
      [
        "The quick brown fox jumps",
        "over the lazy dog while the small device reports its battery level,",
        "its temperature and its location to the server every single minute.",
        "Dr. Smith agrees!",
      ],
    );
    assert.deepEqual(speechChunks(" ... "), []);
    assert.equal(speechChunks("I’m “fine”… thanks — café")[0]!.text, `I'm "fine"... thanks, cafe`);
  });
});

describe("a file's speech in jobs (FileSpeech)", () => {
  /** Frame probabilities: `seconds` of speech (0.9) after 0.5 s of silence, with dips of `frames` silent frames at the given seconds. */
  function speech(seconds: number, dips: Array<{ at: number; frames: number }>): { probabilities: Float32Array; duration: number } {
    const duration = seconds + 1;
    const probabilities = new Float32Array(Math.round(duration / FRAME_SECONDS));
    for (let f = Math.round(0.5 / FRAME_SECONDS); f < Math.round((0.5 + seconds) / FRAME_SECONDS); f++) probabilities[f] = 0.9;
    for (const d of dips) probabilities.fill(0.02, Math.round((0.5 + d.at) / FRAME_SECONDS), Math.round((0.5 + d.at) / FRAME_SECONDS) + d.frames);
    return { probabilities, duration };
  }
  const jobs = (s: { probabilities: Float32Array; duration: number }): readonly Piece[] => new FileSpeech(s.probabilities, s.duration).pieces;
  // Dips of 1–3 frames, as in a word's stop consonant; one pause of 5 frames (160 ms) at 7 s.
  const words = [1, 2.5, 3.1, 4, 4.6, 5.5, 8, 9.2, 11, 13.5].map((at) => ({ at, frames: 1 + (Math.round(at * 10) % 3) }));

  test("15 s of speech without a pause the tracker ends is one job, cut nowhere (not even at a short pause)", () => {
    const pieces = jobs(speech(15, [...words, { at: 7, frames: 5 }]));
    assert.equal(pieces.length, 1, JSON.stringify(pieces));
    const [one] = pieces;
    assert.ok(Math.abs(one!.start - 0.3) < 0.04 && Math.abs(one!.end - 15.7) < 0.04 && !one!.cutBefore && !one!.cutAfter, JSON.stringify(one));
  });

  test("25 s without a pause is cut past 8 s at its least speech-like frame, both sides marked as cut", () => {
    const long = jobs(speech(25, words));
    assert.equal(long.length, 2, JSON.stringify(long));
    assert.ok(long[0]!.end - long[0]!.start >= 8 && long[0]!.end - long[0]!.start <= 20, JSON.stringify(long));
    assert.deepEqual([long[0]!.cutBefore, long[0]!.cutAfter, long[1]!.cutBefore, long[1]!.cutAfter, long[1]!.start], [false, true, true, false, long[0]!.end]);
  });

  test("sentences apart are joined up to 12 s: the pieces of a file are the same whoever asks, whenever", () => {
    // Six 3 s sentences 0.5 s apart: two jobs of three sentences (10.5 s and less each).
    const duration = 22;
    const probabilities = new Float32Array(Math.round(duration / FRAME_SECONDS));
    for (let i = 0; i < 6; i++) probabilities.fill(0.9, Math.round((0.5 + i * 3.5) / FRAME_SECONDS), Math.round((3.5 + i * 3.5) / FRAME_SECONDS));
    const pieces = jobs({ probabilities, duration });
    assert.equal(pieces.length, 2, JSON.stringify(pieces));
    for (const p of pieces) assert.ok(p.end - p.start <= 12 && !p.cutBefore && !p.cutAfter, JSON.stringify(pieces));
  });
});

describe("work queue", () => {
  test("runs in order, refuses beyond its queue, drops an aborted waiter", async () => {
    const queue = new WorkQueue({ concurrency: 1, maxQueued: 2 });
    const order: number[] = [];
    let open!: () => void;
    const gate = new Promise<void>((resolve) => {
      open = resolve;
    });
    const first = queue.run(async () => {
      await gate;
      order.push(1);
    });
    const controller = new AbortController();
    const second = queue.run(async () => order.push(2), controller.signal);
    const third = queue.run(async () => order.push(3));
    await assert.rejects(
      queue.run(async () => order.push(4)),
      EngineBusyError,
    );
    controller.abort();
    await assert.rejects(second, /abort/i);
    assert.equal(queue.queued, 1);
    open();
    await Promise.all([first, third]);
    assert.deepEqual(order, [1, 3]);
    assert.equal(queue.running, 0);
  });
});

describe("worker pool (flite's, the recogniser's, the store's reads)", () => {
  const script = new URL("./support/pool-worker.ts", import.meta.url);

  test("a worker that dies mid-job fails that job only and is replaced", async () => {
    const pool = new WorkerPool<string, string>({ script, size: 1, name: "test" });
    try {
      const waiting = pool.run("after");
      const dying = pool.run("die", { priority: 0 });
      await assert.rejects(dying, /the test worker exited with code 3/);
      assert.equal(await waiting, "echo after");
      assert.equal(pool.restarts, 1);
      await assert.rejects(pool.run("throw"), /asked to fail/);
      assert.equal(await pool.run("again"), "echo again");
    } finally {
      await pool.close();
    }
  });

  test("a replacement that dies before it is ready does not fail the pool: jobs fail while none can start, and run again once one does", async () => {
    const dir = await mkdtemp(join(tmpdir(), "perch-pool-"));
    const marker = join(dir, "die-at-start");
    const pool = new WorkerPool<string, string>({ script, workerData: { dieAtStartIf: marker }, size: 1, name: "test" });
    try {
      assert.equal(await pool.run("first"), "echo first");
      // From now on a starting worker exits before it is ready (a passing trouble: out of memory, of file descriptors).
      await writeFile(marker, "");
      await assert.rejects(pool.run("die"), /the test worker exited with code 3/);
      await assert.rejects(pool.run("while none can start"), /the test worker could not start: the test worker exited with code 4/);
      // The trouble passes: a later replacement loads and the pool serves again.
      await rm(marker);
      let answer: string | undefined;
      for (let i = 0; i < 20 && answer === undefined; i++) answer = await pool.run("later").catch(() => undefined);
      assert.equal(answer, "echo later");
      assert.ok(pool.restarts >= 2);
    } finally {
      await pool.close();
      await rm(dir, { recursive: true, force: true });
    }
  });

  test("a worker that cannot load fails the pool: waiting and later jobs are refused", async () => {
    const pool = new WorkerPool<string, string>({ script, workerData: "fail-start", size: 2, name: "test" });
    try {
      await assert.rejects(pool.run("x"), /the test worker could not start: no model here/);
      await assert.rejects(pool.ready(), /could not start/);
      await assert.rejects(pool.run("y"), /could not start/);
    } finally {
      await pool.close();
    }
  });
});

const recogniser: MoonshineEngine = createTranscriptionEngine({ concurrency: 1, maxQueued: 1, fastAfterMs: false });

describe("transcription (Moonshine)", () => {
  const speech = engine;
  let phrase: Buffer;

  before(async () => {
    await recogniser.start();
    phrase = (await collect(speech.synthesize({ text: "Open the front door.", voice: "nova", format: "wav", speed: 1 }))).bytes;
  });
  after(() => recogniser.close());

  test("round trip: flite's speech comes back as the same words, in segments inside the audio", async () => {
    const text = ROUND_TRIP.slice(0, 6).join(" ");
    const audio = (await collect(speech.synthesize({ text, voice: "fable", format: "mp3", speed: 1 }))).bytes;
    const transcript = await recogniser.transcribe({ audio, language: "en" });
    const wer = wordErrorRate(text, transcript.text);
    process.stderr.write(`# round trip: WER ${wer.toFixed(3)}: ${transcript.text}\n`);
    assert.ok(wer <= 0.15, `WER ${wer}: ${transcript.text}`);
    assert.equal(transcript.language, "en");
    assert.ok(transcript.duration > 8 && transcript.duration < 20, `duration ${transcript.duration}`);
    assert.ok(transcript.segments.length >= 1, JSON.stringify(transcript.segments));
    let last = 0;
    for (const [i, s] of transcript.segments.entries()) {
      assert.equal(s.id, i);
      assert.ok(s.start >= last && s.end > s.start && s.end <= transcript.duration, JSON.stringify(s));
      last = s.end;
    }
    assert.equal(transcript.text, transcript.segments.map((s) => s.text).join(" "));
  });

  test("a conversation counts as going on from its turns, not from its voice activity", async () => {
    assert.equal(recogniser.conversing, false);
    // A connected microphone's voice activity, all the time: no turn.
    await recogniser.vadFrames(new Float32Array(512 * 20), initialVadState(), { class: "conversation" });
    assert.equal(recogniser.conversing, false);
    // A turn's final recognition.
    const asr = recogniser.createIncrementalRecogniser();
    asr.push(new Float32Array(16_000));
    await asr.finish();
    assert.equal(recogniser.conversing, true);
  });

  test("every upload container decodes to the right length; M4A is recognised", async () => {
    const seconds = (await decodeBack(phrase, "wav")).seconds;
    const dir = await mkdtemp(join(tmpdir(), "perch-containers-"));
    try {
      // One ffmpeg run writes every container the contract lists, to files: MP4 needs a seekable output.
      const outputs: Array<[string, string[]]> = [
        ["flac", ["-c:a", "flac"]],
        ["mp3", ["-c:a", "libmp3lame"]],
        ["mp4", ["-c:a", "aac"]],
        ["mpeg", ["-c:a", "mp2", "-f", "mpeg"]],
        ["mpga", ["-c:a", "libmp3lame", "-f", "mp3"]],
        ["m4a", ["-c:a", "aac"]],
        ["ogg", ["-c:a", "libvorbis"]],
        ["opus", ["-c:a", "libopus", "-f", "ogg"]],
        ["wav", ["-c:a", "pcm_s16le"]],
        ["webm", ["-c:a", "libopus"]],
      ];
      await ffmpeg(["-i", "pipe:0", ...outputs.flatMap(([ext, args]) => [...args, "-y", join(dir, `a.${ext}`)])], phrase);
      // WebAssembly decoders for what they cover; the system ffmpeg for the rest.
      const wasm = new Set(["flac", "mp3", "mpga", "ogg", "opus", "wav"]);
      for (const [ext] of outputs) {
        const decoded = await decodeAudio(await readFile(join(dir, `a.${ext}`)));
        assert.equal(decoded.decoder, wasm.has(ext) ? "wasm" : "ffmpeg", ext);
        assert.ok(Math.abs(decoded.duration - seconds) < 0.2, `${ext} decodes to ${decoded.duration} s of ${seconds} s`);
      }
      const transcript = await recogniser.transcribe({ audio: await readFile(join(dir, "a.m4a")) });
      assert.ok(wordErrorRate("open the front door", transcript.text) <= 0.25, `m4a: ${transcript.text}`);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  test("a corrupt file, a file without audio, another language", async () => {
    await assert.rejects(recogniser.transcribe({ audio: new Uint8Array(4096).map((_, i) => (i * 7919) % 251) }), AudioDecodeError);
    await assert.rejects(recogniser.transcribe({ audio: phrase.subarray(0, 44) }), AudioDecodeError);
    await assert.rejects(recogniser.transcribe({ audio: Buffer.from("not audio at all") }), AudioDecodeError);
    await assert.rejects(recogniser.transcribe({ audio: phrase, language: "fr" }), UnsupportedLanguageError);
    assert.deepEqual(recogniser.languages, ["en"]);
  });

  test("a full queue refuses; an aborted request leaves it", async () => {
    const controller = new AbortController();
    const running = recogniser.transcribe({ audio: phrase, signal: controller.signal });
    const waiting = recogniser.transcribe({ audio: phrase });
    await assert.rejects(recogniser.transcribe({ audio: phrase }), EngineBusyError);
    controller.abort();
    await assert.rejects(running, /abort/i);
    const next = await waiting;
    assert.match(next.text, /door/i);
  });

  test("voice activity: speech starts and ends inside the audio; silence and noise have none", async () => {
    const pcm = await ffmpeg(["-i", "pipe:0", "-ac", "1", "-ar", "16000", "-f", "s16le", "pipe:1"], phrase);
    const samples = new Int16Array(pcm.buffer.slice(pcm.byteOffset, pcm.byteOffset + pcm.byteLength));
    const lead = new Int16Array(16000);
    const vad = recogniser.createVad();
    const events = [];
    // 20 ms packets, as a live stream sends them: one second of silence, the phrase, one second of silence.
    const stream = new Int16Array(lead.length * 2 + samples.length);
    stream.set(samples, lead.length);
    for (let at = 0; at < stream.length; at += 320) events.push(...(await vad.push(stream.subarray(at, at + 320))));
    events.push(...vad.flush());
    assert.equal(events.length, 2, JSON.stringify(events));
    const [start, end] = events;
    assert.equal(start!.type, "start");
    assert.equal(end!.type, "end");
    const speechEnd = (lead.length + samples.length) / 16000;
    assert.ok(start!.at > 0.8 && start!.at < 1.4, JSON.stringify(events));
    assert.ok(end!.at > start!.at + 0.5 && end!.at < speechEnd + 0.2, JSON.stringify(events));

    let seed = 7;
    const noise = new Int16Array(48000).map(() => {
      seed = (seed * 1103515245 + 12345) & 0x7fffffff;
      return ((seed / 0x7fffffff) * 2 - 1) * 6000;
    });
    for (const quiet of [new Int16Array(48000), noise]) {
      const v = recogniser.createVad();
      assert.deepEqual([...(await v.push(quiet)), ...v.flush()], []);
    }
  });

  test("incremental recognition: partial text while audio arrives, the final text at the end", async () => {
    const pcm = await ffmpeg(["-i", "pipe:0", "-ac", "1", "-ar", "16000", "-f", "s16le", "pipe:1"], phrase);
    const samples = new Int16Array(pcm.buffer.slice(pcm.byteOffset, pcm.byteOffset + pcm.byteLength));
    const asr = recogniser.createIncrementalRecogniser();
    const partials: string[] = [];
    for (let at = 0; at < samples.length; at += 320) {
      asr.push(samples.subarray(at, at + 320));
      if (at % 8000 < 320) partials.push(await asr.partial());
    }
    assert.ok(partials.length >= 2);
    const final = await asr.finish();
    assert.ok(wordErrorRate("open the front door", final) <= 0.25, `final: ${final}; partials: ${partials.join(" | ")}`);
    assert.equal(asr.duration, 0);
    // A second utterance on the same recogniser starts afresh.
    asr.push(samples);
    assert.match(await asr.finish(), /door/i);
    assert.equal(await asr.finish(), "");
  });

  test("two recogniser processes recognise side by side: a file's and a conversation's", async () => {
    const pcm = await ffmpeg(["-i", "pipe:0", "-ac", "1", "-ar", "16000", "-f", "s16le", "pipe:1"], phrase);
    const spoken = Float32Array.from(new Int16Array(pcm.buffer.slice(pcm.byteOffset, pcm.byteOffset + pcm.byteLength)), (x) => x / 32768);
    const two = createTranscriptionEngine({ processes: 2, fastAfterMs: false });
    try {
      await two.start();
      assert.equal(two.pids().recogniser.length, 2);
      if (linux) {
        // One process in the foreground for conversations; the other, every thread of it (onnxruntime's too), at a lower priority.
        const workers = two.recogniserWorkers();
        assert.deepEqual(workers.map((w) => w.lane).sort(), ["background", "foreground"]);
        for (const w of workers) {
          const threads = readdirSync(`/proc/${w.osId}/task`).map(Number);
          assert.ok(threads.length > 1);
          for (const t of threads)
            assert.equal(getPriority(t), w.lane === "background" ? backgroundNiceness() : getPriority(), `${w.lane} process thread ${t}`);
        }
      }
      const both = Promise.all([two.recognise(spoken), two.recognise(spoken, { class: "conversation" })]);
      await sleep(0);
      assert.equal(two.recognitionsWaiting, 0, "neither waits for the other");
      assert.equal(two.recogniserIdle({ class: "partial" }), false);
      for (const text of await both) assert.match(text, /door/i);
      assert.equal(two.recogniserIdle({ class: "partial" }), true);
    } finally {
      await two.close();
    }
  });

  test("idle processes serve a file and give one back within a job when a turn comes; the file's words are the same alone, beside three other files and beside a conversation (pieces and threads do not follow the load)", async () => {
    const say = (text: string, voice = 0) => espeak(text, ESPEAK_VOICES[voice]!.args);
    // Pairs of sentences with a short pause between them (one stretch of speech each), 1.5 s apart.
    const said = [
      ["Please turn on the lights in the kitchen and close the curtains.", "What is the weather going to be like tomorrow afternoon?"],
      ["Call my mother tomorrow morning."],
      ["Remind me to buy milk after work.", "How far is the nearest train station?"],
      ["Open the front door."],
    ];
    const parts: Float32Array[] = [silence(0.4)];
    for (const [i, pair] of said.entries()) {
      for (const [j, sentence] of pair.entries()) parts.push(...(j > 0 ? [silence(0.18)] : []), await say(sentence, i % 2));
      parts.push(silence(1.5));
    }
    const file = concatFloat32(parts);
    const others = await Promise.all(ROUND_TRIP.slice(0, 3).map(async (text, i) => concatFloat32([silence(0.3), await say(text, i % 2), silence(0.3)])));
    const turns = await Promise.all(["Set a timer for ten minutes.", "Play some music in the living room."].map((text) => say(text)));
    const two = createTranscriptionEngine({ processes: 2, fastAfterMs: false, maxQueued: 8 });
    const turn = async (audio: Float32Array) => {
      const asr = two.createIncrementalRecogniser();
      asr.push(audio);
      return asr.finish();
    };
    try {
      await two.start();
      if (linux) {
        // Every process recognises with the same threads (onnxruntime's pools are made once, at load): as many OS threads each.
        const threads = two.recogniserWorkers().map((w) => readdirSync(`/proc/${w.osId}/task`).length);
        assert.equal(new Set(threads).size, 1, `threads of the recogniser processes: ${threads.join(", ")}`);
      }
      const transcribe = (audio: Float32Array, caller: string) => two.transcribe({ audio: wavFile(audio), caller });
      // Alone, no conversation: both processes serve the file at once.
      const pending = transcribe(file, "a");
      await eventually(() => two.recogniserWorkers().every((w) => w.busy), 20_000, "the file's jobs on both processes");
      const alone = await pending;
      assert.ok(alone.segments.length >= 4, JSON.stringify(alone.segments));
      assert.ok(wordErrorRate(said.flat().join(" "), alone.text) <= 0.25, alone.text);
      const [crowded] = await Promise.all([transcribe(file, "a"), ...others.map((o, i) => transcribe(o, `other-${i}`))]);
      // A turn while the file holds both processes: it takes the first one freed; the file goes on beside it.
      let fileDone = false;
      const interrupted = transcribe(file, "a").finally(() => {
        fileDone = true;
      });
      await eventually(() => two.recogniserWorkers().every((w) => w.busy), 20_000, "the file's jobs on both processes");
      assert.equal(two.conversing, false);
      assert.match(await turn(turns[0]!), /timer/i);
      assert.equal(fileDone, false, "the turn came before the file's last words");
      assert.equal(two.conversing, true);
      // Beside a conversation from the start: one process kept for it, the file on the other.
      const conversation = Promise.all(turns.map((t) => turn(t)));
      const besideTurns = await transcribe(file, "a");
      await conversation;
      for (const t of [crowded!, await interrupted, besideTurns]) assert.deepEqual(t.segments, alone.segments);
    } finally {
      await two.close();
    }
  });

  test("conversations' utterances waiting together are recognised in one batch, each with its own words", async () => {
    const said = ["Open the front door.", "Set a timer for ten minutes.", "Call my mother tomorrow morning."];
    const utterances = await Promise.all(
      said.map(async (text) => {
        const { samples } = await speech.speak(text, "nova");
        return Float32Array.from(samples, (x) => x / 32768);
      }),
    );
    const runs = recogniser.recognitions.runs;
    // A file's long recognition holds the one recogniser process while the three queue.
    const long = recogniser.recognise(new Float32Array(16000 * 8));
    await sleep(0);
    const texts = await Promise.all(utterances.map((u) => recogniser.recognise(u, { class: "conversation" })));
    await long;
    assert.equal(recogniser.recognitions.runs - runs, 2, "the long one, then the three in one batch");
    assert.ok(wordErrorRate(said[0]!, texts[0]!) <= 0.25, texts[0]);
    assert.ok(wordErrorRate(said[1]!, texts[1]!) <= 0.25, texts[1]);
    assert.ok(wordErrorRate(said[2]!, texts[2]!) <= 0.25, texts[2]);
  });

  test("conversations' voice activity waiting together is scored in one batch, each stream as if alone", async () => {
    const pcm = await ffmpeg(["-i", "pipe:0", "-ac", "1", "-ar", "16000", "-f", "s16le", "pipe:1"], phrase);
    const samples = new Int16Array(pcm.buffer.slice(pcm.byteOffset, pcm.byteOffset + pcm.byteLength));
    // Three streams: the phrase after 0.5, 1 and 1.5 s of silence, with a second of silence after it.
    const streams = [8000, 16000, 24000].map((lead) => {
      const stream = new Int16Array(lead + samples.length + 16000);
      stream.set(samples, lead);
      return stream;
    });
    const alone = [];
    for (const stream of streams) {
      const vad = recogniser.createVad();
      alone.push([...(await vad.push(stream)), ...vad.flush()]);
    }
    const runs = recogniser.activity.runs;
    // A file's scoring holds the one voice activity process while the three streams queue.
    const file = recogniser.vadFrames(new Float32Array(512 * 2000), initialVadState());
    await sleep(0);
    const together = await Promise.all(
      streams.map(async (stream) => {
        const vad = recogniser.createVad();
        return [...(await vad.push(stream)), ...vad.flush()];
      }),
    );
    await file;
    assert.equal(recogniser.activity.runs - runs, 2, "the file, then the three streams in one batch");
    assert.deepEqual(together, alone);
    for (const events of together)
      assert.deepEqual(
        events.map((e) => e.type),
        ["start", "end"],
      );
  });

  test("incremental recognition while the recogniser is busy: nothing speculative queues, the final text still comes", async () => {
    const pcm = await ffmpeg(["-i", "pipe:0", "-ac", "1", "-ar", "16000", "-f", "s16le", "pipe:1"], phrase);
    const samples = new Int16Array(pcm.buffer.slice(pcm.byteOffset, pcm.byteOffset + pcm.byteLength));
    // Other callers' long recognitions hold the one recogniser process: one runs, two wait.
    const spoken = Float32Array.from(samples, (x) => x / 32768);
    const long = new Float32Array(16000 * 19);
    for (let at = 0; at + spoken.length <= long.length; at += spoken.length + 8000) long.set(spoken, at);
    const busy = Promise.all([0, 1, 2].map(() => recogniser.recognise(long)));
    await sleep(0);
    assert.equal(recogniser.recogniserIdle({ class: "partial" }), false, "the long recognitions are running");
    const waiting = recogniser.recognitionsWaiting;
    assert.equal(waiting, 2);
    const asr = recogniser.createIncrementalRecogniser();
    // The phrase and then half a second of silence: idle, this would start a speculative recognition.
    for (let at = 0; at < samples.length; at += 320) asr.push(samples.subarray(at, at + 320));
    for (let i = 0; i < 25; i++) asr.push(new Int16Array(320));
    assert.equal(await asr.partial(), "", "no partial recognition while busy");
    assert.equal(recogniser.recognitionsWaiting, waiting, "nothing queued behind the busy recogniser");
    const final = asr.finish();
    await sleep(0);
    assert.equal(recogniser.recognitionsWaiting, waiting + 1, "the final recognition waits its turn");
    assert.match(await final, /door/i);
    await busy;
    assert.equal(recogniser.recogniserIdle({ class: "partial" }), true);
  });

  test("a conversation's turn that base would give late is recognised by Moonshine tiny, with its words; files stay on base", async () => {
    // Any wait at all is too long here: every conversation batch is late by the measured time of a job.
    const degrading = createTranscriptionEngine({ fastAfterMs: 1 });
    try {
      const { samples } = await speech.speak("I would like a cup of coffee.", "nova");
      const utterance = Float32Array.from(samples, (x) => x / 32768);
      assert.match(await degrading.recognise(utterance, { class: "conversation" }), /cup of coffee/i);
      assert.deepEqual(degrading.batchesByModel, { base: 0, tiny: 1 });
      assert.equal(degrading.recognitions.stats().conversation.degraded, 1);
      assert.match(await degrading.recognise(utterance), /cup of coffee/i);
      assert.deepEqual(degrading.batchesByModel, { base: 1, tiny: 1 }, "a file's job is never degraded");
      // Base only: tiny is not even loaded.
      assert.match(await recogniser.recognise(utterance, { class: "conversation" }), /cup of coffee/i);
      assert.equal(recogniser.batchesByModel.tiny, 0);
    } finally {
      await degrading.close();
    }
  });
});
