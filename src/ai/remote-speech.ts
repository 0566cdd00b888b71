/**
 * Speech and transcription on an OpenAI-compatible provider, as voice conversations use them:
 * one sentence's speech as raw PCM read as it arrives, and one turn's audio (a 16 kHz WAV)
 * transcribed, its partial text streamed when the model streams. Retries, fallbacks, keys and
 * timeouts are the router's (the Compatible API's own); what is checked here is that the answer is
 * what was asked for, before the first byte is used.
 */
import { wavFile } from "../audio/samples.ts";
import type { ModelConfig } from "../config/config.ts";
import { sseReader } from "../protocol/sse.ts";
import type { InFlight } from "./in-flight.ts";
import { multipart } from "./multipart.ts";
import { closing, type RawAnswer } from "./providers/openai.ts";
import { ProviderError } from "./providers/provider.ts";
import type { ChatRouter } from "./router.ts";

/** `response_format: "pcm"`: 16-bit little-endian mono at this rate (OpenAI's, and the contract's). */
export const PROVIDER_PCM_RATE = 24_000;
/** The rate of the WAV a turn is sent as. */
export const TRANSCRIPTION_RATE = 16_000;
/** A transcription answer longer than this is not a transcript. */
const MAX_TRANSCRIPT_BYTES = 1024 * 1024;
/** The bytes a WAV header is looked for in. */
const MAX_WAV_HEADER = 4096;

/** What a provider call needs besides its arguments. */
export interface RemoteContext {
  router: ChatRouter;
  /** Voice calls in flight per provider. */
  inFlight: InFlight;
}

/** One sentence's speech as it arrives: 16-bit mono samples at PROVIDER_PCM_RATE, from the model that answered. */
export interface RemoteSpeech {
  model: ModelConfig;
  sampleRate: number;
  samples: AsyncIterable<Int16Array>;
}

/**
 * `POST /audio/speech` of one sentence with `response_format: "pcm"`. Resolves once the first
 * audio bytes are in; `signal` aborts the request (the provider sees the connection close). An
 * answer that is not 24 kHz mono PCM (another rate, a text or HTML page) fails before any of it is
 * used, so the next fallback is tried; one that breaks off or stalls later throws from `samples`.
 */
export async function remoteSpeech(c: RemoteContext, model: ModelConfig, text: string, voice: string, signal: AbortSignal): Promise<RemoteSpeech> {
  const answer = await c.router.relay(
    model,
    "/audio/speech",
    (name) => ({ body: JSON.stringify({ model: name, input: text, voice, response_format: "pcm" }), contentType: "application/json" }),
    signal,
    { inFlight: c.inFlight, accept: acceptPcm },
  );
  return { model: answer.model, sampleRate: PROVIDER_PCM_RATE, samples: int16(answer.body) };
}

/** The audio types a `pcm` answer may come as (raw samples; a WAV header is read and checked). */
const RAW_TYPES = new Set(["audio/pcm", "audio/raw", "audio/x-raw", "application/octet-stream", "binary/octet-stream", ""]);
const WAV_TYPES = new Set(["audio/wav", "audio/x-wav", "audio/wave", "audio/vnd.wave"]);

/** Refuses what is not 24 kHz 16-bit mono PCM; skips a WAV header. */
async function acceptPcm(answer: RawAnswer): Promise<RawAnswer> {
  const it = answer.body[Symbol.asyncIterator]();
  const refuse = async (message: string): Promise<never> => {
    await it.return?.();
    throw new ProviderError(message, { retryable: false });
  };
  const [type, ...params] = answer.contentType.split(";").map((p) => p.trim().toLowerCase());
  const wavType = WAV_TYPES.has(type!);
  if (!RAW_TYPES.has(type!) && !wavType) return refuse(`the provider answered ${type} instead of PCM audio`);
  for (const p of params) {
    const [key, value] = p.split("=").map((x) => x.trim());
    if (key === "rate" && Number(value) !== PROVIDER_PCM_RATE) return refuse(`the provider sent audio at ${value} Hz instead of ${PROVIDER_PCM_RATE} Hz`);
    if (key === "channels" && Number(value) !== 1) return refuse(`the provider sent ${value} channels instead of mono`);
  }
  // The first bytes: a WAV header (some servers wrap PCM in one), or text where audio should be.
  let head = Buffer.alloc(0);
  let ended = false;
  while (head.length < 44) {
    const r = await it.next();
    if (r.done) {
      ended = true;
      break;
    }
    head = Buffer.concat([head, r.value]);
  }
  if (head.subarray(0, 4).toString("latin1") === "RIFF") {
    while (!ended && head.length < MAX_WAV_HEADER && head.indexOf("data") < 0) {
      const r = await it.next();
      if (r.done) ended = true;
      else head = Buffer.concat([head, r.value]);
    }
    const wav = wavHeader(head);
    if (typeof wav === "string") return refuse(wav);
    head = head.subarray(wav.dataOffset);
  } else if (wavType) return refuse("the provider's WAV audio has no RIFF header");
  else if (head.length === 0) return refuse("the provider sent no audio");
  else if (looksLikeText(head)) return refuse(`the provider sent text instead of PCM audio: ${JSON.stringify(head.subarray(0, 40).toString("utf8"))}`);
  return { contentType: "audio/pcm", body: rest(head, it) };
}

