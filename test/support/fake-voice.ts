/**
 * The fast layer of voice tests: a conversation in process, on a fake clock, with fake engines
 * (a detector that hears loudness, a transcription and a synthesiser that do what the test says),
 * a fake model, and a fake connection that records frames and events. Nothing sleeps: the clock
 * moves only when the test moves it, and between timers the test lets promises settle.
 */
import { fromBinary } from "@bufbuild/protobuf";
import pino from "pino";
import { Registry } from "prom-client";
import { loadResampler } from "../../src/audio/resampler.ts";
import { VoiceConfig as VoiceConfigSchema } from "../../src/config/config.ts";
import type { Traced, Tracing } from "../../src/observability/tracing.ts";
import type { ChatMessage } from "../../src/protocol/compat.ts";
import { PeerEventSchema } from "../../src/protocol/gen/event_pb.ts";
import type { AgentChoice } from "../../src/voice/activity.ts";
import type { AudioThreads } from "../../src/voice/audio-threads.ts";
import type { VoiceClock } from "../../src/voice/clock.ts";
import { Conversation } from "../../src/voice/conversation.ts";
import type {
  SpeechChunk,
  SpeechPort,
  SynthesisRequest,
  TranscriptionPort,
  TurnTranscription,
  TurnTranscriptionOptions,
  VadEvent,
  VoiceActivityPort,
} from "../../src/voice/engine-ports.ts";
import { VoiceMetrics } from "../../src/voice/metrics.ts";
import { FRAME_SAMPLES, OpusCodec } from "../../src/voice/opus.ts";
import { encodeVoiceEvent } from "../../src/voice/peer-events.ts";
import { observeTranscript, type TranscriptEntry } from "../../src/voice/transcript.ts";
import { LOOKBACK_MS, QUIET_DBOV } from "../../src/voice/uplink.ts";
import type { TurnUsage } from "../../src/voice/usage.ts";
import { rtpPacket } from "./rtp-device.ts";
import { type Seen, seen } from "./voice.ts";

/** Lets every promise that can settle settle (a few turns of the event loop; no time passes). */
export async function settle(): Promise<void> {
  for (let i = 0; i < 8; i++) await new Promise((r) => setImmediate(r));
}

/** A clock that moves only in `advance`, running the timers due on the way in order. */
export class FakeClock implements VoiceClock {
  private t = 0;
  private seq = 0;
  private timers: Array<{ at: number; seq: number; fn: () => void; every?: number }> = [];

  now(): number {
    return this.t;
  }

  after(ms: number, fn: () => void): () => void {
    const timer = { at: this.t + Math.max(0, ms), seq: this.seq++, fn };
    this.timers.push(timer);
    return () => {
      this.timers = this.timers.filter((t) => t !== timer);
    };
  }

  every(ms: number, fn: () => void): () => void {
    const timer = { at: this.t + ms, seq: this.seq++, fn, every: ms };
    this.timers.push(timer);
    return () => {
      this.timers = this.timers.filter((t) => t !== timer);
    };
  }

  /** Moves the clock on by `ms`, running each timer when its time comes and settling promises after it. */
  async advance(ms: number): Promise<void> {
    const end = this.t + ms;
    await settle();
    for (;;) {
      const due = this.timers.filter((t) => t.at <= end).sort((a, b) => a.at - b.at || a.seq - b.seq)[0];
      if (!due) break;
      this.t = Math.max(this.t, due.at);
      if (due.every) {
        due.at += due.every;
        due.seq = this.seq++;
      } else this.timers = this.timers.filter((t) => t !== due);
      due.fn();
      await settle();
    }
    this.t = end;
    await settle();
  }
}

const BLOCK = 320;
const LOUD = 8000;

