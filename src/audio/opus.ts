import { createRequire } from "node:module";

/**
 * libopus (mono, 48 kHz), as the `opusscript` package compiles it to WebAssembly, with glue of our
 * own. The compiled functions take PCM as one byte of the little-endian samples per 16-bit slot,
 * at a byte address. opusscript's JavaScript allocates N bytes for N such slots (2N bytes) and
 * indexes its 16-bit view with the byte address, so every PCM buffer lies at twice its allocated
 * address: codecs write over each other's memory, and with about 77 codecs alive at once the
 * addresses leave the module's 16 MiB heap. Here each PCM buffer is allocated at its full size and
 * used at the address `_malloc` returned.
 *
 * A module instance (its own 16 MiB of memory) serves up to CODECS_PER_MODULE codecs; another is
 * instantiated when all are full, and one left empty is dropped (the first is kept). The build lets
 * a module's memory grow (in `_malloc`), which replaces its views: they are taken anew on every
 * call, and none is kept across a call that allocates.
 *
 * The module instances are this JavaScript thread's (each audio thread has its own), shared by
 * every codec made on it, whichever node made it: they are an allocator's arenas, as the thread's
 * own heap is. A codec's state is its own region of one of them; no codec, and so no node, reads
 * another's, and a node's codecs all end with it (`close`), so an arena left empty is dropped.
 */

interface Handler {
  _encode(pcm: number, pcmBytes: number, out: number, frameSize: number): number;
  _decode(packet: number, packetBytes: number, pcm: number): number;
  _encoder_ctl(ctl: number, arg: number): number;
}

interface NativeModule {
  HEAPU8: Uint8Array;
  _malloc(bytes: number): number;
  _free(pointer: number): void;
  OpusScriptHandler: { new (rate: number, channels: number, application: number): Handler; destroy_handler(handler: Handler): void };
}

const require = createRequire(import.meta.url);
const instantiate = require("opusscript/build/opusscript_native_wasm.js") as () => NativeModule;

export const OPUS_RATE = 48_000;
/** The longest frame libopus encodes: 60 ms at 48 kHz. */
const MAX_FRAME_SAMPLES = 2880;
/**
 * The most samples one packet decodes to: 120 ms at 48 kHz (a packet of several frames, RFC 6716
 * §3.2.5), which the compiled decoder writes in full (it decodes up to 5760 samples a channel).
 */
const MAX_PACKET_SAMPLES = 5760;
/** The largest packet (three 20 ms frames of the highest rate), as opusscript sizes it. */
export const MAX_PACKET_BYTES = 1276 * 3;
/** Codecs on one module instance: each takes about 60 KB of state and 42 KB of buffers. */
const CODECS_PER_MODULE = 64;

const APPLICATIONS = { voip: 2048, audio: 2049 } as const;
const OPUS_SET_BITRATE = 4002;
const OPUS_SET_COMPLEXITY = 4010;
const ERRORS: Record<number, string> = {
  [-1]: "bad argument",
  [-2]: "buffer too small",
  [-3]: "internal error",
  [-4]: "invalid packet",
  [-5]: "unimplemented",
  [-6]: "invalid state",
  [-7]: "memory allocation failed",
};

interface Slot {
  native: NativeModule;
  codecs: number;
}
const modules: Slot[] = [];

function takeSlot(): Slot {
  let slot = modules.find((m) => m.codecs < CODECS_PER_MODULE);
  if (!slot) {
    slot = { native: instantiate(), codecs: 0 };
    modules.push(slot);
  }
  slot.codecs++;
  return slot;
}

function releaseSlot(slot: Slot): void {
  slot.codecs--;
  const i = modules.indexOf(slot);
  if (slot.codecs === 0 && i > 0) modules.splice(i, 1);
}

/** Module instances alive now (tests and measurements). */
export function opusModules(): number {
  return modules.length;
}

/** The rates libopus encodes and decodes at (RFC 6716 §2: it decodes any stream at any of them). */
export const OPUS_RATES = [8_000, 12_000, 16_000, 24_000, 48_000] as const;
export type OpusRate = (typeof OPUS_RATES)[number];