/** The answer's bytes from `head` on; leaving it ends the answer's exchange, started or not. */
function rest(head: Buffer, it: AsyncIterator<Uint8Array>): AsyncIterableIterator<Uint8Array> {
  let pending: Buffer | undefined = head.length > 0 ? head : undefined;
  return closing(
    {
      next: async () => {
        if (pending) {
          const value = pending;
          pending = undefined;
          return { done: false, value };
        }
        return it.next();
      },
    },
    () => {
      it.return?.()?.catch(() => {});
    },
  );
}

/** Where a 16-bit mono 24 kHz WAV's samples start, or why it is not one. */
function wavHeader(b: Buffer): { dataOffset: number } | string {
  if (b.length < 12 || b.subarray(8, 12).toString("latin1") !== "WAVE") return "the provider's audio is a RIFF file but not a WAV";
  let at = 12;
  let fmt: { channels: number; rate: number; bits: number; format: number } | undefined;
  while (at + 8 <= b.length) {
    const id = b.subarray(at, at + 4).toString("latin1");
    const size = b.readUInt32LE(at + 4);
    if (id === "fmt " && at + 24 <= b.length) {
      fmt = { format: b.readUInt16LE(at + 8), channels: b.readUInt16LE(at + 10), rate: b.readUInt32LE(at + 12), bits: b.readUInt16LE(at + 22) };
    }
    if (id === "data") {
      if (!fmt) return "the provider's WAV has no format before its samples";
      if (fmt.format !== 1 || fmt.bits !== 16) return `the provider's WAV is not 16-bit PCM (format ${fmt.format}, ${fmt.bits} bits)`;
      if (fmt.channels !== 1) return `the provider sent ${fmt.channels} channels instead of mono`;
      if (fmt.rate !== PROVIDER_PCM_RATE) return `the provider sent audio at ${fmt.rate} Hz instead of ${PROVIDER_PCM_RATE} Hz`;
      return { dataOffset: at + 8 };
    }
    at += 8 + size + (size % 2);
  }
  return "the provider's WAV header is incomplete";
}

