import createSpeex, { type SpeexModule } from "@echogarden/speex-resampler-wasm";

let loaded: Promise<SpeexModule> | undefined;

/** The Speex resampler (SpeexDSP, in WebAssembly): one module per process, one small state per stream. */
export function loadResampler(): Promise<SpeexModule> {
  loaded ??= createSpeex();
  return loaded;
}

/** Speex quality 0–10: 5 is its VoIP default, far above what speech recognition or a small speaker can tell apart. */
const QUALITY = 5;
/** Samples processed per call into the module's heap. */
const CHUNK = 4096;

/**
 * A streaming resampler of 16-bit mono PCM. Its filter state runs on from one call to the next,
 * so audio cut into frames anywhere comes out exactly as if resampled in one piece: no sample
 * dropped or repeated at a frame's edge. Call `close()` to free its state.
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
    // The two lengths are 32-bit words: their offset is rounded up to 4 bytes, or HEAPU32 (which
    // indexes by offset >> 2) and the module would read different addresses (24 → 16 kHz did).
    const lengths = (2 * (CHUNK + this.outCapacity) + 3) & ~3;
    this.buf = module._malloc(lengths + 8);
    this.inLen = this.buf + lengths;
    this.outLen = this.inLen + 4;
  }

  /** Resamples the next piece of the stream; what the filter holds back comes out with later input. */
  process(input: Int16Array): Int16Array {
    if (!this.state) throw new Error("the resampler is closed");
    const m = this.m;
    const parts: Int16Array[] = [];
    let total = 0;
    for (let offset = 0; offset < input.length; ) {
      const n = Math.min(CHUNK, input.length - offset);
      const inPtr = this.buf;
      const outPtr = this.buf + 2 * CHUNK;
      m.HEAP16.set(input.subarray(offset, offset + n), inPtr >> 1);
      m.HEAPU32[this.inLen >> 2] = n;
      m.HEAPU32[this.outLen >> 2] = this.outCapacity;
      const code = m._speex_resampler_process_int(this.state, 0, inPtr, this.inLen, outPtr, this.outLen);
      if (code !== 0) throw new Error(`the resampler failed (error ${code})`);
      const consumed = m.HEAPU32[this.inLen >> 2]!;
      const written = m.HEAPU32[this.outLen >> 2]!;
      parts.push(m.HEAP16.slice(outPtr >> 1, (outPtr >> 1) + written));
      total += written;
      // Every sample is consumed when the output has room, which it always has here.
      if (consumed === 0 && written === 0) throw new Error("the resampler made no progress");
      offset += consumed;
    }
    if (parts.length === 1) return parts[0]!;
    const out = new Int16Array(total);
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
