/** One RTP packet's fields the uplink needs (RFC 3550 §5.1). */
export interface RtpPacket {
  sequence: number;
  timestamp: number;
  payloadType: number;
  ssrc: number;
  marker: boolean;
  payload: Buffer;
}

/**
 * Parses an RTP packet; undefined for anything else (RTCP, which shares the track, a wrong
 * version, a header or padding longer than the packet). Never throws: the bytes are the device's.
 */
export function parseRtp(packet: Buffer): RtpPacket | undefined {
  if (packet.length < 12) return undefined;
  const first = packet[0]!;
  if (first >> 6 !== 2) return undefined;
  const second = packet[1]!;
  const payloadType = second & 0x7f;
  // RTCP packet types 200–204 (with the marker bit position read as part of the type).
  if (second >= 200 && second <= 204) return undefined;
  let offset = 12 + (first & 0x0f) * 4;
  if (first & 0x10) {
    if (packet.length < offset + 4) return undefined;
    offset += 4 + packet.readUInt16BE(offset + 2) * 4;
  }
  let end = packet.length;
  if (first & 0x20) {
    const padding = packet[end - 1]!;
    if (padding === 0) return undefined;
    end -= padding;
  }
  if (offset > end) return undefined;
  return {
    sequence: packet.readUInt16BE(2),
    timestamp: packet.readUInt32BE(4),
    payloadType,
    ssrc: packet.readUInt32BE(8),
    marker: (second & 0x80) !== 0,
    payload: packet.subarray(offset, end),
  };
}
