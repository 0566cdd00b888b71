import { createServer, type IncomingMessage, type Server } from "node:http";
import type { Duplex } from "node:stream";
import type { SpeexModule } from "@echogarden/speex-resampler-wasm";
import { type WebSocket, WebSocketServer } from "ws";
import type { ToolKit } from "../../src/ai/agents/toolbox.ts";
import type { VoiceConfig } from "../../src/config/config.ts";
import type { VoiceClock } from "../../src/voice/clock.ts";
import type { RealtimeKind } from "../../src/voice/conversation.ts";
import type { VoiceMetrics } from "../../src/voice/metrics.ts";
import { VoiceEvents } from "../../src/voice/peer-events.ts";
import type { AudioPort } from "../../src/voice/port.ts";
import { RealtimeActivity } from "../../src/voice/realtime/activity.ts";
import type { RealtimeAgentInfo } from "../../src/voice/realtime/agents.ts";

/**
 * A fake realtime model: a real WebSocket server on 127.0.0.1 speaking the OpenAI Realtime API's GA
 * events from a script (voice.md §6). It hears the appended audio with an energy detector of its
 * own (server VAD), answers each turn with the next scripted reply (audio deltas faster than real
 * time, transcripts, a function call), handles cancel, truncate and delete as the API does, and
 * can refuse the upgrade, drop the socket, answer `error`, stay silent, or end a session for its age.
 */

export const RATE = 24_000;

/**
 * Realtime agent `id`'s part of a conversation on the fake at `fakeUrl`, as the conversation opens
 * it (`RealtimeKind.open`), for the fast layer: no tools and no input transcription (the path under
 * test is the audio), the conversation's own port, clock, resampler and metrics.
 */
export function fakeRealtimePart(
  fakeUrl: string,
  id: string,
  o: { config: VoiceConfig; port: AudioPort; resampler: SpeexModule; metrics: VoiceMetrics; clock: VoiceClock },
  out: Parameters<RealtimeKind["open"]>[1],
): RealtimeActivity {
  return new RealtimeActivity({
    agent: realtimeAgent(`${fakeUrl.replace(/^http/, "ws")}/realtime?model=m`, { id, transcription: false }),
    config: o.config,
    events: new VoiceEvents(o.port),
    tools: { definitions: () => [], displayName: (n: string) => n } as unknown as ToolKit,
    toolEvents: () => ({}) as never,
    activity: undefined,
    resampler: o.resampler,
    encoder: out.encoder,
    metrics: o.metrics,
    clock: o.clock,
    send: out.send,
    log: () => {},
  });
}

/** The agent `talker` on the realtime model at `url` (a `ws:` URL of the fake or an attacker), as the tests and benches build a realtime session for it. */
export function realtimeAgent(url: string, o: Partial<RealtimeAgentInfo> = {}): RealtimeAgentInfo {
  return {
    id: "talker",
    instructions: "Be brief.",
    voice: "marin",
    turnDetection: "server_vad",
    transcription: "gpt-4o-mini-transcribe",
    toolTimeoutMs: 10_000,
    maxSteps: 4,
    provider: "rt",
    url,
    apiKey: undefined,
    timeoutMs: 10_000,
    ...o,
  };
}
const FRAME = RATE / 50;

export type Script =
  /**
   * Speaks `pcm` (24 kHz; default a tone of `ms`) with `text` as its transcript, in deltas of `chunkMs`, `speed` times real time (0: at once).
   * `held`: the response stays in progress after its audio until it is cancelled (a model still generating), however late that comes.
   */
  | {
      kind: "reply";
      text: string;
      pcm?: Int16Array;
      ms?: number;
      chunkMs?: number;
      speed?: number;
      dropAfterDeltas?: number;
      audioDelayMs?: number;
      held?: boolean;
    }
  /** Calls a function; once its output and a `response.create` come, `after` answers. */
  | { kind: "call"; name: string; arguments: string; after: Script }
  | { kind: "error"; code: string; message: string }
  /** Never starts a response. */
  | { kind: "silent" }
  /** `deltas` audio deltas of `deltaBytes` each, as fast as the socket takes them; a cancel is ignored. */
  | { kind: "flood"; deltas: number; deltaBytes: number; text: string };

export interface ClientEvent {
  type: string;
  [k: string]: unknown;
}

