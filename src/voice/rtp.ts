/** One RTP packet's fields the uplink needs (RFC 3550 §5.1). */
export interface RtpPacket {
  sequence: number;
  timestamp: number;
  payloadType: number;
  ssrc: number;
  marker: boolean;
  payload: Buffer;
  /**
   * The sender's level of this packet's audio in −dBov (0 loudest, 127 digital silence), from the
   * audio-level header extension (RFC 6464) when it was negotiated and the packet carries it.
   */
  level?: number;
}

/** The audio-level header extension's URI, as devices offer it in `a=extmap`. */
export const AUDIO_LEVEL_URI = "urn:ietf:params:rtp-hdrext:ssrc-audio-level";

/**
 * Parses an RTP packet; undefined for anything else (RTCP, which shares the track, a wrong
 * version, a header or padding longer than the packet). `audioLevelId` is the extension id the
 * device negotiated for the audio level, if any. Never throws: the bytes are the device's.
 */
export function parseRtp(packet: Buffer, audioLevelId?: number): RtpPacket | undefined {
  if (packet.length < 12) return undefined;
  const first = packet[0]!;
  if (first >> 6 !== 2) return undefined;
  const second = packet[1]!;
  const payloadType = second & 0x7f;
  // RTCP packet types 200–204 (with the marker bit position read as part of the type).
  if (second >= 200 && second <= 204) return undefined;
  let offset = 12 + (first & 0x0f) * 4;
  let level: number | undefined;
  if (first & 0x10) {
    if (packet.length < offset + 4) return undefined;
    const start = offset + 4;
    offset = start + packet.readUInt16BE(offset + 2) * 4;
    if (audioLevelId !== undefined && offset <= packet.length) level = audioLevel(packet, packet.readUInt16BE(start - 4), start, offset, audioLevelId);
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
    ...(level !== undefined ? { level } : {}),
  };
}

/**
 * The audio level (−dBov) in a header extension block (RFC 8285: one-byte elements under profile
 * 0xBEDE, two-byte under 0x100x) of bytes [start, end); undefined when the element is absent.
 */
function audioLevel(packet: Buffer, profile: number, start: number, end: number, id: number): number | undefined {
  const twoByte = (profile & 0xfff0) === 0x1000;
  if (profile !== 0xbede && !twoByte) return undefined;
  let at = start;
  while (at < end) {
    const head = packet[at]!;
    if (head === 0) {
      at++; // padding
      continue;
    }
    let elementId: number;
    let length: number;
    if (twoByte) {
      if (at + 1 >= end) return undefined;
      elementId = head;
      length = packet[at + 1]!;
      at += 2;
    } else {
      elementId = head >> 4;
      if (elementId === 15) return undefined; // reserved: the rest is not to be read
      length = (head & 0x0f) + 1;
      at += 1;
    }
    if (at + length > end) return undefined;
    if (elementId === id && length >= 1) return packet[at]! & 0x7f;
    at += length;
  }
  return undefined;
}
