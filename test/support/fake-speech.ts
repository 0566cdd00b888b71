import { createHash } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { wavFile } from "../../src/audio/samples.ts";
import { engines } from "./engines.ts";
import { startTestServer, type TestServer } from "./server.ts";

/** What the fake speech provider does with one `POST /audio/speech`. */
export type SpeechAct =
  /** 24 kHz PCM (default: half a second of a tone), in pieces of `pieceMs`, `delayMs` apart; `gate` awaited before each piece after the first. */
  | { kind: "pcm"; pcm?: Int16Array; pieceMs?: number; delayMs?: number; gate?: (piece: number) => Promise<void>; contentType?: string }
  /** The same audio inside a WAV at `rate` (a model that declares another rate than asked). */
  | { kind: "wav"; rate: number; pcm?: Int16Array; channels?: number }
  | { kind: "status"; status: number; retryAfter?: string }
  /** Headers and `pieces` pieces of audio, then nothing more (the connection stays open). */
  | { kind: "stall"; pieces?: number }
  | { kind: "html" };

/** What it does with one `POST /audio/transcriptions`. */
export type TranscriptionAct =
  | { kind: "text"; text: string; delayMs?: number }
  /** Streamed as `transcript.text.delta` events when the request asked to stream, else whole. */
  | { kind: "deltas"; deltas: string[]; delayMs?: number }
  | { kind: "status"; status: number; retryAfter?: string }
  | { kind: "hang" }
  | { kind: "html" };

export interface SpeechRequestSeen {
  path: string;
  /** JSON for speech; the form's text fields for transcriptions. */
  fields: Record<string, string>;
  /** The uploaded file of a transcription. */
  file?: Buffer;
  /** Resolves when the answer was closed by the client before it finished. */
  closedEarly: Promise<void>;
  /** Resolves when the answer was fully written. */
  finished: Promise<void>;
  /** Milliseconds of audio written so far (speech). */
  sentMs: number;
}

/** A mono WAV's header saying `channels` channels (its fmt chunk at byte 12: channels at 22, block align at 32). */
function withChannels(wav: Buffer, channels: number): Buffer {
  if (channels === 1) return wav;
  wav.writeUInt16LE(channels, 22);
  wav.writeUInt16LE(2 * channels, 32);
  return wav;
}

/** A tone of `ms` at 24 kHz. */
export function tone(ms: number, frequency = 440, rate = 24_000): Int16Array {
  const out = new Int16Array(Math.round((ms / 1000) * rate));
  for (let i = 0; i < out.length; i++) out[i] = Math.round(8000 * Math.sin((2 * Math.PI * frequency * i) / rate));
  return out;
}

/**
 * An OpenAI-compatible speech provider on loopback (a real HTTP server): speech as raw 24 kHz PCM,
 * transcriptions as JSON or OpenAI's events, each request answered by the next scripted act
 * (or the default), every request recorded with whether its client closed it early.
 */
export class FakeSpeechProvider {
  readonly requests: SpeechRequestSeen[] = [];
  private readonly speechActs: SpeechAct[] = [];
  /** Acts for the next request that speaks a given input (a late request of an earlier turn cannot take them). */
  private readonly speechActsFor = new Map<string, SpeechAct>();
  private readonly transcriptionActs: TranscriptionAct[] = [];
  defaultSpeech: SpeechAct = { kind: "pcm" };
  defaultTranscription: TranscriptionAct = { kind: "text", text: "hello there" };
  private server!: http.Server;
  url = "";

  speech(...acts: SpeechAct[]): this {
    this.speechActs.push(...acts);
    return this;
  }

  /** `act` for the next request whose input is `input`, whatever comes before it. */
  speechFor(input: string, act: SpeechAct): this {
    this.speechActsFor.set(input, act);
    return this;
  }

  transcription(...acts: TranscriptionAct[]): this {
    this.transcriptionActs.push(...acts);
    return this;
  }

  of(path: "/audio/speech" | "/audio/transcriptions"): SpeechRequestSeen[] {
    return this.requests.filter((r) => r.path === path);
  }