/** A detector that hears loudness: 20 ms blocks above a level are speech (the turn rules of voice.md §2). */
export const loudnessVad: VoiceActivityPort = {
  create({ minSpeechMs, minSilenceMs, onsets }) {
    let block = 0;
    let rest = new Int16Array(0);
    let speechStart: number | undefined;
    let silenceStart: number | undefined;
    let confirmed = false;
    const seconds = (b: number) => (b * BLOCK) / 16_000;
    return {
      async push(pcm) {
        const audio = new Int16Array(rest.length + pcm.length);
        audio.set(rest);
        audio.set(pcm, rest.length);
        const events: VadEvent[] = [];
        let at = 0;
        for (; at + BLOCK <= audio.length; at += BLOCK, block++) {
          let peak = 0;
          for (let i = at; i < at + BLOCK; i++) peak = Math.max(peak, Math.abs(audio[i]!));
          const loud = peak > LOUD / 2;
          if (speechStart === undefined) {
            if (loud) {
              speechStart = block;
              if (onsets) events.push({ type: "onset", at: seconds(block) });
            }
            continue;
          }
          if (loud) silenceStart = undefined;
          else silenceStart ??= block;
          if (!confirmed && silenceStart === undefined && seconds(block + 1 - speechStart) * 1000 >= minSpeechMs) {
            confirmed = true;
            events.push({ type: "start", at: seconds(speechStart) });
          }
          if (silenceStart !== undefined && (seconds(block + 1 - silenceStart) * 1000 >= minSilenceMs || !confirmed)) {
            if (confirmed) events.push({ type: "end", start: seconds(speechStart), at: seconds(silenceStart) });
            else if (onsets) events.push({ type: "noise", at: seconds(silenceStart) });
            speechStart = undefined;
            silenceStart = undefined;
            confirmed = false;
          }
        }
        rest = audio.slice(at);
        return events;
      },
      flush() {
        const events: VadEvent[] =
          confirmed && speechStart !== undefined
            ? [{ type: "end", start: seconds(speechStart), at: seconds(silenceStart ?? block) }]
            : onsets && speechStart !== undefined
              ? [{ type: "noise", at: seconds(block) }]
              : [];
        speechStart = undefined;
        silenceStart = undefined;
        confirmed = false;
        return events;
      },
    };
  },
};

/** One turn as the fake transcription saw it. */
export class FakeTurnTranscription implements TurnTranscription {
  samples = 0;
  pauses = 0;
  /** `soFar()` calls. */
  asked = 0;
  finished = false;
  readonly o: TurnTranscriptionOptions;
  private readonly answer: (turn: FakeTurnTranscription) => Promise<string> | string;
  private readonly words: (turn: FakeTurnTranscription) => Promise<string> | string;
  private readonly sure: (turn: FakeTurnTranscription) => boolean;
  /** `soFar({ sure: true })` calls. */
  askedSure = 0;
  /** Set by a test: the sound is over (a `sure` function may judge the whole differently from its parts). */
  finishing = false;

  constructor(o: TurnTranscriptionOptions, answer: FakeTranscription["answer"], words: FakeTranscription["answer"], sure: FakeTranscription["sure"]) {
    this.o = o;
    this.answer = answer;
    this.words = words;
    this.sure = sure;
  }

  /** Samples of loud audio (speech) heard. */
  loud = 0;
  /** The turn's audio, as pushed. */
  readonly audio: Int16Array[] = [];

  push(pcm: Int16Array): void {
    this.samples += pcm.length;
    this.audio.push(pcm);
    for (let at = 0; at + BLOCK <= pcm.length; at += BLOCK) if (Math.abs(pcm[at]!) > LOUD / 2) this.loud += BLOCK;
  }

  pause(): void {
    this.pauses++;
  }

  /** The words so far: the transcription's `words` (default its final answer); with `sure`, "" unless the transcription's `sure` says so. */
  async soFar(o: { sure?: boolean } = {}): Promise<string> {
    this.asked++;
    if (o.sure) this.askedSure++;
    const text = await this.race(this.words(this));
    return o.sure && !this.sure(this) ? "" : text;
  }

  async finish(): Promise<string> {
    this.finished = true;
    return await this.race(this.answer(this));
  }

