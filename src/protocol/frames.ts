/**
 * RPC framing (transport contract, section 5): a 4-byte little-endian header — uint16 payload
 * length, uint16 type — then the payload.
 */
export const FrameType = { END: 0, JSON: 1, BINARY: 2, CONTINUATION: 3 } as const;
export type FrameType = (typeof FrameType)[keyof typeof FrameType];

export const MAX_FRAME_PAYLOAD = 0xffff;
const HEADER_BYTES = 4;

export interface Frame {
  type: FrameType;
  payload: Buffer;
}

export class FrameError extends Error {}

export function encodeFrame(type: FrameType, payload: Uint8Array = new Uint8Array(0)): Buffer {
  if (payload.length > MAX_FRAME_PAYLOAD) throw new FrameError(`frame payload over ${MAX_FRAME_PAYLOAD} bytes`);
  const out = Buffer.allocUnsafe(HEADER_BYTES + payload.length);
  out.writeUInt16LE(payload.length, 0);
  out.writeUInt16LE(type, 2);
  out.set(payload, HEADER_BYTES);
  return out;
}

/** An envelope as frames: one binary frame, or continuation frames when it does not fit in one (the end-of-stream that follows ends it). */
export function envelopeFrames(envelope: Uint8Array): Buffer[] {
  if (envelope.length <= MAX_FRAME_PAYLOAD) return [encodeFrame(FrameType.BINARY, envelope)];
  const frames: Buffer[] = [];
  for (let i = 0; i < envelope.length; i += MAX_FRAME_PAYLOAD) frames.push(encodeFrame(FrameType.CONTINUATION, envelope.subarray(i, i + MAX_FRAME_PAYLOAD)));
  return frames;
}

/** Cuts a byte stream into frames; throws `FrameError` on a frame no peer may send. */
export class FrameDecoder {
  private buffered: Buffer = Buffer.alloc(0);

  push(chunk: Uint8Array): Frame[] {
    this.buffered = this.buffered.length === 0 ? Buffer.from(chunk) : Buffer.concat([this.buffered, chunk]);
    const frames: Frame[] = [];
    while (this.buffered.length >= HEADER_BYTES) {
      const length = this.buffered.readUInt16LE(0);
      const type = this.buffered.readUInt16LE(2);
      if (type > FrameType.CONTINUATION) throw new FrameError(`unknown frame type ${type}`);
      if (type === FrameType.END && length !== 0) throw new FrameError("end-of-stream frame with a payload");
      if (this.buffered.length < HEADER_BYTES + length) break;
      frames.push({ type: type as FrameType, payload: this.buffered.subarray(HEADER_BYTES, HEADER_BYTES + length) });
      this.buffered = this.buffered.subarray(HEADER_BYTES + length);
    }
    return frames;
  }

  /** Bytes of an incomplete frame still waiting. */
  get pending(): number {
    return this.buffered.length;
  }
}
