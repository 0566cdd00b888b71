/**
 * A streaming windowed-sinc resampler from any rate to another, for mono Float32 samples: the
 * decoders hand over blocks as they decode them, and only a few dozen samples of history are kept
 * between blocks, so the source never has to be held whole.
 */

/** Zero crossings of the kernel on each side (of the lower of the two rates). */
const ZERO_CROSSINGS = 8;
/** Kernel values tabulated per unit of its argument; linear interpolation between them. */
const TABLE_STEPS = 256;

/** The low-passed sinc kernel with a Blackman window, tabulated from 0 to ZERO_CROSSINGS. */
function kernelTable(): Float32Array {
  const table = new Float32Array(ZERO_CROSSINGS * TABLE_STEPS + 2);
  for (let i = 0; i < table.length; i++) {
    const x = i / TABLE_STEPS;
    const sinc = x === 0 ? 1 : Math.sin(Math.PI * x) / (Math.PI * x);
    const w = x >= ZERO_CROSSINGS ? 0 : 0.42 + 0.5 * Math.cos((Math.PI * x) / ZERO_CROSSINGS) + 0.08 * Math.cos((2 * Math.PI * x) / ZERO_CROSSINGS);
    table[i] = sinc * w;
  }
  return table;
}

let table: Float32Array | undefined;

export class Resampler {
  readonly from: number;
  readonly to: number;
  /** Source samples per output sample. */
  private readonly step: number;
  /** Kernel argument per source sample (below 1 when downsampling: the cut-off is the output's Nyquist). */
  private readonly scale: number;
  /** Source samples each side of an output sample that reach it. */
  private readonly reach: number;
  private readonly kernel: Float32Array;
  /** Source samples not yet passed for good, starting at source index `base`. */
  private buffer = new Float32Array(0);
  private base = 0;
  /** The source position of the next output sample. */
  private position = 0;

  constructor(from: number, to: number) {
    if (!(from > 0 && to > 0)) throw new RangeError("sample rates must be positive");
    this.from = from;
    this.to = to;
    this.step = from / to;
    this.scale = Math.min(1, to / from) * 0.95;
    this.reach = Math.ceil(ZERO_CROSSINGS / this.scale);
    table ??= kernelTable();
    this.kernel = table;
  }

  /** Output for `input`, as far as the samples so far determine it. */
  push(input: Float32Array): Float32Array {
    if (this.from === this.to) return input.slice();
    const joined = new Float32Array(this.buffer.length + input.length);
    joined.set(this.buffer);
    joined.set(input, this.buffer.length);
    this.buffer = joined;
    return this.run(false);
  }

  /** The rest: the last samples, as if silence followed. */
  flush(): Float32Array {
    if (this.from === this.to) return new Float32Array(0);
    return this.run(true);
  }

  private run(final: boolean): Float32Array {
    const { buffer, base, reach, step, scale, kernel } = this;
    const end = base + buffer.length;
    // Output samples whose whole window is in the buffer (or, at the end, every one up to the last source sample).
    const limit = final ? end : end - reach;
    const count = Math.max(0, Math.ceil((limit - this.position) / step));
    const out = new Float32Array(count);
    let position = this.position;
    const gain = scale;
    for (let j = 0; j < count; j++, position += step) {
      const center = Math.floor(position);
      let sum = 0;
      const lo = Math.max(base, center - reach + 1);
      const hi = Math.min(end - 1, center + reach);
      for (let i = lo; i <= hi; i++) {
        const x = Math.abs(i - position) * scale * TABLE_STEPS;
        const k = x | 0;
        if (k >= kernel.length - 1) continue;
        const f = x - k;
        sum += buffer[i - base]! * (kernel[k]! + (kernel[k + 1]! - kernel[k]!) * f);
      }
      out[j] = sum * gain;
    }
    this.position = position;
    // Keep what later outputs still reach.
    const keepFrom = Math.max(base, Math.floor(position) - reach);
    this.buffer = buffer.subarray(keepFrom - base);
    this.base = keepFrom;
    return out;
  }
}