/** Printable text (an HTML page, a JSON error) where audio samples should be. */
function looksLikeText(head: Buffer): boolean {
  const start = head.subarray(0, 64);
  const printable = start.every((b) => b === 9 || b === 10 || b === 13 || (b >= 32 && b < 127));
  return printable && /^(<!doctype|<html|<\?xml|<[a-z]|\{"|\{\s|\[)/i.test(start.toString("latin1").trimStart());
}

/** Bytes as 16-bit little-endian samples, an odd byte carried over to the next piece. */
async function* int16(bytes: AsyncIterable<Uint8Array>): AsyncGenerator<Int16Array> {
  let carry: number | undefined;
  for await (const piece of bytes) {
    let b = Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength);
    if (carry !== undefined) b = Buffer.concat([Buffer.of(carry), b]);
    carry = b.length % 2 === 1 ? b[b.length - 1] : undefined;
    const whole = b.length - (b.length % 2);
    if (whole === 0) continue;
    // A copy (aligned, and the samples' own): one memcpy, on a little-endian machine as Node's are.
    const out = new Int16Array(whole / 2);
    new Uint8Array(out.buffer).set(b.subarray(0, whole));
    yield out;
  }
}

export interface RemoteTranscriptionOptions {
  /** ISO-639-1 code sent as `language`. */
  language?: string;
  /** Partial text as a streaming model (`stream: true`) sends it: each new piece. */
  onDelta?: (delta: string) => void;
}

/**
 * `POST /audio/transcriptions` of a turn's 16 kHz audio as a WAV file. A model marked `stream: true`
 * is asked to stream (its `transcript.text.delta` events go to `onDelta`); any other answers whole.
 * `signal` aborts the request.
 */
export async function remoteTranscription(
  c: RemoteContext,
  model: ModelConfig,
  pcm: Int16Array,
  o: RemoteTranscriptionOptions,
  signal: AbortSignal,
): Promise<{ text: string; model: ModelConfig }> {
  const wav = wavFile(pcm, TRANSCRIPTION_RATE);
  const answer = await c.router.relay(
    model,
    "/audio/transcriptions",
    (name, m) => {
      const fields: Array<[string, string]> = [
        ["model", name],
        ["response_format", "json"],
      ];
      if (o.language) fields.push(["language", o.language]);
      if (m.stream) fields.push(["stream", "true"]);
      return multipart(fields, { name: "turn.wav", type: "audio/wav", bytes: wav });
    },
    signal,
    { inFlight: c.inFlight, accept: acceptTranscript },
  );
  const type = answer.contentType.split(";")[0]!.trim().toLowerCase();
  const text = type === "text/event-stream" ? await readEvents(answer.body, o.onDelta) : await readJsonText(answer.body);
  return { text: text.trim(), model: answer.model };
}

/** A transcript comes as JSON or as server-sent events; anything else (an HTML page) is refused. */
async function acceptTranscript(answer: RawAnswer): Promise<RawAnswer> {
  const type = answer.contentType.split(";")[0]!.trim().toLowerCase();
  if (type === "application/json" || type === "text/event-stream") return answer;
  await answer.body[Symbol.asyncIterator]().return?.();
  throw new ProviderError(`the provider answered ${type || "no content type"} instead of a transcript`, { retryable: false });
}

async function readAll(body: AsyncIterable<Uint8Array>): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const piece of body) {
    size += piece.byteLength;
    if (size > MAX_TRANSCRIPT_BYTES) throw new ProviderError(`the provider's transcript is over ${MAX_TRANSCRIPT_BYTES} bytes`);
    chunks.push(Buffer.from(piece));
  }
  return Buffer.concat(chunks).toString("utf8");
}

async function readJsonText(body: AsyncIterable<Uint8Array>): Promise<string> {
  const raw = await readAll(body);
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw);
  } catch {
    throw new ProviderError("the provider's transcript is not JSON");
  }
  const text = (parsed as { text?: unknown } | null)?.text;
  if (typeof text !== "string") throw new ProviderError("the provider's transcript has no text");
  return text;
}

/** OpenAI's transcription events: `transcript.text.delta` pieces, then `transcript.text.done` with the whole text. */
async function readEvents(body: AsyncIterable<Uint8Array>, onDelta: ((delta: string) => void) | undefined): Promise<string> {
  let done: string | undefined;
  let failure: string | undefined;
  let sofar = "";
  let size = 0;
  const parser = sseReader((event) => {
    let value: { type?: string; delta?: unknown; text?: unknown; error?: { message?: string } };
    try {
      value = JSON.parse(event.data);
    } catch {
      return;
    }
    if (value.error) failure ??= value.error.message ?? "the provider's transcription failed";
    else if (value.type === "transcript.text.delta" && typeof value.delta === "string") {
      sofar += value.delta;
      if (done === undefined) onDelta?.(value.delta);
    } else if (value.type === "transcript.text.done" && typeof value.text === "string") done = value.text;
  });
  const decoder = new TextDecoder();
  for await (const piece of body) {
    size += piece.byteLength;
    if (size > MAX_TRANSCRIPT_BYTES) throw new ProviderError(`the provider's transcript is over ${MAX_TRANSCRIPT_BYTES} bytes`);
    parser.feed(decoder.decode(piece, { stream: true }));
    if (failure) throw new ProviderError(failure);
    if (done !== undefined) return done;
  }
  if (done === undefined) throw new ProviderError(sofar ? "the provider's transcript stream ended before it was done" : "the provider sent no transcript");
  return done;
}