export interface FakeSession {
  headers: IncomingMessage["headers"];
  url: string;
  events: ClientEvent[];
  /** The last `session.update`'s session. */
  session: Record<string, unknown> | undefined;
  /** Audio appended (24 kHz samples) and when each append arrived (ms). */
  appended: number;
  appends: Array<{ at: number; samples: number }>;
  socket: WebSocket;
  closed: boolean;
}

export interface Turn {
  /** The speech as the fake's detector heard it, in ms of appended audio (24 kHz samples counted). */
  audioStartMs?: number;
  audioEndMs?: number;
  /** When the fake decided the user's speech started and stopped (performance.now()). */
  startedAt?: number;
  stoppedAt: number;
  firstDeltaAt?: number;
}

export interface FakeRealtime {
  /** The provider's `base_url` (`http://127.0.0.1:<port>/v1`). */
  url: string;
  sessions: FakeSession[];
  turns: Turn[];
  /** When its detector heard speech start (performance.now()), each time. */
  started: number[];
  /** Audio deltas a flood has sent so far. */
  flooded: number;
  /** The next upgrades are refused with this status (and an OpenAI error body). */
  refuse(status: number, message: string, times?: number): void;
  /** Scripts the next replies, in order; without one, `fallback` answers. */
  script(...s: Script[]): void;
  fallback: Script;
  /** The user's transcript the fake reports for each turn. */
  transcript: string;
  /** A session is ended for its age this long after it opened (with `session_expired`). */
  maxAgeMs: number | undefined;
  /** The next `session.update`s are rejected. */
  rejectUpdates: number;
  /** Every client event of every session, in order. */
  all(type: string): ClientEvent[];
  /** Resolves once `pred` holds (checked on every client event and every 10 ms). */
  until(pred: () => boolean, ms?: number, what?: string): Promise<void>;
  close(): Promise<void>;
}

/**
 * `stamp`: each reply's transcript begins with `t=<Date.now() when the user's speech stopped>`, so
 * that a device on the same machine can time the model's speech_stopped → the reply heard.
 */