  private async race(answer: Promise<string> | string): Promise<string> {
    const { signal } = this.o;
    const text = await Promise.race([
      Promise.resolve(answer),
      new Promise<never>((_, reject) => {
        if (signal.aborted) reject(signal.reason);
        signal.addEventListener("abort", () => reject(signal.reason), { once: true });
      }),
    ]);
    return text.trim();
  }
}

/** A transcription that answers what the test says (default: one question per turn). */
export class FakeTranscription implements TranscriptionPort {
  readonly engine = "fake-stt";
  readonly languages = ["en"];
  readonly streamsPartials = false;
  readonly turns: FakeTurnTranscription[] = [];
  answer: (turn: FakeTurnTranscription) => Promise<string> | string = () => "What time is it?";
  /** The words so far at a pause or during speech (default the final answer). */
  words: ((turn: FakeTurnTranscription) => Promise<string> | string) | undefined;
  /** Whether the words so far are sure (`soFar({ sure: true })`; default yes). */
  sure: (turn: FakeTurnTranscription) => boolean = () => true;
  /** Thrown by `open` (an engine that cannot take a turn). */
  refuse: Error | undefined;

  open(o: TurnTranscriptionOptions): TurnTranscription {
    if (this.refuse) throw this.refuse;
    const t = new FakeTurnTranscription(
      o,
      (turn) => this.answer(turn),
      (turn) => (this.words ?? this.answer)(turn),
      (turn) => this.sure(turn),
    );
    this.turns.push(t);
    return t;
  }
}

/** A synthesiser that speaks `msPerChar` of audio per character, in `chunkMs` pieces, as it is pulled. */
export class FakeSpeech implements SpeechPort {
  readonly engine = "fake-tts";
  readonly requests: Array<{ text: string; voice: string; signal: AbortSignal; pulled: number }> = [];
  sampleRate = 24_000;
  msPerChar = 60;
  chunkMs = 100;
  /** Seconds of audio handed out so far (all sentences). */
  pulledSeconds = 0;
  fail: ((text: string) => Error | undefined) | undefined;
  /** Conversation time before a sentence's first audio. */
  delayMs = 0;
  clock: VoiceClock | undefined;

  async *synthesize(r: SynthesisRequest): AsyncGenerator<SpeechChunk> {
    const request = { text: r.text, voice: r.voice, signal: r.signal, pulled: 0 };
    this.requests.push(request);
    const failure = this.fail?.(r.text);
    if (failure) throw failure;
    const { clock, delayMs } = this;
    if (delayMs > 0 && clock) await new Promise<void>((resolve) => clock.after(delayMs, resolve));
    const total = Math.round((r.text.length * this.msPerChar * this.sampleRate) / 1000);
    const step = Math.round((this.chunkMs * this.sampleRate) / 1000);
    for (let at = 0; at < total; at += step) {
      r.signal.throwIfAborted();
      const n = Math.min(step, total - at);
      const pcm = new Int16Array(n).fill(3000);
      request.pulled += n;
      this.pulledSeconds += n / this.sampleRate;
      yield { pcm, sampleRate: this.sampleRate };
    }
  }
}

/** A model the test scripts: each call answers with the next script (text pieces), and is recorded. */
export class FakeModel {
  readonly calls: Array<{
    agentId: string;
    messages: ChatMessage[];
    signal: AbortSignal;
    pieces: number;
    /** The conversation's clock when the call was made. */
    at: number;
    /** Given to a call made in a pause (a preemptive reply): awaited before a tool may run. */
    release: (() => Promise<void>) | undefined;
    /** The span the call's spans go under, when the conversation traces. */
    trace: Traced | undefined;
  }> = [];
  script: (call: FakeModel["calls"][number]) => AsyncIterable<string> = () => pieces(["It is ten o'clock. ", "Anything else?"]);
  now: () => number = () => 0;

