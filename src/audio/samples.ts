/** PCM sample arrays: joining pieces, and the one WAV container Perch writes. */

const total = (parts: readonly ArrayLike<number>[]) => parts.reduce((n, p) => n + p.length, 0);

function join<T extends Int16Array | Float32Array>(parts: readonly T[], out: T): T {
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** The pieces one after another; the only piece itself when there is one. */
export function concatInt16(parts: readonly Int16Array[]): Int16Array {
  return parts.length === 1 ? parts[0]! : join(parts, new Int16Array(total(parts)));
}

/** The pieces one after another; the only piece itself when there is one. */
export function concatFloat32(parts: readonly Float32Array[]): Float32Array {
  return parts.length === 1 ? parts[0]! : join(parts, new Float32Array(total(parts)));
}

/** A 16-bit mono RIFF/WAVE file of `samples` at `rate`. */
export function wavFile(samples: Int16Array, rate: number): Buffer {
  const header = Buffer.alloc(44);
  header.write("RIFF", 0, "latin1");
  header.writeUInt32LE(36 + samples.byteLength, 4);
  header.write("WAVEfmt ", 8, "latin1");
  header.writeUInt32LE(16, 16);
  header.writeUInt16LE(1, 20); // PCM
  header.writeUInt16LE(1, 22); // mono
  header.writeUInt32LE(rate, 24);
  header.writeUInt32LE(rate * 2, 28);
  header.writeUInt16LE(2, 32);
  header.writeUInt16LE(16, 34);
  header.write("data", 36, "latin1");
  header.writeUInt32LE(samples.byteLength, 40);
  return Buffer.concat([header, Buffer.from(samples.buffer, samples.byteOffset, samples.byteLength)]);
}