  async start(): Promise<this> {
    this.server = http.createServer((req, res) => {
      this.handle(req, res).catch(() => res.destroy());
    });
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/v1`;
    return this;
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise((resolve) => this.server.close(resolve));
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const body = Buffer.concat(chunks);
    const path = (req.url ?? "").replace(/^\/v1/, "");
    let closedEarly!: () => void;
    let finished!: () => void;
    const seen: SpeechRequestSeen = {
      path,
      fields: {},
      closedEarly: new Promise((r) => (closedEarly = r)),
      finished: new Promise((r) => (finished = r)),
      sentMs: 0,
    };
    res.on("close", () => (res.writableFinished ? finished() : closedEarly()));
    if (req.method === "POST" && path === "/audio/speech") {
      seen.fields = JSON.parse(body.toString("utf8")) as Record<string, string>;
      this.requests.push(seen);
      const keyed = this.speechActsFor.get(seen.fields.input ?? "");
      if (keyed) this.speechActsFor.delete(seen.fields.input ?? "");
      return this.speak(keyed ?? this.speechActs.shift() ?? this.defaultSpeech, res, seen);
    }
    if (req.method === "POST" && path === "/audio/transcriptions") {
      const form = await new Response(body, { headers: { "content-type": req.headers["content-type"] ?? "" } }).formData();
      for (const [k, v] of form.entries()) {
        if (typeof v === "string") seen.fields[k] = v;
        else seen.file = Buffer.from(await v.arrayBuffer());
      }
      this.requests.push(seen);
      return this.transcribe(this.transcriptionActs.shift() ?? this.defaultTranscription, res, seen.fields.stream === "true");
    }
    res.writeHead(404, { "content-type": "application/json" }).end(JSON.stringify({ error: { message: "not found" } }));
  }

  private async speak(act: SpeechAct, res: http.ServerResponse, seen: SpeechRequestSeen): Promise<void> {
    const pcm = ("pcm" in act && act.pcm) || tone(500);
    const bytes = (p: Int16Array) => Buffer.from(p.buffer, p.byteOffset, p.byteLength);
    switch (act.kind) {
      case "status":
        return errorReply(res, act.status, act.retryAfter);
      case "html":
        res.writeHead(200, { "content-type": "text/html" }).end("<!DOCTYPE html><html><body>Bad gateway</body></html>");
        return;
      case "wav":
        res.writeHead(200, { "content-type": "audio/wav" }).end(withChannels(wavFile(pcm, act.rate), act.channels ?? 1));
        return;
      case "stall": {
        res.writeHead(200, { "content-type": "audio/pcm" });
        const piece = 480; // 20 ms at 24 kHz
        for (let i = 0; i < (act.pieces ?? 1); i++) res.write(bytes(pcm.subarray(i * piece, (i + 1) * piece)));
        return;
      }
      case "pcm": {
        res.writeHead(200, { "content-type": act.contentType ?? "audio/pcm" });
        const piece = Math.round(((act.pieceMs ?? 100) / 1000) * 24_000);
        for (let at = 0, i = 0; at < pcm.length; at += piece, i++) {
          if (i > 0) {
            await act.gate?.(i);
            if (act.delayMs) await new Promise((r) => setTimeout(r, act.delayMs));
          }
          if (res.destroyed) return;
          res.write(bytes(pcm.subarray(at, at + piece)));
          seen.sentMs = (Math.min(pcm.length, at + piece) / 24_000) * 1000;
        }
        res.end();
      }
    }
  }

  private async transcribe(act: TranscriptionAct, res: http.ServerResponse, stream: boolean): Promise<void> {
    switch (act.kind) {
      case "status":
        return errorReply(res, act.status, act.retryAfter);
      case "hang":
        return;
      case "html":
        res.writeHead(200, { "content-type": "text/html" }).end("<html><body>Bad gateway</body></html>");
        return;
      case "text":
        if (act.delayMs) await new Promise((r) => setTimeout(r, act.delayMs));
        if (stream) {
          res.writeHead(200, { "content-type": "text/event-stream" });
          res.end(`data: ${JSON.stringify({ type: "transcript.text.done", text: act.text })}\n\n`);
        } else res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ text: act.text }));
        return;
      case "deltas": {
        const text = act.deltas.join("");
        if (!stream) {
          res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ text }));
          return;
        }
        res.writeHead(200, { "content-type": "text/event-stream" });
        for (const delta of act.deltas) {
          res.write(`data: ${JSON.stringify({ type: "transcript.text.delta", delta })}\n\n`);
          if (act.delayMs) await new Promise((r) => setTimeout(r, act.delayMs));
        }
        res.end(`data: ${JSON.stringify({ type: "transcript.text.done", text })}\n\n`);
      }
    }
  }
}

/** OpenAI's error envelope with `status`. */
function errorReply(res: http.ServerResponse, status: number, retryAfter: string | undefined): void {
  res.writeHead(status, { "content-type": "application/json", ...(retryAfter ? { "retry-after": retryAfter } : {}) });
  res.end(JSON.stringify({ error: { message: `fake provider says ${status}`, type: "server_error", param: null, code: null } }));
}

/**
 * A Perch node serving only speech: its embedded tts-1 and whisper-1 on its Compatible API, for
 * the API key `key` (no WebRTC, no agents).
 */
export function startSpeechNode(key: string): Promise<TestServer> {
  return startTestServer({
    config: {
      webrtc: { enabled: false },
      api_keys: [{ name: "front", sha256: createHash("sha256").update(key).digest("hex"), models: ["tts-1", "whisper-1"] }],
    },
    engines: engines(),
  });
}

export function startFakeSpeechProvider(): Promise<FakeSpeechProvider> {
  return new FakeSpeechProvider().start();
}