  run = async (
    agentId: string,
    messages: ChatMessage[],
    signal: AbortSignal,
    _n: number,
    release?: () => Promise<void>,
    trace?: Traced,
  ): Promise<AsyncIterable<string>> => {
    const call = { agentId, messages, signal, pieces: 0, at: this.now(), release, trace };
    this.calls.push(call);
    const source = this.script(call);
    return (async function* () {
      for await (const p of source) {
        signal.throwIfAborted();
        call.pieces++;
        yield p;
      }
    })();
  };
}

export async function* pieces(list: Iterable<string>): AsyncGenerator<string> {
  for (const p of list) yield p;
}

export interface Rig {
  clock: FakeClock;
  conversation: Conversation;
  stt: FakeTranscription;
  tts: FakeSpeech;
  model: FakeModel;
  events: Seen[];
  /** The transcript entries read from the events, as Side Control gets them (src/voice/transcript.ts). */
  observed: TranscriptEntry[];
  /** Opus frames sent to the device. */
  frames: number;
  metrics: Registry;
  /** `ms` of audio from the device (loud or silent), 20 ms at a time, on the clock. */
  talk(ms: number, loud?: boolean): Promise<void>;
  /** One packet from the device's audio track (RTP), as the transport hands it on. */
  packet(bytes: Buffer): void;
  /** Samples the voice activity detector was given. */
  vadSamples: number;
  /** Moves the clock without audio from the device (it sends nothing). */
  wait(ms: number): Promise<void>;
  /** The events of one stream id. */
  of(stream: string): Seen[];
  turnMetrics(n: number): Record<string, unknown> | undefined;
  close(): void;
}

/** A conversation with fake engines on a fake clock (voice config as in configuration; defaults otherwise). */
export async function rig(
  voice: Record<string, unknown> = {},
  o: { threads?: AudioThreads; usage?: TurnUsage; limited?: () => boolean; tracing?: Tracing } = {},
): Promise<Rig> {
  const clock = new FakeClock();
  const stt = new FakeTranscription();
  const tts = new FakeSpeech();
  const model = new FakeModel();
  model.now = () => clock.now();
  tts.clock = clock;
  const events: Seen[] = [];
  const observed: TranscriptEntry[] = [];
  const metrics = new Registry();
  const { language: _language, ...rest } = voice;
  const config = VoiceConfigSchema.parse({ agent: "talker", ...rest });
  let sequence = 0n;
  const agent: AgentChoice = {
    id: "talker",
    voice: "alloy",
    engines: { transcription: stt, speech: tts },
    ...(typeof voice.language === "string" ? { language: voice.language } : {}),
  };
  const r: Rig = {
    clock,
    stt,
    tts,
    model,
    events,
    observed,
    frames: 0,
    metrics,
    conversation: undefined as unknown as Conversation,
    packet: (bytes) => {
      for (const cb of packetListeners) cb(bytes);
    },
    vadSamples: 0,
    async talk(ms, loud = true) {
      for (let t = 0; t < ms; t += 20) {
        r.conversation.hear(new Int16Array(320).fill(loud ? LOUD : 0));
        await clock.advance(20);
      }
    },
    wait: (ms) => clock.advance(ms),
    of: (stream) => events.filter((e) => e.stream === stream),
    turnMetrics(n) {
      const e = events.find((s) => s.stream === `out-${n}` && s.label === "turn.metrics");
      return e ? (JSON.parse(e.text!) as Record<string, unknown>) : undefined;
    },
    close: () => {
      r.conversation.close();
      transcript.close();
    },
  };
  const packetListeners = new Set<(bytes: Buffer) => void>();
  const transcript = observeTranscript(
    {
      publicKey: "fake-device",
      payloadType: 111,
      audioLevelId: 1,
      onPacket: (cb) => {
        packetListeners.add(cb);
        return () => packetListeners.delete(cb);
      },
      sendFrame: () => {
        r.frames++;
        return true;
      },
      sendEvent: (event) => {
        const s = seen(fromBinary(PeerEventSchema, encodeVoiceEvent(event, ++sequence, BigInt(clock.now()))));
        if (s) events.push(s);
        return true;
      },
    },
    (e) => observed.push(e),
  );
  r.conversation = new Conversation({
    port: transcript.port,
    config,
    activity: {
      create: (o) => {
        const vad = loudnessVad.create(o);
        return {
          push: (pcm) => {
            r.vadSamples += pcm.length;
            return vad.push(pcm);
          },
          flush: () => vad.flush(),
        };
      },
    },
    resampler: await loadResampler(),
    metrics: new VoiceMetrics(metrics, () => 1),
    logger: pino({ level: "silent" }),
    agent: () => agent,
    run: model.run,
    clock,
    threads: o.threads,
    ...(o.usage ? { usage: o.usage } : {}),
    ...(o.limited ? { limited: o.limited } : {}),
    ...(o.tracing ? { tracing: { tracing: o.tracing, conversation: "conversation-1" } } : {}),
  });
  return r;
}

