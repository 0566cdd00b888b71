/**
 * A FLAC decompression bomb, written bit by bit: frames of 65,535 samples of silence at 8 kHz,
 * each a CONSTANT subframe of ~14 bytes, so that a 138 KB file decodes to ~20 hours of audio.
 */

function crc8(bytes: number[]): number {
  let crc = 0;
  for (const b of bytes) {
    crc ^= b;
    for (let i = 0; i < 8; i++) crc = crc & 0x80 ? ((crc << 1) ^ 0x07) & 0xff : (crc << 1) & 0xff;
  }
  return crc;
}

function crc16(bytes: number[]): number {
  let crc = 0;
  for (const b of bytes) {
    crc ^= b << 8;
    for (let i = 0; i < 8; i++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x8005) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc;
}

/** FLAC's UTF-8-like coding of a frame number. */
function codedNumber(n: number): number[] {
  if (n < 0x80) return [n];
  if (n < 0x800) return [0xc0 | (n >> 6), 0x80 | (n & 0x3f)];
  if (n < 0x10000) return [0xe0 | (n >> 12), 0x80 | ((n >> 6) & 0x3f), 0x80 | (n & 0x3f)];
  return [0xf0 | (n >> 18), 0x80 | ((n >> 12) & 0x3f), 0x80 | ((n >> 6) & 0x3f), 0x80 | (n & 0x3f)];
}

export const BOMB_BLOCK = 65_535;
export const BOMB_RATE = 8000;

/** A mono 16-bit FLAC file of `frames` frames of BOMB_BLOCK samples of silence at BOMB_RATE. */
export function flacBomb(frames: number): Uint8Array {
  const out: number[] = [0x66, 0x4c, 0x61, 0x43]; // fLaC
  // STREAMINFO, the last metadata block: 34 bytes.
  out.push(0x80, 0, 0, 34);
  out.push(BOMB_BLOCK >> 8, BOMB_BLOCK & 0xff, BOMB_BLOCK >> 8, BOMB_BLOCK & 0xff); // min and max block size
  out.push(0, 0, 0, 0, 0, 0); // min and max frame size: unknown
  // 20 bits of sample rate, 3 of channels - 1 (0), 5 of bits per sample - 1 (15), 36 of total samples (0: unknown).
  const rate = BOMB_RATE;
  out.push((rate >> 12) & 0xff, (rate >> 4) & 0xff, ((rate & 0x0f) << 4) | (0 << 1) | (15 >> 4), ((15 & 0x0f) << 4) | 0, 0, 0, 0, 0);
  for (let i = 0; i < 16; i++) out.push(0); // MD5: unset
  for (let n = 0; n < frames; n++) {
    // Sync and fixed block size; block size from the header's end (16 bits), 8 kHz; mono, 16 bits.
    const header = [0xff, 0xf8, 0x74, 0x08, ...codedNumber(n), (BOMB_BLOCK - 1) >> 8, (BOMB_BLOCK - 1) & 0xff];
    header.push(crc8(header));
    // A CONSTANT subframe (type 0, no wasted bits) of value 0.
    const frame = [...header, 0x00, 0x00, 0x00];
    const crc = crc16(frame);
    frame.push(crc >> 8, crc & 0xff);
    for (const b of frame) out.push(b);
  }
  return Uint8Array.from(out);
}
