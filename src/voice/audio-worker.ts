/**
 * An audio thread (src/voice/audio-threads.ts): the uplinks of the conversations assigned to it,
 * from RTP packets to samples at the listener's rate (the jitter buffer's clock ticks here), and
 * their replies' frames encoded to Opus, posted back to the main thread once per turn of this
 * thread's event loop. Nothing here may throw out of a
 * message or a timer: a conversation's failure is that conversation's.
 */
import { parentPort } from "node:worker_threads";
import { FRAME_HEADER, type FromAudioThread, OUT, PACKET_HEADER, type ToAudioThread } from "./audio-wire.ts";
import { FRAME_SAMPLES, OpusCodec } from "./opus.ts";
import { Uplink } from "./uplink.ts";

const TICK_MS = 20;
/** Packet counts go to the main thread every this many ticks. */
const COUNT_TICKS = 50;

interface Held {
  codec: OpusCodec;
  uplink: Uplink;
}

const port = parentPort;
if (!port) throw new Error("the audio worker runs in a worker thread");
const held = new Map<number, Held>();
/** What goes out at the next flush: the items, and the samples of the PCM items in order. */
let items: number[] = [];
let chunks: Int16Array[] = [];
let samples = 0;
let packetsOut: Buffer[] = [];
let opusBytes = 0;
let ticks = 0;

function open(m: Extract<ToAudioThread, { t: "open" }>): void {
  const { id } = m;
  close(id);
  const codec = new OpusCodec(m.rate);
  const uplink = new Uplink({
    codec,
    payloadType: m.payloadType,
    audioLevelId: m.audioLevelId,
    ...(m.hangoverMs !== undefined ? { hangoverMs: m.hangoverMs } : {}),
    pcm: (pcm) => {
      items.push(id, OUT.pcm, samples, pcm.length);
      chunks.push(pcm);
      samples += pcm.length;
    },
    silence: (n) => items.push(id, OUT.silence, n, 0),
    overrun: (n) => items.push(id, OUT.overrun, n, 0),
  });
  held.set(id, { codec, uplink });
  codec.prepare();
}

/** Ends a conversation here; its last counts (none when it was never opened). */
function close(id: number): { decoded: number; silent: number } {
  const h = held.get(id);
  if (!h) return { decoded: 0, silent: 0 };
  held.delete(id);
  h.codec.close();
  return { decoded: h.uplink.decoded, silent: h.uplink.silent };
}

/** Encodes reply frames, each with its conversation's encoder; a frame of a conversation gone is answered all the same (not encoded). */
function frames(data: ArrayBuffer): void {
  const view = new DataView(data);
  const size = FRAME_HEADER + FRAME_SAMPLES * 2;
  for (let at = 0; at + size <= data.byteLength; at += size) {
    const id = view.getUint32(at, true);
    let opus: Buffer | undefined;
    try {
      opus = held.get(id)?.codec.encode(new Int16Array(data, at + FRAME_HEADER, FRAME_SAMPLES));
    } catch {}
    if (opus) {
      items.push(id, OUT.opus, opusBytes, opus.length);
      packetsOut.push(opus);
      opusBytes += opus.length;
    } else items.push(id, OUT.opus, opusBytes, 0);
  }
}

function packets(data: ArrayBuffer): void {
  const bytes = Buffer.from(data);
  let at = 0;
  while (at + PACKET_HEADER <= bytes.length) {
    const id = bytes.readUInt32LE(at);
    const length = bytes.readUInt16LE(at + 4);
    at += PACKET_HEADER;
    const packet = bytes.subarray(at, at + length);
    at += length;
    const h = held.get(id);
    if (!h) continue;
    try {
      h.uplink.packet(packet);
    } catch {
      // The device's bytes failed its uplink: that packet is lost, the conversation goes on.
    }
  }
}

/** Posts what was decoded since the last flush, in one message. */
function flush(): void {
  if (items.length === 0) return;
  let pcm: ArrayBuffer | undefined;
  if (samples > 0) {
    const all = new Int16Array(samples);
    let at = 0;
    for (const c of chunks) {
      all.set(c, at);
      at += c.length;
    }
    pcm = all.buffer;
  }
  let opus: ArrayBuffer | undefined;
  if (opusBytes > 0) {
    opus = new ArrayBuffer(opusBytes);
    const out = Buffer.from(opus);
    let at = 0;
    for (const p of packetsOut) {
      p.copy(out, at);
      at += p.length;
    }
  }
  const message: FromAudioThread = { t: "out", pcm, opus, items };
  items = [];
  chunks = [];
  samples = 0;
  packetsOut = [];
  opusBytes = 0;
  port!.postMessage(message, [...(pcm ? [pcm] : []), ...(opus ? [opus] : [])]);
}

port.on("message", (m: ToAudioThread) => {
  try {
    if (m.t === "in") {
      if (m.rtp) packets(m.rtp);
      if (m.frames) frames(m.frames);
    } else if (m.t === "open") {
      try {
        open(m);
      } catch {
        items.push(m.id, OUT.failed, 0, 0);
      }
    } else if (m.t === "close") {
      const last = close(m.id);
      items.push(m.id, OUT.closed, last.decoded, last.silent);
    } else if (m.t === "ping") {
      port!.postMessage({ t: "out", pcm: undefined, opus: undefined, items: [] } satisfies FromAudioThread);
    }
  } finally {
    flush();
  }
});

// Loaded: the first message (empty) says so; a thread that ends before it is restarted with back-off.
port.postMessage({ t: "out", pcm: undefined, opus: undefined, items: [] } satisfies FromAudioThread);

setInterval(() => {
  const count = ++ticks >= COUNT_TICKS;
  if (count) ticks = 0;
  for (const [id, h] of held) {
    try {
      h.uplink.tick();
    } catch {}
    if (count) items.push(id, OUT.counts, h.uplink.decoded, h.uplink.silent);
  }
  flush();
}, TICK_MS);