/** 20 ms Opus packets of a loud tone (a "word"), or of digital silence. */
export function encoded(frames: number, loud: boolean): Buffer[] {
  const encoder = new OpusCodec();
  try {
    return Array.from({ length: frames }, (_, f) => {
      const pcm = new Int16Array(FRAME_SAMPLES);
      if (loud) for (let i = 0; i < pcm.length; i++) pcm[i] = Math.round(Math.sin((2 * Math.PI * 300 * (f * FRAME_SAMPLES + i)) / 48_000) * 10_000);
      return encoder.encode(pcm);
    });
  } finally {
    encoder.close();
  }
}

/** The packet with the audio level (RFC 6464) in a one-byte header extension of id 1 (the rig's negotiated id). */
export function withLevel(packet: Buffer, level: number): Buffer {
  const ext = Buffer.from([0xbe, 0xde, 0, 1, 0x10, level & 0x7f, 0, 0]);
  const out = Buffer.concat([packet.subarray(0, 12), ext, packet.subarray(12)]);
  out[0] = out[0]! | 0x10;
  return out;
}

/**
 * A device's packets on the rig's clock: one every 20 ms (or `ms`), each moving the clock on. With
 * `echo`, each packet's audio is awaited (real time) before the clock moves: an uplink on an audio
 * thread answers in real time, and the conversation's clock must not run ahead of what it heard.
 */
export class RtpSender {
  private seq = 7;
  private ts = 1000;
  private readonly r: Rig;
  private readonly echo: boolean;
  /** The conversation's samples heard before the first packet, and the samples of the packets sent since (16 kHz). */
  private base: number | undefined;
  private sent = 0;
  constructor(r: Rig, o: { echo?: boolean } = {}) {
    this.r = r;
    this.echo = o.echo ?? false;
  }
  /** `wait: false`: this packet's audio is not awaited (an uplink whose thread is stuck). */
  async send(payload: Buffer, o: { level?: number; ms?: number; wait?: boolean } = {}): Promise<void> {
    const packet = rtpPacket({ sequence: this.seq++, timestamp: this.ts }, payload);
    this.base ??= this.r.conversation.heardSamples;
    this.r.packet(o.level === undefined ? packet : withLevel(packet, o.level));
    const ms = o.ms ?? 20;
    this.sent += (ms * 16_000) / 1000;
    if (this.echo && o.wait !== false) {
      // The uplink holds back up to LOOKBACK_MS of quiet packets (in case speech follows): their audio comes later.
      const quiet = payload.length <= 2 || (o.level !== undefined && o.level >= QUIET_DBOV);
      const expected = this.base + this.sent - (quiet ? (LOOKBACK_MS * 16_000) / 1000 : 0);
      const until = Date.now() + 5_000;
      while (this.r.conversation.heardSamples < expected) {
        if (Date.now() > until) throw new Error("a packet's audio was not heard within 5 s");
        await new Promise((r) => setTimeout(r, 1));
      }
    }
    this.ts += (ms * 48_000) / 1000;
    await this.r.clock.advance(ms);
  }
}
