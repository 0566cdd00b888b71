import createSpeex, { type SpeexModule } from "@echogarden/speex-resampler-wasm";

/** The Speex resampler (SpeexDSP, in WebAssembly): a module (its own heap) for its holder to keep, one small state per stream. */
export function loadResampler(): Promise<SpeexModule> {
  return createSpeex();
}

/** Speex quality 0–10: 5 is its VoIP default, far above what speech recognition or a small speaker can tell apart. */
const QUALITY = 5;
/** Samples processed per call into the module's heap. */
const CHUNK = 4096;
/** Bytes a sample takes in the module's heap at most (float). */
const WIDTH = 4;

/**
 * A streaming resampler of mono PCM, 16-bit (`process`) or float (`processFloat`; the decoders'
 * blocks). Its filter state runs on from one call to the next, so audio cut into frames anywhere
 * comes out exactly as if resampled in one piece: no sample dropped or repeated at a frame's edge.
 * Call `close()` to free its state.
 */
export class Resampler {
  readonly inRate: number;
  readonly outRate: number;
  private readonly m: SpeexModule;
  private state: number;
  private readonly buf: number;
  private readonly inLen: number;
  private readonly outLen: number;
  private readonly outCapacity: number;
  /** Samples taken in and handed out so far: what `flushFloat` makes the output's length agree with. */
  private taken = 0;
  private given = 0;

  /** `module` from `await loadResampler()`. */
  constructor(module: SpeexModule, inRate: number, outRate: number) {
    this.m = module;
    this.inRate = inRate;
    this.outRate = outRate;
    this.outCapacity = Math.ceil((CHUNK * outRate) / inRate) + 64;
    const err = module._malloc(4);
    this.state = module._speex_resampler_init(1, inRate, outRate, QUALITY, err);
    const code = module.HEAPU32[err >> 2];
    module._free(err);
    if (!this.state || code !== 0) throw new Error(`the resampler could not start (${inRate} → ${outRate} Hz, error ${code})`);
    // The filter's delay would otherwise come out as leading zeros.
    module._speex_resampler_skip_zeros(this.state);
    // The input and output areas hold CHUNK and outCapacity samples of either type (4 bytes a
    // float); the two lengths after them are 32-bit words, so all offsets stay multiples of 4 (or
    // HEAPU32, which indexes by offset >> 2, and the module would read different addresses).
    const areas = WIDTH * (CHUNK + this.outCapacity);
    this.buf = module._malloc(areas + 8);
    this.inLen = this.buf + areas;
    this.outLen = this.inLen + 4;
  }

  /** Resamples the next piece of the stream; what the filter holds back comes out with later input. */
  process(input: Int16Array): Int16Array {
    return this.run(input, false) as Int16Array;
  }

  /** `process` for float samples. */
  processFloat(input: Float32Array): Float32Array {
    return this.run(input, true) as Float32Array;
  }

  /**
   * What the filter still holds, as if silence followed the input: after it, the float output
   * has as many samples as the input's duration makes at the output rate.
   */
  flushFloat(): Float32Array {
    const expected = Math.round((this.taken * this.outRate) / this.inRate);
    if (!this.state || expected <= this.given) return new Float32Array(0);
    const latency = this.m._speex_resampler_get_input_latency(this.state);
    const tail = this.processFloat(new Float32Array(latency + Math.ceil(this.inRate / this.outRate) + 1));
    return tail.subarray(0, Math.max(0, expected - (this.given - tail.length)));
  }

  private run(input: Int16Array | Float32Array, float: boolean): Int16Array | Float32Array {
    if (!this.state) throw new Error("the resampler is closed");
    const m = this.m;
    const parts: Array<Int16Array | Float32Array> = [];
    let total = 0;
    const inPtr = this.buf;
    const outPtr = this.buf + WIDTH * CHUNK;
    for (let offset = 0; offset < input.length; ) {
      const n = Math.min(CHUNK, input.length - offset);
      // The module's views are read each time: they are replaced when its memory grows.
      const heap = float ? m.HEAPF32 : m.HEAP16;
      const shift = float ? 2 : 1;
      heap.set(input.subarray(offset, offset + n), inPtr >> shift);
      m.HEAPU32[this.inLen >> 2] = n;
      m.HEAPU32[this.outLen >> 2] = this.outCapacity;
      const code = float
        ? m._speex_resampler_process_float(this.state, 0, inPtr, this.inLen, outPtr, this.outLen)
        : m._speex_resampler_process_int(this.state, 0, inPtr, this.inLen, outPtr, this.outLen);
      if (code !== 0) throw new Error(`the resampler failed (error ${code})`);
      const consumed = m.HEAPU32[this.inLen >> 2]!;
      const written = m.HEAPU32[this.outLen >> 2]!;
      parts.push((float ? m.HEAPF32 : m.HEAP16).slice(outPtr >> shift, (outPtr >> shift) + written));
      total += written;
      // Every sample is consumed when the output has room, which it always has here.
      if (consumed === 0 && written === 0) throw new Error("the resampler made no progress");
      offset += consumed;
    }
    this.taken += input.length;
    this.given += total;
    if (parts.length === 1) return parts[0]!;
    const out = float ? new Float32Array(total) : new Int16Array(total);
    let at = 0;
    for (const p of parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }

  close(): void {
    if (!this.state) return;
    this.m._speex_resampler_destroy(this.state);
    this.m._free(this.buf);
    this.state = 0;
  }
}