/**
 * An Opus encoder and decoder of one mono stream at `rate` (48 kHz by default; a decoder at 16 kHz
 * gives the recogniser's rate with no resampler). Call `close()` to free its memory.
 */
export class LibOpus {
  private slot: Slot | undefined;
  private readonly handler: Handler;
  private readonly pcmIn: number;
  private readonly packetIn: number;
  private readonly packetOut: number;
  private readonly pcmOut: number;

  constructor(application: keyof typeof APPLICATIONS, rate: OpusRate = OPUS_RATE) {
    if (!OPUS_RATES.includes(rate)) throw new RangeError(`libopus runs at ${OPUS_RATES.join(", ")} Hz, not ${rate}`);
    const slot = takeSlot();
    const { native } = slot;
    const pointers: number[] = [];
    try {
      // PCM: 2 bytes a sample, each byte in a 16-bit slot. The decoder's output holds a whole packet.
      for (const bytes of [MAX_FRAME_SAMPLES * 4, MAX_PACKET_BYTES, MAX_PACKET_BYTES, MAX_PACKET_SAMPLES * 4]) {
        const p = native._malloc(bytes);
        if (!p) throw new Error("libopus is out of memory");
        pointers.push(p);
      }
      this.handler = new native.OpusScriptHandler(rate, 1, APPLICATIONS[application]);
    } catch (err) {
      for (const p of pointers) native._free(p);
      releaseSlot(slot);
      throw err;
    }
    [this.pcmIn, this.packetIn, this.packetOut, this.pcmOut] = pointers as [number, number, number, number];
    this.slot = slot;
  }

  setBitrate(bitsPerSecond: number): void {
    check(this.handler._encoder_ctl(OPUS_SET_BITRATE, bitsPerSecond), "encoder setting");
  }

  /** The encoder's computational complexity, 0–10 (libopus's default 10): lower costs less CPU for a little quality. */
  setComplexity(complexity: number): void {
    check(this.handler._encoder_ctl(OPUS_SET_COMPLEXITY, complexity), "encoder setting");
  }

  /** One frame of `pcm.length` samples (2.5–60 ms at the codec's rate) to one packet. */
  encode(pcm: Int16Array): Buffer {
    const heap = this.heap();
    if (pcm.length > MAX_FRAME_SAMPLES) throw new RangeError(`a frame has at most ${MAX_FRAME_SAMPLES} samples`);
    // this.pcmIn is 2-byte aligned (malloc aligns to 8 or more).
    new Uint16Array(heap.buffer, this.pcmIn, pcm.byteLength).set(new Uint8Array(pcm.buffer, pcm.byteOffset, pcm.byteLength));
    const bytes = check(this.handler._encode(this.pcmIn, pcm.byteLength, this.packetOut, pcm.length), "encode");
    return Buffer.from(heap.subarray(this.packetOut, this.packetOut + bytes));
  }

  /** One packet to its samples at the codec's rate (up to 120 ms of them); throws on a packet libopus refuses. */
  decode(packet: Uint8Array): Int16Array {
    const heap = this.heap();
    if (packet.length < 1 || packet.length > MAX_PACKET_BYTES) throw new RangeError(`a packet has 1 to ${MAX_PACKET_BYTES} bytes`);
    heap.set(packet, this.packetIn);
    const samples = check(this.handler._decode(this.packetIn, packet.length, this.pcmOut), "decode");
    const out = new Int16Array(samples);
    new Uint8Array(out.buffer).set(new Uint16Array(heap.buffer, this.pcmOut, samples * 2));
    return out;
  }

  close(): void {
    const slot = this.slot;
    if (!slot) return;
    this.slot = undefined;
    slot.native.OpusScriptHandler.destroy_handler(this.handler);
    for (const p of [this.pcmIn, this.packetIn, this.packetOut, this.pcmOut]) slot.native._free(p);
    releaseSlot(slot);
  }

  private heap(): Uint8Array {
    if (!this.slot) throw new Error("the codec is closed");
    return this.slot.native.HEAPU8;
  }
}

function check(result: number, what: string): number {
  if (result < 0) throw new Error(`libopus ${what} failed: ${ERRORS[result] ?? result}`);
  return result;
}