export async function startFakeRealtime(
  o: { speechMs?: number; silenceMs?: number; level?: number; stamp?: boolean; port?: number } = {},
): Promise<FakeRealtime> {
  const speechFrames = Math.ceil((o.speechMs ?? 80) / 20);
  const silenceFrames = Math.ceil((o.silenceMs ?? 300) / 20);
  const level = o.level ?? 400;
  const wss = new WebSocketServer({ noServer: true, perMessageDeflate: false });
  const http: Server = createServer((_req, res) => {
    res.writeHead(404).end();
  });
  const refusals: Array<{ status: number; message: string }> = [];
  const scripts: Script[] = [];
  const waiters = new Set<() => void>();
  const notify = () => {
    for (const w of [...waiters]) w();
  };
  let ids = 0;
  const id = (p: string) => `${p}_${++ids}`;
  const fake: FakeRealtime = {
    url: "",
    sessions: [],
    turns: [],
    started: [],
    flooded: 0,
    refuse(status, message, times = 1) {
      for (let i = 0; i < times; i++) refusals.push({ status, message });
    },
    script(...s) {
      scripts.push(...s);
    },
    fallback: { kind: "reply", text: "Hello from the fake.", ms: 1_000 },
    transcript: "Hello there.",
    maxAgeMs: undefined,
    rejectUpdates: 0,
    all: (type) => fake.sessions.flatMap((s) => s.events.filter((e) => e.type === type)),
    until(pred, ms = 30_000, what = "the fake's condition") {
      if (pred()) return Promise.resolve();
      return new Promise((resolve, reject) => {
        const check = () => {
          if (!pred()) return;
          clearTimeout(timer);
          clearInterval(poll);
          waiters.delete(check);
          resolve();
        };
        const timer = setTimeout(() => {
          clearInterval(poll);
          waiters.delete(check);
          reject(new Error(`timed out waiting for ${what}`));
        }, ms);
        const poll = setInterval(check, 10);
        waiters.add(check);
      });
    },
    async close() {
      for (const s of fake.sessions) s.socket.terminate();
      wss.close();
      http.closeAllConnections();
      await new Promise<void>((resolve) => http.close(() => resolve()));
    },
  };

  http.on("upgrade", (req, socket: Duplex, head) => {
    const refusal = refusals.shift();
    if (refusal) {
      const body = JSON.stringify({ error: { message: refusal.message, type: "invalid_request_error", code: null, param: null } });
      socket.end(
        `HTTP/1.1 ${refusal.status} Refused\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
      );
      return;
    }
    if (!req.url?.startsWith("/v1/realtime")) {
      socket.destroy();
      return;
    }
    wss.handleUpgrade(req, socket, head, (ws) => session(ws, req));
  });

  function session(ws: WebSocket, req: IncomingMessage): void {
    const s: FakeSession = { headers: req.headers, url: req.url ?? "", events: [], session: undefined, appended: 0, appends: [], socket: ws, closed: false };
    fake.sessions.push(s);
    const send = (e: Record<string, unknown>) => {
      if (ws.readyState === ws.OPEN) ws.send(JSON.stringify({ event_id: id("event"), ...e }));
    };
    const age = fake.maxAgeMs !== undefined ? setTimeout(() => expire(), fake.maxAgeMs) : undefined;
    const expire = () => {
      send({
        type: "error",
        error: { type: "invalid_request_error", code: "session_expired", message: "Your session hit the maximum duration of 60 minutes." },
      });
      ws.close(1000, "session expired");
    };
    // The energy detector's state.
    let carry = new Int16Array(0);
    let voiced = 0;
    let quiet = 0;
    let speaking = false;
    let inputItem = id("item");
    let audioMs = 0;
    let speechStartMs = 0;
    // The response going on.
    let active: { id: string; item: string; cancelled: boolean; sentMs: number } | undefined;
    let pendingCall: Extract<Script, { kind: "call" }> | undefined;
    const itemMs = new Map<string, number>();
    send({
      type: "session.created",
      session: { type: "realtime", id: id("sess"), ...(fake.maxAgeMs !== undefined ? { expires_at: (Date.now() + fake.maxAgeMs) / 1000 } : {}) },
    });
    const serverVad = () => {
      const td = (s.session?.audio as { input?: { turn_detection?: unknown } } | undefined)?.input?.turn_detection;
      return td !== null;
    };
    const interrupts = () => {
      const td = (s.session?.audio as { input?: { turn_detection?: { interrupt_response?: boolean } | null } } | undefined)?.input?.turn_detection;
      return td?.interrupt_response !== false;
    };

    const hearFrame = (frame: Int16Array) => {
      audioMs += 20;
      let sum = 0;
      for (const x of frame) sum += x * x;
      const loud = Math.sqrt(sum / frame.length) > level;
      if (!serverVad()) return;
      if (loud) {
        voiced++;
        quiet = 0;
      } else {
        quiet++;
        if (!speaking) voiced = 0;
      }
      if (!speaking && voiced >= speechFrames) {
        speaking = true;
        fake.started.push(performance.now());
        speechStartMs = audioMs - speechFrames * 20;
        send({ type: "input_audio_buffer.speech_started", audio_start_ms: audioMs - speechFrames * 20, item_id: inputItem });
        if (active && !active.cancelled && interrupts()) {
          active.cancelled = true;
          send({ type: "response.done", response: { id: active.id, status: "cancelled", status_details: { type: "cancelled", reason: "turn_detected" } } });
          active = undefined;
        }
      } else if (speaking && quiet >= silenceFrames) {
        speaking = false;
        voiced = 0;
        const item = inputItem;
        inputItem = id("item");
        fake.turns.push({ stoppedAt: performance.now(), audioStartMs: speechStartMs, audioEndMs: audioMs - silenceFrames * 20 });
        send({ type: "input_audio_buffer.speech_stopped", audio_end_ms: audioMs - silenceFrames * 20, item_id: item });
        send({ type: "input_audio_buffer.committed", item_id: item, previous_item_id: null });
        transcribe(item);
        respond(stamped(next()));
      }
    };
    const stamped = (script: Script): Script => (o.stamp && script.kind === "reply" ? { ...script, text: `t=${Date.now()} ${script.text}` } : script);
    const transcribe = (item: string) => {
      const transcription = (s.session?.audio as { input?: { transcription?: unknown } } | undefined)?.input?.transcription;
      if (!transcription) return;
      const words = fake.transcript.split(" ");
      setTimeout(() => {
        for (const w of words) send({ type: "conversation.item.input_audio_transcription.delta", item_id: item, content_index: 0, delta: `${w} ` });
        send({ type: "conversation.item.input_audio_transcription.completed", item_id: item, content_index: 0, transcript: fake.transcript });
      }, 5);
    };
    const next = (): Script => scripts.shift() ?? fake.fallback;

    const respond = (script: Script) => {
      if (script.kind === "silent") return;
      if (script.kind === "error") {
        send({ type: "error", error: { type: "server_error", code: script.code, message: script.message } });
        return;
      }
      const response = { id: id("resp"), item: id("item"), cancelled: false, sentMs: 0 };
      active = response;
      send({ type: "response.created", response: { id: response.id, status: "in_progress", output: [] } });
      if (script.kind === "call") {
        const callId = id("call");
        send({
          type: "response.output_item.added",
          response_id: response.id,
          output_index: 0,
          item: { id: response.item, type: "function_call", call_id: callId, name: script.name },
        });
        send({
          type: "response.function_call_arguments.done",
          response_id: response.id,
          item_id: response.item,
          output_index: 0,
          call_id: callId,
          name: script.name,
          arguments: script.arguments,
        });
        send({ type: "response.done", response: { id: response.id, status: "completed" } });
        active = undefined;
        pendingCall = script;
        return;
      }
      send({ type: "response.output_item.added", response_id: response.id, output_index: 0, item: { id: response.item, type: "message", role: "assistant" } });
      void speak(script, response);
    };

    const speak = async (script: Extract<Script, { kind: "reply" | "flood" }>, r: NonNullable<typeof active>) => {
      const base = { response_id: r.id, item_id: r.item, output_index: 0, content_index: 0 };
      const words = script.text.split(" ");
      if (script.kind === "flood") {
        const delta = Buffer.alloc(script.deltaBytes, 1).toString("base64");
        send({ type: "response.output_audio_transcript.delta", ...base, delta: script.text });
        for (let i = 0; i < script.deltas && ws.readyState === ws.OPEN; i++) {
          ws.send(JSON.stringify({ type: "response.output_audio.delta", ...base, delta }));
          fake.flooded++;
          if (ws.bufferedAmount > 256 * 1024) while (ws.bufferedAmount > 64 * 1024 && ws.readyState === ws.OPEN) await new Promise((res) => setTimeout(res, 1));
        }
        if (active === r) active = undefined;
        send({ type: "response.done", response: { id: r.id, status: r.cancelled ? "cancelled" : "completed" } });
        return;
      }
      const pcm = script.pcm ?? tone(script.ms ?? 1_000);
      const chunk = ((script.chunkMs ?? 100) * RATE) / 1000;
      const chunks = Math.ceil(pcm.length / chunk);
      const speed = script.speed ?? 0;
      if (script.audioDelayMs) {
        // The transcript's first word, then the audio only later (a model still thinking).
        send({ type: "response.output_audio_transcript.delta", ...base, delta: words[0] });
        const until = performance.now() + script.audioDelayMs;
        while (performance.now() < until && !r.cancelled) await new Promise((res) => setTimeout(res, 10));
        words.shift();
      }
      const started = performance.now();
      for (let i = 0; i < chunks; i++) {
        if (r.cancelled || ws.readyState !== ws.OPEN) return;
        if (script.dropAfterDeltas !== undefined && i >= script.dropAfterDeltas) {
          ws.terminate();
          return;
        }
        const piece = pcm.subarray(i * chunk, (i + 1) * chunk);
        const word = words[Math.floor((i * words.length) / chunks)];
        if (word !== undefined && Math.floor(((i - 1) * words.length) / chunks) !== Math.floor((i * words.length) / chunks))
          send({ type: "response.output_audio_transcript.delta", ...base, delta: `${i === 0 ? "" : " "}${word}` });
        if (i === 0) {
          const turn = fake.turns.at(-1);
          if (turn && turn.firstDeltaAt === undefined) turn.firstDeltaAt = performance.now();
        }
        send({ type: "response.output_audio.delta", ...base, delta: Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength).toString("base64") });
        r.sentMs += (piece.length * 1000) / RATE;
        itemMs.set(r.item, r.sentMs);
        if (speed > 0) {
          const due = started + ((i + 1) * (script.chunkMs ?? 100)) / speed;
          const wait = due - performance.now();
          if (wait > 0) await new Promise((res) => setTimeout(res, wait));
        } else if (i % 8 === 7) await new Promise((res) => setImmediate(res));
      }
      if (script.held) while (!r.cancelled && ws.readyState === ws.OPEN) await new Promise((res) => setTimeout(res, 10));
      if (r.cancelled) return;
      send({ type: "response.output_audio.done", ...base });
      send({ type: "response.output_audio_transcript.done", ...base, transcript: script.text });
      send({ type: "response.output_item.done", response_id: r.id, output_index: 0, item: { id: r.item, type: "message", status: "completed" } });
      if (active === r) active = undefined;
      send({ type: "response.done", response: { id: r.id, status: "completed" } });
    };

    ws.on("message", (data) => {
      let e: ClientEvent;
      try {
        e = JSON.parse(data.toString()) as ClientEvent;
      } catch {
        return;
      }
      s.events.push(e);
      const eventId = typeof e.event_id === "string" ? e.event_id : undefined;
      const refuse = (code: string, message: string) =>
        send({ type: "error", error: { type: "invalid_request_error", code, message, param: null, event_id: eventId ?? null } });
      switch (e.type) {
        case "session.update":
          if (fake.rejectUpdates > 0) {
            fake.rejectUpdates--;
            refuse("invalid_value", "Invalid value: 'session.audio.output.voice'.");
            break;
          }
          s.session = e.session as Record<string, unknown>;
          send({ type: "session.updated", session: s.session });
          break;
        case "input_audio_buffer.append": {
          const bytes = Buffer.from(String(e.audio), "base64");
          const pcm = new Int16Array(new Uint8Array(bytes).buffer);
          s.appended += pcm.length;
          s.appends.push({ at: performance.now(), samples: pcm.length });
          e.audio = `(${bytes.length} bytes)`;
          const all = new Int16Array(carry.length + pcm.length);
          all.set(carry);
          all.set(pcm, carry.length);
          let at = 0;
          for (; at + FRAME <= all.length; at += FRAME) hearFrame(all.subarray(at, at + FRAME));
          carry = all.slice(at);
          break;
        }
        case "input_audio_buffer.commit": {
          const item = inputItem;
          inputItem = id("item");
          fake.turns.push({ stoppedAt: performance.now() });
          send({ type: "input_audio_buffer.committed", item_id: item, previous_item_id: null });
          transcribe(item);
          break;
        }
        case "response.create":
          if (pendingCall) {
            const after = pendingCall.after;
            pendingCall = undefined;
            respond(after);
          } else respond(next());
          break;
        case "response.cancel":
          if (active && !active.cancelled) {
            active.cancelled = true;
            send({
              type: "response.done",
              response: { id: active.id, status: "cancelled", status_details: { type: "cancelled", reason: "client_cancelled" } },
            });
            active = undefined;
          } else refuse("response_cancel_not_active", "Cancellation failed: no active response found");
          break;
        case "conversation.item.truncate": {
          const ms = Number(e.audio_end_ms);
          const sent = itemMs.get(String(e.item_id));
          if (sent === undefined) refuse("item_not_found", "no such item");
          else if (!(ms > 0) || ms > sent + 1) refuse("invalid_value", `audio_end_ms ${ms} is out of range (0, ${sent}]`);
          else send({ type: "conversation.item.truncated", item_id: e.item_id, content_index: 0, audio_end_ms: ms });
          break;
        }
        case "conversation.item.delete":
          send({ type: "conversation.item.deleted", item_id: e.item_id });
          break;
        case "conversation.item.create":
          send({ type: "conversation.item.added", item: e.item });
          break;
      }
      notify();
    });
    ws.on("close", () => {
      s.closed = true;
      if (age) clearTimeout(age);
      if (active) active.cancelled = true;
      notify();
    });
  }

  await new Promise<void>((resolve) => http.listen(o.port ?? 0, "127.0.0.1", resolve));
  const address = http.address();
  fake.url = `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}/v1`;
  return fake;
}

/** A tone at 24 kHz, loud enough to be heard as a reply. */
export function tone(ms: number, hz = 440): Int16Array {
  const out = new Int16Array(Math.round((ms * RATE) / 1000));
  for (let i = 0; i < out.length; i++) out[i] = Math.round(8000 * Math.sin((2 * Math.PI * hz * i) / RATE));
  return out;
}
